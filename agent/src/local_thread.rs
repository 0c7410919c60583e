//! The thread that serves the local API and talks to the store: one tokio runtime of its own
//! (current-thread), beside the process's multi-threaded one.
//!
//! Why: a program's call into the agent and the store's answer to it are then read, handled and
//! answered on one thread, the sockets of both registered with that thread's driver. On the
//! process's two workers a call's steps moved between them (the store's answer read by
//! whichever worker was awake), each move a wake-up of the other core: an observation took a
//! quarter more of the agent's CPU and 20 % more time than with one worker (docs/benchmarks.md,
//! 2026-12-05). One worker for the whole process would cap calls between agents, which need
//! both cores (issue 24), so only this path gets a thread of its own.

use std::sync::OnceLock;
use tokio::runtime::{Builder, Handle};

/// The thread's runtime, started at its first use and kept for the life of the process.
pub(crate) fn handle() -> Handle {
    static HANDLE: OnceLock<Handle> = OnceLock::new();
    HANDLE.get_or_init(start).clone()
}

fn start() -> Handle {
    let runtime = Builder::new_current_thread()
        .enable_all()
        .thread_name("toa-local")
        .build()
        .expect("a current-thread runtime starts (it only asks the OS for an epoll and a timer)");
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("toa-local".to_owned())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .expect("the OS starts a thread");
    handle
}
