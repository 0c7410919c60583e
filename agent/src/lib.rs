//! toa-agent: the process beside every component. This crate is also the Rust API of the
//! coordination primitives, so a Rust component (and the tests and examples) can use them
//! in-process.
//!
//! Layout:
//! - [`api`]: the local HTTP API for components in any language;
//! - [`atom`]: `lock`, `slots`, `onassigned`, `meter` (Redis, in-process, or none);
//! - [`contract`]: the request contract and how a call fails (a leaf);
//! - [`calls`]: calls between components: the route, in-process or over the broker;
//! - [`broker`]: calls over RabbitMQ (queues, serving, the session);
//! - [`once`]: calls given an idempotency key run once;
//! - [`catalog`]: the declarations of every component this process may call;
//! - [`component`]: a component's manifest, program and input checks;
//! - [`config`]: every flag and variable of `compose`, read and checked before anything starts;
//! - [`compose`]: a process's components, in stages (prepare, start, serve, drain) watched
//!   against its servers; [`lifecycle`]: run commands across them; [`instance`]: its name;
//! - [`activity`]: calls made and received, and in flight, for the halt;
//! - [`supervisor`]: the process's phase: halts, resumes, the drain, pulses;
//! - [`control`]: the operator's authenticated control endpoint (halt, resume, status);
//! - [`tokens`]: the control tokens accepted (current and previous), read again on rotation;
//! - [`drain`]: who may start the drain (a drain key in a pod) and how they wait for it;
//! - [`redis`]: connections to the 1..N servers, with restart tracking;
//! - [`metrics`]: Prometheus metrics;
//! - [`telemetry`]: logging setup.

// Functions stay short (clippy.toml: at most 60 lines): each says one step.
#![warn(clippy::too_many_lines)]

pub mod activity;
pub mod api;
pub mod atom;
pub mod broker;
pub mod calls;
pub mod catalog;
pub mod component;
pub mod component_tokens;
pub mod compose;
pub mod config;
pub mod contract;
pub mod control;
pub mod drain;
pub mod instance;
pub mod lifecycle;
pub mod metrics;
pub mod once;
pub mod redis;
pub mod supervisor;
pub mod telemetry;
pub mod tokens;

pub use atom::{Assignment, Atom, AtomConfig, AtomError, Held, IntoKeys, Mode, Scope, Signal};
pub use metrics::Metrics;
