//! What the operator reads from the objects it observes, apart from the builders that make them:
//! - [`pods`]: each pod of a composition as the pod list shows it ([`pods::Seen`]): where its
//!   agent answers, whether it still holds the composition's place, what is wrong with it;
//! - [`ownership`]: whether an object under a derived name is the Composition's own to change;
//! - [`rollout`]: the Deployment read back: its rollout, why it cannot create pods, and the
//!   policy that follows (the drain key kept, when the control Secret may be written).

pub mod ownership;
pub mod pods;
pub mod rollout;
