//! Coordination across the replicas of one component.
//!
//! - [`atom`]: `lock`, `slots`, `onassigned`, `meter` (Redis, in-process, or none), and the
//!   records of calls given an idempotency key;
//! - [`redis`]: connections to the 1..N servers, with restart tracking.

pub mod atom;
pub(crate) mod redis;
