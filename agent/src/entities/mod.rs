//! Entities (DESIGN 17, seed 003): a component's objects, each under an id with a version, which
//! the agent owns while the program stays stateless.
//!
//! - [`store`]: what a store of objects is: a read, and a write that is one compare-and-set on the
//!   version read;
//! - [`memory`]: the embedded store of a local run without `storage`, with PostgreSQL's semantics;
//!   [`grouped`]: the same kept by a local group's leader, for all its processes;
//! - [`postgres`]: the store replicas share, the context's `storage`; [`backend`]: which one;
//! - [`transition`]: read, let the program decide, store what it leaves; `concurrency: retry`
//!   runs again on a lost write, `none` answers `CONFLICT`.
//!
//! - [`objects`]: a component's objects as calls reach them: each operation's kind, the
//!   inherited operations, observations, assignments and transitions against the store.
//!
//! - [`conditions`]: which events a stored write publishes (the program's conditions);
//!   [`outbox`]: the events stored writes publish, published by their committer and relayed by
//!   every replica.
//!
//! - [`retrying`]: the calls running as transitions under `retry`, whose calls to an operation
//!   declaring `once` are refused.
//!
//! `once` and a caller's key on an operation that writes are records the store keeps with the
//! write ([`store::Record`]), in the same transaction.

pub(crate) mod backend;
pub(crate) mod conditions;
pub(crate) mod grouped;
pub(crate) mod memory;
pub(crate) mod objects;
pub(crate) mod outbox;
pub(crate) mod postgres;
pub(crate) mod retrying;
pub(crate) mod store;
pub(crate) mod transition;

#[cfg(test)]
mod tests;
