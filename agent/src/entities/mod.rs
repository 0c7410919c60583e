//! Entities (DESIGN 17, seed 003): a component's objects, each under an id with a version, which
//! the agent owns while the program stays stateless.
//!
//! - [`store`]: what a store of objects is: a read, and a write that is one compare-and-set on the
//!   version read;
//! - [`memory`]: the embedded store of a local run without `storage`, with PostgreSQL's semantics;
//! - [`transition`]: read, let the program decide, store what it leaves; `concurrency: retry`
//!   runs again on a lost write, `none` answers `CONFLICT`.
//!
//! - [`objects`]: a component's objects as calls reach them: each operation's kind, the
//!   inherited operations, observations, assignments and transitions against the store.
//!
//! The PostgreSQL store and `once` come next (issue 20), under the same tests.

pub(crate) mod memory;
pub(crate) mod objects;
pub(crate) mod store;
pub(crate) mod transition;

#[cfg(test)]
mod tests;
