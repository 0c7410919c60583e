//! toa-operator: turns `Composition` resources into running replicas with the agent beside each.
//!
//! Layout (no module uses one that uses it, and [`names`] uses none; `tests/tests/source.rs` keeps
//! both):
//! - [`names`]: the operator's vocabulary: names, labels, annotations, containers and mount paths
//!   of the objects it applies;
//! - [`crd`]: the `Composition` resource, its status and condition names; the CRD is generated
//!   from it; [`crd::Stored`] is a Composition as watched, each decoded on its own;
//! - [`validate`]: the reconcile-time check of a spec (the schema's checks again, plus what a
//!   schema cannot say), into the settings the pods receive;
//! - [`manifest`]: component manifests (`manifest.toa.yaml`) and component names;
//! - [`restricted`]: the restricted Pod Security profile's rules, checked by the tests;
//! - [`render`]: context.toa.yaml + manifests → a Composition, for `kubectl apply`;
//! - [`desired`]: a validated Composition → the ConfigMaps, Secret and Deployment to apply, one
//!   builder per object (pure);
//! - [`declarations`]: the namespace's shared `toa-declarations` ConfigMap: each Composition's
//!   part applied under a manager of its own, one writer at a time, deleted ones' parts taken
//!   back;
//! - [`observed`]: what the operator reads back (pure): each pod ([`observed::pods`]: where its
//!   agent answers, whether it holds the composition's place, what is wrong with it, for
//!   `Degraded`) and the Deployment ([`observed::rollout`]: its rollout, and the policy that
//!   follows: the drain key kept, when the control Secret may be written);
//! - [`status`]: observations → the Composition's conditions (pure);
//! - [`halt`]: the halt's state machine (pure);
//! - [`agent_client`]: the agents' control endpoint (halt, resume, status) behind a trait;
//! - [`key_ring`]: the operator's key, read and kept from its Secret, and the control tokens
//!   derived from it;
//! - [`controller`]: the kube-runtime controller: reconcile and error policy, wiring only;
//! - [`kube_io`]: the requests to the API server (apply, token Secret, pods, halt record, status);
//! - [`metrics`]: reconcile counters and durations;
//! - [`lease`]: leader election on a Lease, so only one replica reconciles;
//! - [`http`]: `/health`, `/ready`, `/metrics`;
//! - [`supported`]: the Kubernetes releases the operator runs against (1.33 to 1.37);
//! - [`run`]: `toa-operator run`: controller, HTTP endpoint and lease together;
//! - [`args`]: the command line.

pub mod agent_client;
pub mod args;
pub mod controller;
pub mod crd;
pub mod declarations;
pub mod desired;
pub mod events;
#[cfg(test)]
mod fixtures;
pub mod halt;
pub mod http;
pub mod key_ring;
pub mod kube_io;
pub mod lease;
pub mod manifest;
pub mod metrics;
pub mod names;
pub mod observed;
pub mod probe;
pub mod render;
pub mod restricted;
pub mod run;
pub mod status;
pub mod supported;
pub mod validate;

pub use crd::{Composition, CompositionSpec, CompositionStatus};
pub use render::RenderError;
pub use validate::{validate, InvalidSpec, Valid};

/// Why an operation of the operator failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Composition's spec was refused at reconcile time.
    #[error(transparent)]
    InvalidSpec(#[from] InvalidSpec),
    /// Rendering a Composition from an application's files failed.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// A request to the API server failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// A Composition without the metadata its owned objects need.
    #[error(transparent)]
    NotStored(#[from] desired::NotStored),
    /// The operator's key has not been read yet (see [`key_ring`]).
    #[error(
        "the operator's key has not been read yet (its Secret, in the operator's namespace; the \
         operator's log says why: `cannot read the operator's key`)"
    )]
    NoKey,
    /// An object the operator would write holds fields another field manager wrote: it is not
    /// taken over.
    #[error("{0}")]
    Conflict(String),
    /// Every slot for spec checks is held by checks past their budget.
    #[error(transparent)]
    Busy(#[from] validate::budget::Busy),
}

impl Error {
    /// A short, stable label for metrics: which kind of failure, never its details.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "invalid_spec",
            Self::Render(_) => "render",
            Self::Kube(_) => "kube",
            Self::NotStored(_) => "not_stored",
            Self::NoKey => "no_key",
            Self::Conflict(_) => "conflict",
            Self::Busy(_) => "busy",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
