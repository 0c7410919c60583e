//! Entities (DESIGN 17, seed 003): a component's objects, each under an id with a version, which
//! the agent owns while the program stays stateless.
//!
//! - [`store`]: what a store of objects is: a read, and a write that is one compare-and-set on the
//!   version read;
//! - [`memory`]: the embedded store of a local run without `storage`, with PostgreSQL's semantics;
//! - [`postgres`]: the store replicas share, the context's `storage`; [`backend`]: which one;
//! - [`transition`]: read, let the program decide, store what it leaves; `concurrency: retry`
//!   runs again on a lost write, `none` answers `CONFLICT`.
//!
//! - [`objects`]: a component's objects as calls reach them: each operation's kind, the
//!   inherited operations, observations, assignments and transitions against the store.
//!
//! `once` comes next (issue 20), under the same tests.

pub(crate) mod backend;
pub(crate) mod memory;
pub(crate) mod objects;
pub(crate) mod postgres;
pub(crate) mod store;
pub(crate) mod transition;

#[cfg(test)]
mod tests;
