//! The operator's requests to the API server, each one small so the controller reads as a list
//! of steps: server-side apply with the field manager [`MANAGER`] (a Composition's own objects
//! only after a read shows they are its own, [`apply_own`]; the control Secret, which the
//! operator does not read, by a JSON Patch that tests its owner, [`write_own_secret`]), the
//! composition's pods, the halt annotation and the status subresource.

use crate::crd::{CompositionStatus, Stored};
use crate::halt::{Record, ANNOTATION};
use crate::names::{pod_selector, MANAGER};
use crate::observed::ownership;
use crate::observed::pods::Seen;
use crate::Error;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Applies `object` (server-side, forcing ownership of the fields it sets: the operator is the
/// only writer of what it manages).
pub async fn apply<K>(api: &Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    apply_as(api, object, MANAGER).await
}

/// Whether the API server would take `object` as [`apply`] sends it: a dry run, nothing written
/// (admission and validation run as for the real one).
pub async fn apply_dry_run<K>(api: &Api<K>, object: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    patched(api, object, PatchParams::apply(MANAGER).force().dry_run()).await
}

/// Applies `object` as `manager`: for an object several Compositions share, each applying only
/// its own fields.
pub async fn apply_as<K>(api: &Api<K>, object: &K, manager: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    patched(api, object, PatchParams::apply(manager).force()).await
}

async fn patched<K>(api: &Api<K>, object: &K, params: PatchParams) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    api.patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
}

/// Applies `object`, one of the Composition `uid`'s own objects under a name derived from it,
/// unless an object of that name exists that the Composition does not control
/// ([`ownership::foreign`]): that one is never changed, and the answer is a [`Error::Conflict`]
/// naming it. In an object the Composition controls, fields another manager wrote are taken
/// over: the operator is the only writer of what it manages.
pub async fn apply_own<K>(api: &Api<K>, object: &K, uid: &str) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    if let Some(existing) = api.get_opt(&object.name_any()).await? {
        if let Some(why) = ownership::foreign(&K::kind(&()), existing.meta(), uid) {
            return Err(Error::Conflict(why));
        }
    }
    Ok(apply(api, object).await?)
}

/// Writes the Secret `secret`, one of the Composition `uid`'s own, without reading it (the
/// operator reads no Secret): a JSON Patch whose first operation tests that the Secret's owner is
/// the Composition, then replaces its data, so a Secret of that name someone else made is never
/// changed ([`Error::Conflict`]); one that does not exist is created (and one made meanwhile is
/// a conflict too, until the next reconcile).
pub async fn write_own_secret(api: &Api<Secret>, secret: &Secret, uid: &str) -> Result<(), Error> {
    let name = secret.name_any();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": "/metadata/ownerReferences/0/uid", "value": uid },
        { "op": "replace", "path": "/data", "value": secret.data },
    ]))
    .expect("a JSON Patch");
    let params = PatchParams {
        field_manager: Some(MANAGER.to_owned()),
        ..PatchParams::default()
    };
    // The operator does not read Secrets, so it cannot say whose this one is.
    let refused = || {
        Error::Conflict(format!(
            "the Secret {name} exists and is not this Composition's (its owner is not the \
             Composition); the operator does not change it: delete it, or give the Composition \
             another name"
        ))
    };
    match api.patch(&name, &params, &Patch::Json::<()>(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let create = PostParams {
                field_manager: Some(MANAGER.to_owned()),
                ..PostParams::default()
            };
            match api.create(&create, secret).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => Err(refused()),
                Err(error) => Err(error.into()),
            }
        }
        // A test that fails, or a path that is not there (no owner at all): the API server
        // refuses the patch as invalid, 422 (seen on v1.37.2 for both).
        Err(kube::Error::Api(status)) if status.code == 422 => Err(refused()),
        Err(error) => Err(error.into()),
    }
}

/// The composition's pods, as [`crate::observed::pods::seen`] reads them.
pub async fn pods(api: &Api<Pod>, composition: &str) -> Result<Vec<Seen>, kube::Error> {
    let list = api
        .list(&ListParams::default().labels(&pod_selector(composition)))
        .await?;
    Ok(list.items.iter().map(crate::observed::pods::seen).collect())
}

/// Writes the halt record into the annotation, or removes it.
pub async fn record_halt(
    api: &Api<Stored>,
    name: &str,
    record: Option<&Record>,
) -> Result<(), kube::Error> {
    let value = record.map(ToString::to_string);
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Replaces `status` (a merge patch of the status subresource; the conditions are written whole).
pub async fn patch_status(
    api: &Api<Stored>,
    name: &str,
    status: &CompositionStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
