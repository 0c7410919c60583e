//! Names the operator derives from a Composition's (`<name>`, `<name>-components`,
//! `<name>-control`) are that Composition's only: objects already there under them, which the
//! Composition does not control, are never changed, say `Conflict` with a Warning event, and
//! survive the Composition's deletion.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use std::fmt::Debug;
use std::sync::Arc;

use crate::cluster;
use crate::support::{apply, composition, compositions, wait_condition, Suite, PATIENCE};
use crate::wait::eventually;

/// A namespace's deny-all NetworkPolicy, a ConfigMap and a Secret, under the names a new
/// Composition `default-deny` derives. Each is met in the reconcile's order (the ConfigMap, the
/// Secret, the NetworkPolicy), refused with `Conflict` naming it, and left as it was; once the
/// user removed the first two, the operator writes its own in their place, and the policy stays
/// unchanged through the Composition's deletion.
pub async fn foreign_objects_are_not_taken_over(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-owners", "default-deny");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let policy = create::<NetworkPolicy>(
        &suite,
        namespace,
        json!({
            "metadata": { "name": name },
            "spec": { "podSelector": {}, "policyTypes": ["Ingress", "Egress"] },
        }),
    )
    .await;
    let components = format!("{name}-components");
    let config_map = create::<ConfigMap>(
        &suite,
        namespace,
        json!({
            "metadata": { "name": components }, "data": { "mine": "keep" },
        }),
    )
    .await;
    let control = format!("{name}-control");
    let secret = create::<Secret>(
        &suite,
        namespace,
        json!({
            "metadata": { "name": control }, "stringData": { "other": "keep" },
        }),
    )
    .await;
    apply(
        &suite,
        &composition(namespace, name, json!({ "replicas": 0 })),
    )
    .await;

    conflict(
        &suite,
        namespace,
        name,
        &format!("the ConfigMap {components} exists"),
    )
    .await;
    unchanged(&suite, namespace, &config_map).await;
    unchanged(&suite, namespace, &secret).await;
    unchanged(&suite, namespace, &policy).await;
    warned(&suite, namespace, name, &components).await;
    delete::<ConfigMap>(&suite, namespace, &components).await;

    conflict(
        &suite,
        namespace,
        name,
        &format!("the Secret {control} exists"),
    )
    .await;
    unchanged(&suite, namespace, &secret).await;
    delete::<Secret>(&suite, namespace, &control).await;

    conflict(
        &suite,
        namespace,
        name,
        &format!("the NetworkPolicy {name} exists"),
    )
    .await;
    unchanged(&suite, namespace, &policy).await;

    // Deleted: the garbage collector takes what the Composition owns (its own ConfigMap and
    // Secret, written once the user's were gone) and leaves the policy.
    compositions(&suite, namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Composition's own objects are collected",
        PATIENCE,
        || {
            let suite = suite.clone();
            let (components, control) = (components.clone(), control.clone());
            async move {
                let map = get::<ConfigMap>(&suite, namespace, &components)
                    .await
                    .is_some();
                let secret = get::<Secret>(&suite, namespace, &control).await.is_some();
                if map || secret {
                    Err(format!("left: its ConfigMap {map}, its Secret {secret}"))
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    unchanged(&suite, namespace, &policy).await;
}

/// One component is one Composition's in a namespace: `rogue`, declaring the `e2e.recorder`
/// that `first` declared, is refused with `Conflict` naming the component and `first`, and the
/// namespace's declarations keep `first`'s manifest (a second declaration would have let
/// `rogue`'s pods consume `first`'s queues). Once `first` is deleted, `rogue` may have it.
pub async fn a_declared_component_is_not_taken_over(suite: Arc<Suite>) {
    let namespace = "e2e-declared";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let idle = json!({ "replicas": 0 });
    apply(&suite, &composition(namespace, "first", idle.clone())).await;
    wait_condition(&suite, namespace, "first", "Ready", "True", None, PATIENCE).await;
    let key = "e2e.recorder.yaml";
    let firsts = declared(&suite, namespace, key).await;

    let mut rogue = composition(namespace, "rogue", idle);
    rogue["spec"]["components"][0]["manifest"]["operations"]["steal"] =
        json!({ "input": { "type": "object" } });
    apply(&suite, &rogue).await;
    let says = "the component e2e.recorder is declared in the namespace's ConfigMap \
        toa-declarations by the Composition first";
    conflict(&suite, namespace, "rogue", says).await;
    warned(&suite, namespace, "rogue", "e2e.recorder").await;
    assert_eq!(declared(&suite, namespace, key).await, firsts);
    assert!(crate::support::deployment(&suite, namespace, "rogue")
        .await
        .is_none());

    // `first` deleted: once the garbage collector let go of its part, `rogue` declares it.
    compositions(&suite, namespace)
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    eventually("first's declarations are let go", PATIENCE, || {
        let suite = suite.clone();
        async move {
            let shared = get::<ConfigMap>(&suite, namespace, "toa-declarations").await;
            let owners = shared.map(|map| map.owner_references().to_vec());
            let named = owners.iter().flatten().any(|owner| owner.name == "first");
            (!named).then_some(()).ok_or_else(|| format!("{owners:?}"))
        }
    })
    .await;
    // A change to `rogue` wakes its reconcile sooner than the backoff after its conflicts.
    rogue["metadata"]["annotations"] = json!({ "e2e/again": "1" });
    apply(&suite, &rogue).await;
    wait_condition(&suite, namespace, "rogue", "Ready", "True", None, PATIENCE).await;
    let rogues = declared(&suite, namespace, key).await;
    assert!(rogues.contains("steal"), "{rogues}");
}

/// The namespace's declarations' `key`.
async fn declared(suite: &Suite, namespace: &str, key: &str) -> String {
    let shared = get::<ConfigMap>(suite, namespace, "toa-declarations").await;
    let data = shared.and_then(|map| map.data).unwrap_or_default();
    data.get(key)
        .cloned()
        .unwrap_or_else(|| panic!("no {key}: {data:?}"))
}

async fn create<K>(suite: &Suite, namespace: &str, object: serde_json::Value) -> K
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    Api::<K>::namespaced(suite.admin.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot create the {} {}: {e}",
                K::kind(&()),
                object.name_any()
            )
        })
}

async fn get<K>(suite: &Suite, namespace: &str, name: &str) -> Option<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    Api::<K>::namespaced(suite.admin.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

async fn delete<K>(suite: &Suite, namespace: &str, name: &str)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    Api::<K>::namespaced(suite.admin.clone(), namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// The Composition says `Ready=False`, `Conflict`, with a message that starts with `says`.
async fn conflict(suite: &Suite, namespace: &str, name: &str, says: &str) {
    let api = compositions(suite, namespace);
    eventually(&format!("{name} is in conflict: {says}"), PATIENCE, || {
        let api = api.clone();
        async move {
            let composition = api.get(name).await.map_err(|e| e.to_string())?;
            let ready = crate::support::condition(&composition, "Ready");
            match ready {
                Some(c) if c.reason == "Conflict" && c.message.starts_with(says) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    wait_condition(
        suite,
        namespace,
        name,
        "Ready",
        "False",
        Some("Conflict"),
        PATIENCE,
    )
    .await;
}

/// The object is as it was made: same resourceVersion, no owner.
async fn unchanged<K>(suite: &Suite, namespace: &str, made: &K)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let now = get::<K>(suite, namespace, &made.name_any())
        .await
        .unwrap_or_else(|| panic!("the {} {} is gone", K::kind(&()), made.name_any()));
    assert_eq!(
        (now.resource_version(), now.owner_references().is_empty()),
        (made.resource_version(), true),
        "the {} {} was changed: {now:?}",
        K::kind(&()),
        made.name_any()
    );
}

/// A Warning event on the Composition names the object.
async fn warned(suite: &Suite, namespace: &str, name: &str, object: &str) {
    let events = Api::<Event>::namespaced(suite.admin.clone(), namespace);
    eventually("a Warning event names the object", PATIENCE, || {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let found = list.items.iter().any(|event| {
                event.type_.as_deref() == Some("Warning")
                    && event.reason.as_deref() == Some("Conflict")
                    && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && event
                        .note
                        .as_deref()
                        .is_some_and(|note| note.contains(object))
            });
            found
                .then_some(())
                .ok_or_else(|| format!("{} events, none", list.items.len()))
        }
    })
    .await;
}
