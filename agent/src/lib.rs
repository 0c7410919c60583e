//! toa-agent: the process beside every component. This crate is also the Rust API of the
//! coordination primitives, so a Rust component (and the tests and examples) can use them
//! in-process.
//!
//! Layout, by concern (`tests/tests/source.rs` checks that no module reaches back to one that
//! uses it):
//! - `calls/`: calls between components: `router` (the route, in-process or over the broker),
//!   `contract` (the request contract and how a call fails; a leaf), `broker` (calls over
//!   RabbitMQ: queues, serving, the session; never the router), `once` (calls given an
//!   idempotency key run once), `catalog` (the declarations of every component this process may
//!   call), `activity` (calls made and received, and in flight, for the halt);
//! - `coordination/`: [`atom`] (`lock`, `slots`, `onassigned`, `meter`: Redis, in-process, or
//!   none) and `redis` (connections to the 1..N servers, with restart tracking);
//! - `process/`: [`compose`] (a process's components, in stages: prepare, start, serve, drain,
//!   watched against its servers), `lifecycle` (run commands across them), `supervisor` (the
//!   process's phase: halts, resumes, the drain, pulses), `drain` (who may start the drain and
//!   how they wait for it);
//! - `control/`: `endpoint` (the operator's authenticated control endpoint: halt, resume,
//!   status), `tokens` (the control tokens accepted, current and previous, read again on
//!   rotation), [`component_tokens`] (each component's own token for the local API);
//! - `entities/`: a component's objects, versioned (DESIGN 17): `store` (the contract), `memory`
//!   (the embedded store), `transition` (compare-and-set, `retry`/`none`), `objects` (each
//!   operation's kind, the inherited operations, the runs of calls against the store);
//! - [`api`]: the local HTTP API for components in any language;
//! - `component/`: a component's manifest, program and input checks;
//! - [`config`]: every flag and variable of `compose`, read and checked before anything starts;
//! - `local_thread`: the thread (a runtime of its own) that serves the local API and keeps the
//!   store's connections, so that a program's call and the store's answer meet on one core;
//! - [`instance`]: the process's name; [`requeue`]: dead-lettered events sent back;
//! - [`metrics`]: Prometheus metrics (logging: `toa_context::logs`).
//!
//! The groups are crate-private. The Rust API, at the paths it always had: the primitives
//! ([`Atom`], [`atom::meter`], ...), the local API's [`api::router`], [`compose::run`] with
//! [`config::options`], [`component_tokens::ComponentTokens`], [`Metrics`].

// Functions stay short (clippy.toml: at most 60 lines): each says one step.
#![warn(clippy::too_many_lines)]

pub mod api;
pub(crate) mod calls;
pub(crate) mod component;
pub mod config;
pub(crate) mod control;
pub(crate) mod coordination;
pub(crate) mod entities;
pub(crate) mod errors;
pub mod instance;
pub(crate) mod local_thread;
pub mod metrics;
pub(crate) mod process;
pub mod requeue;
pub mod traces;

pub use control::component_tokens;
pub use coordination::atom;
pub use process::compose;

/// `toa-agent storage ddl`: the statements that make the tables of the entities of the
/// components in `dirs` for `application`.
pub use entities::postgres::ddl_of as storage_ddl;

pub use atom::{Assignment, Atom, AtomConfig, AtomError, Held, IntoKeys, Mode, Scope, Signal};
/// The calls a program answers now, which the local API's locks take their deadlines from.
pub use component::answering::Answering;
pub use metrics::Metrics;
