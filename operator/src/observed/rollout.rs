//! Pure: the Deployment as the operator reads it back: how far its rollout is ([`Rollout`]), why
//! it cannot create pods ([`replica_failure`]), and the rollout policy that follows from it:
//! the pods' drain key it keeps ([`drain_key_of`], or a [`new_drain_key`], the one random input
//! of a Deployment), and when the control Secret may be written ([`tokens_due`]).

use crate::names::DRAIN_KEY;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;

/// How far the Deployment is, from its own `metadata.generation` and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rollout {
    /// The Deployment's `metadata.generation`.
    pub generation: Option<i64>,
    pub observed_generation: Option<i64>,
    /// Pods of any revision.
    pub replicas: i32,
    pub updated_replicas: i32,
    pub available_replicas: i32,
    pub ready_replicas: i32,
}

impl Rollout {
    pub fn of(deployment: &Deployment) -> Self {
        let status = deployment.status.clone().unwrap_or_default();
        Self {
            generation: deployment.metadata.generation,
            observed_generation: status.observed_generation,
            replicas: status.replicas.unwrap_or(0),
            updated_replicas: status.updated_replicas.unwrap_or(0),
            available_replicas: status.available_replicas.unwrap_or(0),
            ready_replicas: status.ready_replicas.unwrap_or(0),
        }
    }

    /// The Deployment controller has seen the latest template and every one of `desired` pods
    /// runs it and is available, with no pod of an older revision left.
    pub fn done(&self, desired: i32) -> bool {
        self.generation.is_some()
            && self.observed_generation >= self.generation
            && self.updated_replicas == desired
            && self.available_replicas == desired
            && self.replicas == desired
    }
}

/// Why the Deployment's ReplicaSet cannot create pods: the message of its `ReplicaFailure`
/// condition (the Deployment controller copies the ReplicaSet's), e.g. a pod refused by Pod
/// Security admission. A refused pod never exists, so the pods cannot tell it.
pub fn replica_failure(deployment: &Deployment) -> Option<String> {
    let conditions = deployment.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or("ReplicaFailure"),
                c.message.as_deref().unwrap_or("no message")
            )
        })
}

/// A new drain key: 32 random bytes, as 64 hex digits (the one input here that is random, made
/// by the caller once per Deployment).
pub fn new_drain_key() -> String {
    let mut bytes = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether the control Secret may be written, given the Deployment as it is: always for a new
/// one; for one made by an operator before derived tokens (no [`DRAIN_KEY`]), not until it has
/// been rolled over to pods whose drain does not derive from the token, and none of the old
/// pods is left. The old pods' agents derive their hooks' drain key from the token they read:
/// a new token in their Secret would make their `preStop` drain refused, and `dispose` would not
/// run. In the same way a rotation waits until no pod of an older template is left.
pub fn tokens_due(existing: Option<&Deployment>) -> bool {
    let Some(deployment) = existing else {
        return true;
    };
    let rollout = Rollout::of(deployment);
    drain_key_of(deployment).is_some()
        && rollout.generation.is_some()
        && rollout.observed_generation >= rollout.generation
        && rollout.replicas == rollout.updated_replicas
}

/// The pods' drain key the Deployment holds in [`DRAIN_KEY`], when it is one this operator
/// makes (64 hex digits): kept, so the pod template, and the pods, do not change with it.
pub fn drain_key_of(deployment: &Deployment) -> Option<String> {
    let key = deployment.annotations().get(DRAIN_KEY)?;
    (key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())).then(|| key.clone())
}
