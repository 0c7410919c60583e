//! Calls between components, from the caller's agent to the callee's program.
//!
//! - [`router`]: a call's route, in-process (a local run) or over the broker;
//! - [`contract`]: the request contract and how a call fails (a leaf: the router and the broker
//!   use it, it uses neither);
//! - [`broker`]: calls over RabbitMQ (queues, serving, the session); it never uses the router;
//! - [`once`]: calls given an idempotency key run once;
//! - [`catalog`]: the declarations of every component this process may call;
//! - [`inflight`]: at most `limits.inflight` calls in flight per callee, the rest waiting;
//! - [`activity`]: calls made and received, and in flight, for the halt;
//! - [`receivers`]: what a received event runs (through the router), and the inbox.
//!
//! Nothing here uses the control endpoint (`tests/tests/source.rs` checks both).

pub(crate) mod activity;
pub(crate) mod broker;
pub(crate) mod catalog;
pub(crate) mod contract;
pub(crate) mod inflight;
pub(crate) mod once;
pub(crate) mod receivers;
pub(crate) mod router;
