//! The operator's requests to the API server, each one small so the controller reads as a list
//! of steps: server-side apply with the field manager [`MANAGER`] (unforced for the control
//! Secret), the composition's pods, the halt annotation and the status
//! subresource.

use crate::crd::{Composition, CompositionStatus};
use crate::halt::{Record, ANNOTATION};
use crate::names::{pod_selector, MANAGER};
use crate::observed::pods::Seen;
use crate::Error;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
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

/// Applies `object` as `manager`: for an object several Compositions share, each applying only
/// its own fields.
pub async fn apply_as<K>(api: &Api<K>, object: &K, manager: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let params = PatchParams::apply(manager).force();
    api.patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
}

/// Applies `object` server-side without forcing: a field another manager wrote (a Secret of
/// that name someone else made) is a [`Error::Conflict`] naming the object, not taken over.
pub async fn apply_unforced<K>(api: &Api<K>, object: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let params = PatchParams::apply(MANAGER);
    match api
        .patch(&object.name_any(), &params, &Patch::Apply(object))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::Conflict(format!(
            "the {} {} has fields another manager wrote ({}); the operator does not take it \
             over: delete it, and the operator writes its own",
            K::kind(&()),
            object.name_any(),
            status.message,
        ))),
        other => Ok(other?),
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
    api: &Api<Composition>,
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
    api: &Api<Composition>,
    name: &str,
    status: &CompositionStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
