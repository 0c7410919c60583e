//! Deleting a Composition: the garbage collector removes what it owns, and the namespace's shared
//! declarations lose its part.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use std::sync::Arc;
use toa_operator::names::DECLARATIONS;

use crate::cluster;
use crate::support::{
    apply, assert_disposed_before_stopped, components_of, composition, compositions, deployment,
    ready_pods, wait_condition, wait_no_pods, Suite, PATIENCE,
};
use crate::wait::eventually;

/// Deleting the Composition deletes what it owns (the garbage collector, by owner references).
pub async fn deletion_cleans_up(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-delete", "gone");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    // A second Composition in the namespace, of another component, shares toa-declarations and
    // stays.
    let stays = "stays";
    let spec = json!({ "replicas": 0, "components": components_of("keeper") });
    apply(&suite, &composition(namespace, stays, spec)).await;
    wait_condition(&suite, namespace, stays, "Ready", "True", None, PATIENCE).await;
    apply(&suite, &composition(namespace, name, json!({}))).await;
    let pods = ready_pods(&suite, namespace, name, 1).await;
    let declarations = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace);
    let managers = || async {
        let shared = declarations
            .get(DECLARATIONS)
            .await
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = shared
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|entry| entry.manager.clone())
            .collect();
        Ok::<_, String>((names, shared.data.unwrap_or_default()))
    };
    let (before, keys) = managers().await.unwrap();
    assert!(
        before.contains(&format!("toa-operator.{name}"))
            && before.contains(&format!("toa-operator.{stays}"))
            && keys.contains_key("e2e.recorder.yaml")
            && keys.contains_key("e2e.keeper.yaml"),
        "each Composition applies its part of {DECLARATIONS}: {before:?}, {:?}",
        keys.keys()
    );
    compositions(&suite, namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("everything the composition owned is gone", PATIENCE, || {
        let suite = suite.clone();
        async move {
            let deployment = deployment(&suite, namespace, name).await.is_some();
            let config_map = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace)
                .get_opt(&format!("{name}-components"))
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            let secret = Api::<Secret>::namespaced(suite.admin.clone(), namespace)
                .get_opt(&format!("{name}-control"))
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            if deployment || config_map || secret {
                Err(format!(
                    "left: Deployment {deployment}, ConfigMap {config_map}, Secret {secret}"
                ))
            } else {
                Ok(())
            }
        }
    })
    .await;
    wait_no_pods(&suite, namespace, name).await;
    assert_disposed_before_stopped(&suite, &pods[0]);
    // The survivor's next reconcile takes back the deleted one's part of the shared map (poked
    // with an annotation, which reconciles: the garbage collector may not have removed the
    // deleted owner's reference by the first poke).
    let mut poke = 0;
    eventually("the deleted Composition's declarations are taken back", PATIENCE, || {
        poke += 1;
        let suite = suite.clone();
        async move {
            let patch = json!({ "metadata": { "annotations": { "e2e.toa.io/poke": poke.to_string() } } });
            compositions(&suite, namespace)
                .patch(stays, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| e.to_string())?;
            let (now, data) = managers().await?;
            let keys: Vec<&String> = data.keys().collect();
            if now.contains(&format!("toa-operator.{name}")) || keys != ["e2e.keeper.yaml"] {
                Err(format!("managers {now:?}, keys {keys:?}"))
            } else {
                Ok(())
            }
        }
    })
    .await;
}
