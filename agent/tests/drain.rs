//! The drain of a process that takes calls over the real RabbitMQ (127.0.0.1:5672): SIGTERM
//! during a stream of calls to two replicas.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{broker_context, events, now, Composition};

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-drain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn call(agent: &str, target: &str, request: &str) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .args(["call", target, request, "--agent", agent])
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

#[test]
fn sigterm_during_a_stream_of_calls_runs_each_once_elsewhere_and_gives_up_the_name_first() {
    let (context, _, _queues) = broker_context("drain", "amqp://127.0.0.1:5672");
    let context = context.to_str().unwrap().to_owned();
    let notes = temp("notes");
    let charges = temp("charges");
    let replica = |instance: &str| {
        Composition::start(
            &["agent/tests/components/terminals", "--context", &context],
            &[
                ("TOA_INSTANCE", instance),
                ("TEST_NOTES", notes.to_str().unwrap()),
                ("TEST_RECORD", charges.to_str().unwrap()),
                // A long dispose: the name must be gone long before the process is.
                ("TERMINALS_DISPOSE_MS", "3000"),
            ],
        )
    };
    let (one, two) = (replica("till-1"), replica("till-2"));
    let caller_record = temp("caller");
    let caller = Composition::caller(std::path::Path::new(&context), &caller_record);
    for composition in [&one, &two, &caller] {
        composition.wait_ready();
    }
    let pid_of = |instance: &str| {
        let answer = call(
            &caller.agent,
            "test.terminals.pid",
            &format!("{{ instance: {instance}, timeout: 5000 }}"),
        );
        answer["reply"]
            .as_u64()
            .unwrap_or_else(|| panic!("{answer}"))
    };
    let draining_pid = pid_of("till-1");

    // A stream of ordinary calls, 6 at a time, each taking 150 ms in the program.
    const CALLS: u64 = 90;
    let next = Arc::new(AtomicU64::new(0));
    let answers = Arc::new(Mutex::new(HashMap::new()));
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let (next, answers, agent) = (next.clone(), answers.clone(), caller.agent.clone());
            std::thread::spawn(move || loop {
                let id = next.fetch_add(1, Ordering::SeqCst);
                if id >= CALLS {
                    return;
                }
                let answer = call(
                    &agent,
                    "test.terminals.note",
                    &format!("{{ input: {{ id: {id}, sleep_ms: 150 }} }}"),
                );
                answers.lock().unwrap().insert(id, answer);
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while events(&notes).len() < 15 {
        assert!(Instant::now() < deadline, "the stream did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    let began = now();
    one.signal_term();
    // A call naming the draining process is refused at once, long before its dispose ends. Each
    // probe waits 300 ms at most: one published in the moment the name is being given up can be
    // left unanswered (`Abandoned` at its deadline; under CI's load a 10 s probe did), and the
    // next one must then be refused.
    let addressee = loop {
        let answer = call(
            &caller.agent,
            "test.terminals.pid",
            "{ instance: till-1, timeout: 300 }",
        );
        if answer["error"]["code"] == "Addressee" {
            break now() - began;
        }
        assert!(now() - began < 10.0, "still {answer} 10 s after SIGTERM");
    };
    assert!(
        addressee <= 1.0,
        "a named call got Addressee {addressee:.3} s after SIGTERM"
    );
    for worker in workers {
        worker.join().unwrap();
    }

    let answers = answers.lock().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(_, answer)| answer["reply"]["pid"].as_u64().is_none())
        .collect();
    assert!(failed.is_empty(), "calls that failed: {failed:?}");
    let runs = events(&notes);
    let mut per_id: HashMap<u64, usize> = HashMap::new();
    for run in &runs {
        *per_id.entry(run["id"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(per_id.len() as u64, CALLS, "every call ran");
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "calls that ran more than once: {twice:?}");
    // Nothing started on the draining process after its drain began (allowing for the signal's
    // way in), and it did run calls before.
    let late: Vec<&Value> = runs
        .iter()
        .filter(|r| r["pid"] == draining_pid && r["started"].as_f64().unwrap() > began + 0.1)
        .collect();
    assert!(late.is_empty(), "started on the draining process: {late:?}");
    assert!(runs.iter().any(|r| r["pid"] == draining_pid));
    let (stopped, log) = one.terminate(Duration::from_secs(30));
    assert!(stopped, "{log}");
}

#[test]
fn a_call_still_running_when_the_drains_budget_ends_is_given_back_and_runs_elsewhere() {
    let (context, _, _queues) =
        support::broker_context_with("budget", "amqp://127.0.0.1:5672", "limits:\n  drain: 500\n");
    let context = context.to_str().unwrap().to_owned();
    let starts = temp("budget-starts");
    let notes = temp("budget-notes");
    let replica = |instance: &str| {
        let composition = Composition::start(
            &["agent/tests/components/terminals", "--context", &context],
            &[
                ("TOA_INSTANCE", instance),
                ("TEST_NOTE_STARTS", starts.to_str().unwrap()),
                ("TEST_NOTES", notes.to_str().unwrap()),
            ],
        );
        composition.wait_ready();
        composition
    };
    let one = replica("till-1");
    let caller_record = temp("budget-caller");
    let caller = Composition::caller(std::path::Path::new(&context), &caller_record);
    let agent = caller.agent.clone();
    let call = std::thread::spawn(move || {
        call(
            &agent,
            "test.terminals.note",
            "{ input: { id: 1, sleep_ms: 3000 } }",
        )
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while events(&starts).is_empty() {
        assert!(Instant::now() < deadline, "the call did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _two = replica("till-2");
    // The drain waits 0.5 s for the call, then stops the program under it.
    let (stopped, log) = one.terminate(Duration::from_secs(30));
    assert!(stopped, "{log}");
    assert!(
        log.contains("calls still run at the end of the drain's budget"),
        "{log}"
    );
    let answer = call.join().unwrap();
    let runs = events(&notes);
    assert_eq!(runs.len(), 1, "it finished once: {runs:?}");
    assert_eq!(answer["reply"]["pid"], runs[0]["pid"], "{answer}");
    let started: Vec<u64> = events(&starts)
        .iter()
        .map(|s| s["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        started.len(),
        2,
        "started here, then again on the other replica"
    );
    assert_ne!(started[0], started[1]);
}

/// The process's own queue's ready and unacknowledged counts on the shared broker.
fn own_queue_counts(queue: &str) -> Option<(u64, u64)> {
    support::rabbit::list_queues(&["name", "messages_ready", "messages_unacknowledged"])
        .into_iter()
        .find(|row| row.first().is_some_and(|name| name == queue))
        .and_then(|row| Some((row.get(1)?.parse().ok()?, row.get(2)?.parse().ok()?)))
}

/// A call held under the process's name when it stops (queued behind a running one, past the
/// prefetch) is answered `Addressee` at once, the running one finishes, and the stop logs nothing
/// above INFO (issue 25). Before, cancelling the name's only consumer deleted its queue (it was
/// auto-delete) with the held call in it: its caller waited for its whole timeout, and every stop
/// logged `NOT_FOUND - no queue` and two warnings.
#[test]
fn a_call_held_under_the_name_at_a_stop_is_an_addressee_and_the_stop_logs_nothing_above_info() {
    let (context, application, _queues) = broker_context("held", "amqp://127.0.0.1:5672");
    let charges = temp("held-charges");
    let starts = temp("held-starts");
    let till = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &[
            ("TOA_INSTANCE", "till-1"),
            ("TEST_RECORD", charges.to_str().unwrap()),
            ("TEST_CHARGE_STARTS", starts.to_str().unwrap()),
            ("TOA_PREFETCH", "1"),
        ],
    );
    let caller = Composition::caller(&context, &temp("held-caller"));
    till.wait_ready();
    caller.connect_terminal("till-1", "t1");
    let charge = |amount: u32, sleep_ms: u32| {
        let agent = caller.agent.clone();
        let request = format!(
            "{{ input: {{ terminal: t1, amount: {amount}, sleep_ms: {sleep_ms} }}, instance: till-1, timeout: 20000 }}"
        );
        std::thread::spawn(move || {
            let started = Instant::now();
            let answer = call(&agent, "test.terminals.charge", &request);
            (answer, started.elapsed())
        })
    };
    // One charge runs (the prefetch of one taken); the next is held in the name's queue.
    let running = charge(1, 3000);
    let deadline = Instant::now() + Duration::from_secs(15);
    while events(&starts).is_empty() {
        assert!(Instant::now() < deadline, "the first charge did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = charge(2, 0);
    let queue = format!("toa.{application}.test.terminals@till-1");
    while own_queue_counts(&queue) != Some((1, 1)) {
        assert!(
            Instant::now() < deadline,
            "{queue}: {:?}",
            own_queue_counts(&queue)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let before = till.log().len();
    let (stopped, log) = till.terminate(Duration::from_secs(30));
    assert!(stopped, "{log}");
    let (answer, took) = held.join().unwrap();
    assert_eq!(answer["error"]["code"], "Addressee", "{answer}");
    assert!(took < Duration::from_secs(15), "held for {took:?}");
    let (answer, _) = running.join().unwrap();
    assert_eq!(answer["reply"]["charged"], 1, "{answer}");
    assert_eq!(events(&starts).len(), 1, "the held charge never ran");
    let stop = &log[before..];
    let loud: Vec<&str> = stop
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    assert!(loud.is_empty(), "the stop logged:\n{}", loud.join("\n"));
}
