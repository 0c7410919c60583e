//! A worker process for the multi-process tests: uses the primitives through the agent's Rust API
//! and prints what it did as JSON lines, stamped with CLOCK_MONOTONIC. Commands come on stdin;
//! closing stdin stops it gracefully.
//!
//!   atom-worker lock COMPONENT KEY TASKS ITERATIONS COUNTER_FILE
//!   atom-worker hold COMPONENT KEY            (stdin: `release`)
//!   atom-worker slots COMPONENT TOTAL         (stdin: `panic`, `slots`, `slots N`)
//!   atom-worker meter COMPONENT KEY DELTA COUNT
//!
//! Settings come from the `TOA_*` variables (see toa_context::annotations).

use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toa_agent::{Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Context, Credentials, ProcessVars};
use toa_tests::monotonic_ns;
use tokio::io::{AsyncBufReadExt, BufReader};

fn emit(value: serde_json::Value) {
    println!("{value}");
}

fn start(component: &str) -> Arc<Atom> {
    let context = Context::from_vars(&ProcessVars).expect("valid TOA_* settings");
    let config = AtomConfig {
        scope: Scope::new(context.name.clone(), component),
        mode: Mode::Local,
        atomicity: context.atomicity,
        credentials: Credentials::default(),
        roots: Default::default(),
        instance: format!("worker-{}", std::process::id()),
        group: None,
    };
    Arc::new(Atom::start(config, Metrics::new()).expect("atom starts"))
}

/// Lines from stdin; `None` at EOF.
fn commands() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[tokio::main]
async fn main() {
    toa_context::logs::LogArgs::default().init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .cloned()
            .unwrap_or_else(|| panic!("argument {i} missing"))
    };
    match arg(0).as_str() {
        "lock" => {
            lock(
                start(&arg(1)),
                arg(2),
                arg(3).parse().unwrap(),
                arg(4).parse().unwrap(),
                arg(5),
            )
            .await
        }
        "hold" => hold(start(&arg(1)), arg(2)).await,
        "slots" => {
            let began = monotonic_ns();
            slots(start(&arg(1)), arg(2).parse().unwrap(), began).await
        }
        "meter" => {
            meter(
                start(&arg(1)),
                arg(2),
                arg(3).parse().unwrap(),
                arg(4).parse().unwrap(),
            )
            .await
        }
        other => panic!("unknown command {other}"),
    }
}

/// Each task takes the lock `iterations` times and, under it, increments the counter in a file
/// by reading, pausing and writing (not atomic: only the lock keeps increments apart).
async fn lock(atom: Arc<Atom>, key: String, tasks: usize, iterations: usize, counter: String) {
    emit(json!({"kind": "ready"}));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (atom, key, counter) = (atom.clone(), key.clone(), counter.clone());
            tokio::spawn(async move {
                for _ in 0..iterations {
                    let counter = counter.clone();
                    atom.lock(key.as_str(), |signal| async move {
                        let from = monotonic_ns();
                        let value: u64 = std::fs::read_to_string(&counter)
                            .ok()
                            .and_then(|text| text.trim().parse().ok())
                            .unwrap_or(0);
                        tokio::time::sleep(Duration::from_micros(500)).await;
                        let wrote = !signal.aborted();
                        if wrote {
                            std::fs::write(&counter, (value + 1).to_string()).unwrap();
                        }
                        let to = monotonic_ns();
                        emit(json!({"kind": "held", "task": task, "from": from, "to": to,
                            "token": signal.token(), "wrote": wrote, "lost": signal.aborted()}));
                    })
                    .await
                    .expect("lock");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("task");
    }
    emit(json!({"kind": "done"}));
}

async fn hold(atom: Arc<Atom>, key: String) {
    let mut commands = commands();
    emit(json!({"kind": "ready"}));
    let held = atom.acquire(key.as_str()).await.expect("acquire");
    let signal = held.signal();
    let valid_for = held.valid_for().unwrap_or_default();
    let at = monotonic_ns();
    emit(json!({"kind": "acquired", "token": held.token(), "at": at,
        "valid_until": at + valid_for.as_nanos() as u64}));
    let mut lost_reported = false;
    loop {
        tokio::select! {
            _ = signal.lost(), if !lost_reported => {
                lost_reported = true;
                emit(json!({"kind": "lost", "at": monotonic_ns()}));
            }
            command = commands.recv() => {
                if command.as_deref() == Some("release") || command.is_none() {
                    emit(json!({"kind": "releasing", "at": monotonic_ns()}));
                    held.release().await;
                    emit(json!({"kind": "released", "at": monotonic_ns()}));
                    return;
                }
            }
        }
    }
}

/// `began`: before the atom started (before its first heartbeat).
async fn slots(atom: Arc<Atom>, total: u32, began: u64) {
    let mut commands = commands();
    let _listening = atom.onassigned(move |assignment| {
        emit(
            json!({"kind": "assigned", "at": monotonic_ns(), "assignment": assignment,
            "slots": assignment.map(|a| a.slots(total))}),
        );
    });
    emit(json!({"kind": "ready", "began": began}));
    let mut panicking = None;
    while let Some(command) = commands.recv().await {
        match command.as_str() {
            "panic" => panicking = Some(atom.onassigned(|_| panic!("listener fails on purpose"))),
            "slots" => emit(json!({"kind": "slots", "slots": atom.slots(total)})),
            // `slots N`: the API's answer for another total.
            other => match other.strip_prefix("slots ").map(str::parse::<u32>) {
                Some(Ok(asked)) => {
                    emit(json!({"kind": "slots", "total": asked, "slots": atom.slots(asked)}))
                }
                _ => panic!("unknown command {other}"),
            },
        }
    }
    atom.shutdown().await;
    drop(panicking);
    emit(json!({"kind": "stopped", "at": monotonic_ns()}));
}

async fn meter(atom: Arc<Atom>, key: String, delta: u64, count: usize) {
    for _ in 0..count {
        let debts = atom.meter(key.as_str(), &[delta]).await.expect("meter");
        emit(json!({"kind": "metered", "debt": debts[0], "at": monotonic_ns()}));
    }
    emit(json!({"kind": "done"}));
}
