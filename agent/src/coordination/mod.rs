//! Coordination across the replicas of one component.
//!
//! - [`atom`]: `lock`, `slots`, `onassigned`, `meter` (Redis, in-process, or none), and the
//!   records of calls given an idempotency key;
//! - [`expiring`], [`debts`]: what Redis keeps (values with a time to live, meters' debts), kept in
//!   a process: by one alone, or by a local group's first process for all;
//! - [`group`]: the processes of one application on one machine, coordinating through the first;
//! - [`redis`]: connections to the 1..N servers, with restart tracking.

pub mod atom;
pub(crate) mod debts;
pub(crate) mod expiring;
pub mod group;
pub(crate) mod membership;
pub(crate) mod redis;
