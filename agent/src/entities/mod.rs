//! Entities (DESIGN 17, seed 003): a component's objects, each under an id with a version, which
//! the agent owns while the program stays stateless.
//!
//! - [`store`]: what a store of objects is: a read, and a write that is one compare-and-set on the
//!   version read;
//! - [`memory`]: the embedded store of a local run without `storage`, with PostgreSQL's semantics;
//! - [`transition`]: read, let the program decide, store what it leaves; `concurrency: retry`
//!   runs again on a lost write, `none` answers `CONFLICT`.
//!
//! Not wired to calls yet (issue 20): the manifest's `entity`, the protocol's `entry` and the
//! PostgreSQL store come next, under the same tests.

#![allow(dead_code)] // used by its tests until calls reach it (issue 20)

pub(crate) mod memory;
pub(crate) mod store;
pub(crate) mod transition;

#[cfg(test)]
mod tests;
