//! The drain of a process that takes calls over the real RabbitMQ (127.0.0.1:5672): SIGTERM
//! during a stream of calls to two replicas.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::{broker_context, events, Composition};

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-drain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
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
                ("TOA_NOTES", notes.to_str().unwrap()),
                ("TOA_RECORD", charges.to_str().unwrap()),
                // A long dispose: the name must be gone long before the process is.
                ("TERMINALS_DISPOSE_MS", "3000"),
            ],
        )
    };
    let (one, two) = (replica("till-1"), replica("till-2"));
    let caller_record = temp("caller");
    let caller = Composition::start(
        &["agent/tests/components/recorder", "--context", &context],
        &[
            ("TOA_INSTANCE", "caller-1"),
            ("TOA_RECORD", caller_record.to_str().unwrap()),
        ],
    );
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
    // A call naming the draining process is refused at once, long before its dispose ends.
    let addressee = loop {
        let answer = call(
            &caller.agent,
            "test.terminals.pid",
            "{ instance: till-1, timeout: 10000 }",
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
