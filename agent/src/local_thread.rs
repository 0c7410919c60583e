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

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::{Builder, Handle};
use tokio_util::task::AbortOnDropHandle;

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

/// Runs `task` on `thread` and waits for it; dropping the wait aborts the task (a dropped
/// `JoinHandle` would leave it running there), and a panic there goes on here.
pub(crate) async fn run_on<T: Send + 'static>(
    thread: Handle,
    task: impl Future<Output = T> + Send + 'static,
) -> T {
    match AbortOnDropHandle::new(thread.spawn(task)).await {
        Ok(value) => value,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // Only this guard aborts the task, and the runtime outlives every waiter.
        Err(error) => unreachable!("a task waited for was cancelled: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_no_longer_waited_for_is_stopped_on_its_thread() {
        let (held, dropped) = tokio::sync::oneshot::channel::<()>();
        let never = run_on(handle(), async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        let waited = tokio::time::timeout(Duration::from_millis(50), never).await;
        assert!(waited.is_err(), "the task never ends");
        // Stopped there, it drops what it held (a task left running would hold it for ever).
        let stopped = tokio::time::timeout(Duration::from_secs(5), dropped).await;
        assert!(
            matches!(stopped, Ok(Err(_))),
            "still running after 5 s: {stopped:?}"
        );
    }

    #[tokio::test]
    async fn a_panic_on_the_thread_goes_on_in_its_waiter() {
        let waiter = tokio::spawn(run_on(handle(), async { panic!("there") }));
        let error = waiter.await.expect_err("the waiter panicked");
        let message = error.into_panic();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"there"));
    }
}
