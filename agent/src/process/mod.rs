//! The process's life: its components started, run through their lifecycle, halted, drained.
//!
//! - [`compose`]: a process's components, in stages (prepare, start, serve, drain) watched
//!   against its servers;
//! - [`lifecycle`]: run commands across the components;
//! - [`supervisor`]: the process's phase: halts, resumes, the drain, pulses;
//! - [`drain`]: who may start the drain (the node, with a drain key, in a pod) and how they wait
//!   for it;
//! - [`node`]: the node's addresses as the pod sees them.

pub mod compose;
pub(crate) mod drain;
pub(crate) mod lifecycle;
pub(crate) mod node;
pub(crate) mod supervisor;
