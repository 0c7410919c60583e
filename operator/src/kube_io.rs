//! The operator's requests to the API server, each one small so the controller reads as a list
//! of steps: server-side apply with the field manager [`MANAGER`], the control token Secret
//! (created once, never rewritten), the composition's pods, the halt annotation and the status
//! subresource.

use crate::agent_client::Keys;
use crate::crd::{Composition, CompositionStatus};
use crate::desired::{pod_selector, Sidecar, MANAGER, PREVIOUS_KEY, TOKEN_KEY};
use crate::halt::{Record, ANNOTATION};
use crate::pods::Seen;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use rand::distr::{Alphanumeric, SampleString};
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

/// The composition's control tokens: read from the Secret `name` (`token`, and `previous` during
/// a rotation), or, when the Secret or its token is missing, a new random one applied with
/// `build(token)`. An existing token is never replaced by the operator: rotating is writing a new
/// `token` and the old one as `previous` (docs/composition.md).
pub async fn control_token(
    api: &Api<Secret>,
    name: &str,
    build: impl FnOnce(&str) -> Secret,
) -> Result<Keys, kube::Error> {
    let data = api.get_opt(name).await?.and_then(|secret| secret.data);
    let text = |key: &str| {
        let bytes = data.as_ref()?.get(key)?.0.clone();
        String::from_utf8(bytes)
            .ok()
            .map(|token| token.trim().to_owned())
            .filter(|token| !token.is_empty())
    };
    if let Some(current) = text(TOKEN_KEY) {
        return Ok(Keys {
            current,
            previous: text(PREVIOUS_KEY),
        });
    }
    // 43 alphanumerics: about 256 bits.
    let token = Alphanumeric.sample_string(&mut rand::rng(), 43);
    apply(api, &build(&token)).await?;
    Ok(Keys::one(&token))
}

/// The composition's pods, as [`crate::pods::seen`] reads them.
pub async fn pods(api: &Api<Pod>, composition: &str) -> Result<Vec<Seen>, kube::Error> {
    let list = api
        .list(&ListParams::default().labels(&pod_selector(composition)))
        .await?;
    Ok(list.items.iter().map(crate::pods::seen).collect())
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

/// The sidecar style the API server accepts, from its version (read once at start).
pub async fn sidecar(client: &Client) -> Result<Sidecar, kube::Error> {
    let version = client.apiserver_version().await?;
    Ok(Sidecar::for_server(&version.major, &version.minor))
}
