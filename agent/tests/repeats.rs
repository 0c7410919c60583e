//! Calls given an idempotency key run once, across replicas (records in the local Redis on
//! 6379), over the shared RabbitMQ on 5672.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{broker_context_with, events, Composition};

const ATOMICITY: &str = "atomicity:\n  redis: redis://127.0.0.1:6379\n";

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-repeats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

struct Files {
    starts: PathBuf,
    notes: PathBuf,
}

impl Files {
    fn new(name: &str) -> Self {
        Self {
            starts: temp(&format!("{name}-starts")),
            notes: temp(&format!("{name}-notes")),
        }
    }
}

fn replica(context: &Path, instance: &str, files: &Files) -> Composition {
    let composition = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &[
            ("TOA_INSTANCE", instance),
            ("TEST_NOTE_STARTS", files.starts.to_str().unwrap()),
            ("TEST_NOTES", files.notes.to_str().unwrap()),
        ],
    );
    composition.wait_ready();
    composition
}

fn caller(context: &Path, name: &str) -> Composition {
    Composition::caller(context, &temp(&format!("{name}-caller")))
}

fn note(agent: &str, request: &str) -> std::thread::JoinHandle<Value> {
    let (agent, request) = (agent.to_owned(), request.to_owned());
    std::thread::spawn(move || {
        let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args(["call", "test.terminals.note", &request, "--agent", &agent])
            .output()
            .unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
    })
}

#[test]
fn a_key_runs_once_across_replicas_a_failure_is_not_kept_and_another_input_is_refused() {
    let (context, _, _queues) = broker_context_with("repeats", "amqp://127.0.0.1:5672", ATOMICITY);
    let files = Files::new("once");
    let (_one, _two) = (
        replica(&context, "till-1", &files),
        replica(&context, "till-2", &files),
    );
    let caller = caller(&context, "once");

    // The same key from two callers at once: the calls reach both replicas; one runs.
    let request = "{ input: { id: 1, sleep_ms: 800 }, key: order-1 }";
    let calls: Vec<_> = (0..4).map(|_| note(&caller.agent, request)).collect();
    let answers: Vec<Value> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    for answer in &answers {
        assert_eq!(answer, &answers[0], "every repeat gets the first outcome");
        assert!(answer["reply"]["pid"].is_u64(), "{answer}");
    }
    assert_eq!(events(&files.starts).len(), 1, "it ran once");
    // Later repeats too, without running.
    let again = note(&caller.agent, request).join().unwrap();
    assert_eq!(again, answers[0]);
    assert_eq!(events(&files.notes).len(), 1);
    // Without a key, the same input runs again.
    let unkeyed = note(&caller.agent, "{ input: { id: 1 } }").join().unwrap();
    assert!(unkeyed["reply"]["pid"].is_u64(), "{unkeyed}");
    assert_eq!(events(&files.notes).len(), 2);

    // The key with another input names another call: refused.
    let other = note(&caller.agent, "{ input: { id: 2 }, key: order-1 }")
        .join()
        .unwrap();
    assert_eq!(other["error"]["code"], "RequestContract", "{other}");
    assert!(
        other["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another input"),
        "{other}"
    );

    // A failed call is not kept: its repeat runs.
    let failing = "{ input: { id: 3, fail: true }, key: order-3 }";
    for attempt in 1..=2 {
        let answer = note(&caller.agent, failing).join().unwrap();
        assert_eq!(answer["error"]["code"], "FAILED", "{answer}");
        let starts = events(&files.starts)
            .iter()
            .filter(|s| s["id"] == 3)
            .count();
        assert_eq!(starts, attempt);
    }
}

/// The broker's process id of the connection of the agent named `instance` of `application`.
fn connection_of(application: &str, instance: &str) -> String {
    let wanted = format!("toa-agent {application} {instance}");
    let output = Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.lines()
        .find(|line| line.contains(&wanted))
        .and_then(|line| line.split('\t').next())
        .unwrap_or_else(|| panic!("no connection {wanted} in\n{text}"))
        .to_owned()
}

#[test]
fn a_call_redelivered_after_a_cut_connection_is_not_run_again() {
    let (context, application, _queues) =
        broker_context_with("redelivered", "amqp://127.0.0.1:5672", ATOMICITY);
    let files = Files::new("cut");
    let one = replica(&context, "till-1", &files);
    let caller = caller(&context, "cut");
    let call = note(
        &caller.agent,
        "{ input: { id: 1, sleep_ms: 1500 }, key: order-7 }",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while events(&files.starts).is_empty() {
        assert!(Instant::now() < deadline, "the call did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A second replica, then the first one's connection is cut while its program runs the call:
    // the broker gives the unacknowledged call to the second.
    let _two = replica(&context, "till-2", &files);
    let name = connection_of(&application, "till-1");
    let closed = Command::new("rabbitmqctl")
        .args(["-q", "close_connection", &name, "cut by the test"])
        .output()
        .unwrap();
    assert!(closed.status.success(), "{closed:?}");

    let answer = call.join().unwrap();
    assert!(answer["reply"]["pid"].is_u64(), "{answer}\n{}", one.log());
    assert_eq!(events(&files.notes).len(), 1, "the operation ran once");
    assert_eq!(
        events(&files.starts).len(),
        1,
        "the redelivery did not start it"
    );
}

#[test]
fn a_key_whose_first_process_died_is_free_again_after_that_calls_limit() {
    let more = format!("{ATOMICITY}limits:\n  operation: 3000\n");
    let (context, _, _queues) = broker_context_with("died", "amqp://127.0.0.1:5672", &more);
    let files = Files::new("died");
    let one = replica(&context, "till-1", &files);
    let caller = caller(&context, "died");
    let started = Instant::now();
    let call = note(
        &caller.agent,
        "{ input: { id: 1, sleep_ms: 1000 }, key: order-9 }",
    );
    while events(&files.starts).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the call did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killed while its program runs the call (it sleeps 1 s), before a second replica starts: a
    // second started first could take longer than the run under load, and the run would end.
    one.kill();
    let _two = replica(&context, "till-2", &files);
    // The redelivery waits for the dead process's claim (3 s, limits.operation), then runs.
    let answer = call.join().unwrap();
    assert!(answer["reply"]["pid"].is_u64(), "{answer}");
    assert_eq!(events(&files.starts).len(), 2);
    assert_eq!(
        events(&files.notes).len(),
        1,
        "only the second run finished"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "ran again before the first claim expired"
    );
}
