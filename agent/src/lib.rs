//! toa-agent: the process beside every component. This crate is also the Rust API of the
//! coordination primitives, so a Rust component (and the tests and examples) can use them
//! in-process.
//!
//! Layout:
//! - [`atom`]: `lock`, `slots`, `onassigned`, `meter` (Redis, in-process, or none);
//! - [`redis`]: connections to the 1..N servers, with restart tracking;
//! - [`metrics`]: Prometheus metrics;
//! - [`telemetry`]: logging setup.

pub mod atom;
pub mod metrics;
pub mod redis;
pub mod telemetry;

pub use atom::{Assignment, Atom, AtomConfig, AtomError, Held, IntoKeys, Mode, Scope, Signal};
pub use metrics::Metrics;
