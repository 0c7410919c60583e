//! Calls over the real RabbitMQ on 127.0.0.1:5672 between `toa-agent compose` processes.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{broker_context, events, Composition};

/// A context of its own naming the shared broker.
fn context(name: &str) -> (PathBuf, String, support::rabbit::Queues) {
    broker_context(name, "amqp://127.0.0.1:5672")
}

fn terminals(context: &Path, instance: &str, record: &Path, extra: &[(&str, &str)]) -> Composition {
    let mut env = vec![
        ("TOA_INSTANCE", instance),
        ("TEST_RECORD", record.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            context.to_str().unwrap(),
        ],
        &env,
    )
}

fn record(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-charges-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn a_call_to_one_process_reaches_it_or_fails_with_addressee() {
    let (context, application, _queues) = context("addressed");
    let charges_file = record("addressed");
    let till1 = terminals(&context, "till-1", &charges_file, &[]);
    till1.wait_ready();
    let till2 = terminals(&context, "till-2", &charges_file, &[]);
    till2.wait_ready();

    // connect is ordinary: whichever replica takes it holds the terminal.
    let (ok, answer) = till1.call("test.terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok, "{answer}");
    let holder = answer["reply"]["holder"].as_str().unwrap().to_owned();
    let other = if holder == "till-1" {
        "till-2"
    } else {
        "till-1"
    };

    // Charging on the holder works from either process; on the other it is the operation's own answer.
    let request = |instance: &str| {
        format!("{{ input: {{ terminal: t1, amount: 5 }}, instance: {instance} }}")
    };
    let (ok, answer) = till2.call("test.terminals.charge", &request(&holder));
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"]["charged"], 5);
    let (_, answer) = till1.call("test.terminals.charge", &request(other));
    assert_eq!(answer["error"]["code"], "NOT_HELD", "{answer}");
    // Nobody holds till-9.
    let (ok, answer) = till1.call("test.terminals.charge", &request("till-9"));
    assert!(!ok);
    assert_eq!(
        (
            answer["error"]["code"].as_str(),
            answer["error"]["number"].as_u64()
        ),
        (Some("Addressee"), Some(403)),
        "{answer}"
    );
    // No input in the logs, an Addressee's included.
    for log in [till1.log(), till2.log()] {
        assert!(!log.contains("amount"), "an input in the log:\n{log}");
    }
    // The request contract is checked before anything is sent.
    let (_, answer) = till1.call(
        "test.terminals.charge",
        "{ input: { terminal: t1, amount: 5 } }",
    );
    assert_eq!(answer["error"]["code"], "RequestContract", "{answer}");

    // The queues are on the real broker.
    let names: Vec<String> = support::rabbit::list_queues(&["name"])
        .into_iter()
        .flatten()
        .collect();
    for queue in [
        format!("toa.{application}.test.terminals"),
        format!("toa.{application}.test.terminals@till-1"),
        format!("toa.{application}.test.terminals@till-2"),
    ] {
        assert!(names.contains(&queue), "{queue} missing in: {names:?}");
    }
    assert_eq!(events(&charges_file).len(), 1, "one charge ran");
}

#[test]
fn a_call_not_taken_before_its_deadline_never_runs() {
    let (context, _, _queues) = context("deadline");
    let charges_file = record("deadline");
    // One call at a time, so later calls wait in the broker's queue.
    let till = terminals(&context, "till-1", &charges_file, &[("TOA_PREFETCH", "1")]);
    till.wait_ready();
    let (ok, _) = till.call("test.terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok);
    let agent = till.agent.clone();
    let call = move |request: &'static str| {
        let agent = agent.clone();
        std::thread::spawn(move || {
            let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
                .args(["call", "test.terminals.charge", request, "--agent", &agent])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null)
        })
    };
    let slow = call(
        "{ input: { terminal: t1, amount: 1, sleep_ms: 1500 }, instance: till-1, timeout: 5000 }",
    );
    std::thread::sleep(Duration::from_millis(300));
    let expired = call("{ input: { terminal: t1, amount: 2 }, instance: till-1, timeout: 400 }");
    std::thread::sleep(Duration::from_millis(50));
    let patient = call("{ input: { terminal: t1, amount: 3 }, instance: till-1, timeout: 5000 }");
    let expired = expired.join().unwrap();
    assert_eq!(expired["error"]["code"], "Abandoned", "{expired}");
    assert_eq!(expired["error"]["number"], 404);
    assert_eq!(slow.join().unwrap()["reply"]["charged"], 1);
    assert_eq!(
        patient.join().unwrap()["reply"]["charged"],
        3,
        "a call queued behind with a longer deadline runs"
    );
    std::thread::sleep(Duration::from_millis(500));
    let amounts: Vec<u64> = events(&charges_file)
        .iter()
        .map(|c| c["amount"].as_u64().unwrap())
        .collect();
    assert_eq!(
        amounts,
        vec![1, 3],
        "the call whose deadline passed in the queue never ran"
    );
}

/// "Not run in time" stays true (issue 25): a call to one process whose caller was answered
/// `Abandoned` (or `FAILED`) never starts in the program after that answer. Three runs of 200
/// calls from 20 threads, at timeouts of 120 to 300 ms on a 100 ms operation, so many are checked
/// right at their deadline; the program's record of starts (wall clock, the same host) is checked
/// against when each answer arrived.
#[test]
fn no_call_starts_in_the_program_after_its_caller_was_answered_abandoned() {
    let (context, _, _queues) = context("edge");
    let charges_file = record("edge");
    let starts_file = record("edge-starts");
    // Four at a time: the others wait in the queue, and many are taken right at their deadline.
    let starts_env = [
        ("TEST_CHARGE_STARTS", starts_file.to_str().unwrap()),
        ("TOA_PREFETCH", "4"),
    ];
    let till = terminals(&context, "till-1", &charges_file, &starts_env);
    let caller = Composition::caller(&context, &record("edge-caller"));
    till.wait_ready();
    caller.connect_terminal("till-1", "t1");
    let mut answers: Vec<(u64, Value, f64)> = Vec::new();
    for run in 0..3u64 {
        let threads: Vec<_> = (0..20u64)
            .map(|thread| {
                let agent = caller.agent.clone();
                std::thread::spawn(move || {
                    (0..10u64)
                        .map(|i| {
                            let id = 1000 * (run + 1) + thread * 10 + i;
                            let timeout = 120 + (id % 10) * 20;
                            let body = format!(
                                r#"{{"input": {{"terminal": "t1", "amount": {id}, "sleep_ms": 100}}, "instance": "till-1", "timeout": {timeout}}}"#
                            );
                            let url = format!("{agent}/v1/call/test.terminals/charge");
                            let (_, response) = support::post(&url, &body);
                            let at = support::now();
                            let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
                            (id, serde_json::from_str(body).unwrap_or(Value::Null), at)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for thread in threads {
            answers.extend(thread.join().unwrap());
        }
    }
    let started: std::collections::HashMap<u64, f64> = events(&starts_file)
        .iter()
        .map(|s| (s["amount"].as_u64().unwrap(), s["at"].as_f64().unwrap()))
        .collect();
    let mut given_up = 0;
    let mut late = Vec::new();
    for (id, answer, at) in &answers {
        let code = answer["error"]["code"].as_str().unwrap_or_default();
        if answer["reply"]["charged"] == *id {
            continue;
        }
        assert!(
            matches!(code, "Abandoned" | "FAILED"),
            "call {id}: {answer}"
        );
        given_up += 1;
        if let Some(start) = started.get(id).filter(|start| **start > *at) {
            late.push(format!(
                "{id} started {:.1} ms after its {code}",
                (start - at) * 1000.0
            ));
        }
    }
    eprintln!(
        "{} calls: {} ran, {given_up} given up ({} of them started before the answer)",
        answers.len(),
        answers.len() - given_up,
        answers
            .iter()
            .filter(|(id, answer, _)| answer["reply"].is_null() && started.contains_key(id))
            .count()
    );
    // Both ways: calls met their deadline (or the test tests nothing), and a fair share ran (a
    // margin that dropped everything would pass the check below; about 170 of 600 run here).
    assert!(
        given_up > 0,
        "no call met its deadline: the test tests nothing"
    );
    assert!(
        answers.len() - given_up >= 60,
        "only {} of {} calls ran",
        answers.len() - given_up,
        answers.len()
    );
    assert!(late.is_empty(), "{}", late.join("\n"));
}

#[test]
fn a_second_process_with_a_taken_name_waits_for_it_and_then_answers() {
    let (context, _, _queues) = context("taken");
    let charges_file = record("taken");
    let first = terminals(&context, "till-7", &charges_file, &[]);
    first.wait_ready();
    let (_, answer) = first.call("test.terminals.pid", "{ instance: till-7 }");
    let first_pid = answer["reply"].as_u64().unwrap();
    let second = terminals(&context, "till-7", &charges_file, &[]);
    second.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !second.log().contains("Instance name taken") {
        assert!(
            Instant::now() < deadline,
            "no `Instance name taken`:\n{}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Still the first one answers under the name.
    let (_, answer) = second.call("test.terminals.pid", "{ instance: till-7 }");
    assert_eq!(answer["reply"].as_u64(), Some(first_pid));
    let (stopped, log) = first.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = second.call("test.terminals.pid", "{ instance: till-7, timeout: 1000 }");
        if answer["reply"].as_u64().is_some_and(|pid| pid != first_pid) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second process did not take the name: {answer}\n{}",
            second.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_killed_process_abandons_calls_in_flight_and_then_is_an_addressee() {
    let (context, _, _queues) = context("killed");
    let charges_file = record("killed");
    let till = terminals(&context, "till-1", &charges_file, &[]);
    till.wait_ready();
    let caller = terminals(&context, "till-2", &charges_file, &[]);
    caller.wait_ready();
    caller.connect_terminal("till-1", "t1");
    let agent = caller.agent.clone();
    let in_flight = std::thread::spawn(move || {
        let output = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args(["call", "test.terminals.charge", "{ input: { terminal: t1, amount: 1, sleep_ms: 3000 }, instance: till-1, timeout: 1500 }", "--agent", &agent])
            .output()
            .unwrap();
        serde_json::from_slice::<Value>(&output.stdout).unwrap_or(Value::Null)
    });
    std::thread::sleep(Duration::from_millis(300));
    till.kill();
    let answer = in_flight.join().unwrap();
    assert_eq!(
        answer["error"]["code"], "Abandoned",
        "a call in flight when its process died: {answer}"
    );
    // Its own queue went with its connection: new calls find nobody.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = caller.call(
            "test.terminals.charge",
            "{ input: { terminal: t1, amount: 2 }, instance: till-1, timeout: 1000 }",
        );
        if answer["error"]["code"] == "Addressee" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "calls to the killed process never became Addressee: {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Calls and replies larger than one AMQP frame (32 KiB here) are split and joined again.
#[test]
fn a_call_larger_than_a_frame_goes_through() {
    let (context, _, _queues) = context("large");
    let charges_file = record("large");
    let till = terminals(&context, "till-1", &charges_file, &[]);
    till.wait_ready();
    // One command-line argument holds at most 128 KiB.
    let terminal = "t".repeat(100 * 1024);
    let (ok, answer) = till.call(
        "test.terminals.connect",
        &format!("{{ \"input\": {{ \"terminal\": \"{terminal}\" }} }}"),
    );
    assert!(ok, "{answer}");
    let (ok, answer) = till.call(
        "test.terminals.charge",
        &format!("{{ \"input\": {{ \"terminal\": \"{terminal}\", \"amount\": 7 }}, \"instance\": \"till-1\" }}"),
    );
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"]["charged"], 7);
}

/// The drain runs `dispose` once nothing calls into the process any more; `dispose` can still
/// call other processes.
#[test]
fn dispose_during_the_drain_can_still_call_another_process() {
    let (context, _, _queues) = context("dispose");
    let charges_file = record("dispose");
    let other = terminals(&context, "till-2", &charges_file, &[]);
    other.wait_ready();
    let events_file = record("dispose-events");
    let recorder = Composition::start(
        &[
            "agent/tests/components/recorder",
            "--context",
            context.to_str().unwrap(),
        ],
        &[
            ("TEST_RECORD", events_file.to_str().unwrap()),
            ("RECORDER_DISPOSE_CALL", "test.terminals.connect"),
        ],
    );
    recorder.wait_ready();
    let drained = Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .args(["drain", "--agent", &recorder.agent])
        .output()
        .unwrap();
    assert!(drained.status.success(), "{}", recorder.log());
    let events = events(&events_file);
    let dispose = events.last().unwrap();
    assert_eq!(dispose["event"], "dispose", "{events:?}");
    assert_eq!(
        dispose["called"]["holder"], "till-2",
        "dispose's call to another process: {dispose}"
    );
}

/// Calls to one process run at the same time (up to the prefetch), not one after another.
#[test]
fn calls_to_one_process_run_concurrently() {
    let (context, _, _queues) = context("concurrent");
    let charges_file = record("concurrent");
    let till = terminals(&context, "till-1", &charges_file, &[]);
    till.wait_ready();
    let caller = terminals(&context, "till-2", &charges_file, &[]);
    caller.wait_ready();
    caller.connect_terminal("till-1", "t1");
    let calls: Vec<_> = (1..=4)
        .map(|amount| {
            let agent = caller.agent.clone();
            std::thread::spawn(move || {
                let request = format!("{{ input: {{ terminal: t1, amount: {amount}, sleep_ms: 700 }}, instance: till-1, timeout: 10000 }}");
                Command::new(env!("CARGO_BIN_EXE_toa-agent"))
                    .args(["call", "test.terminals.charge", &request, "--agent", &agent])
                    .output()
                    .unwrap()
            })
        })
        .collect();
    for call in calls {
        assert!(call.join().unwrap().status.success());
    }
    let charges = events(&charges_file);
    assert_eq!(charges.len(), 4, "{charges:?}");
    // Every pair of the four ran at overlapping times.
    let spans: Vec<(f64, f64)> = charges
        .iter()
        .map(|c| (c["started"].as_f64().unwrap(), c["ended"].as_f64().unwrap()))
        .collect();
    let latest_start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let earliest_end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(
        latest_start < earliest_end,
        "the four calls did not all run at once: {spans:?}"
    );
}

#[test]
fn the_receiving_agent_refuses_what_the_component_does_not_declare_and_keeps_serving() {
    let (context, application, _queues) = support::broker_context_with(
        "receiving",
        "amqp://127.0.0.1:5672",
        "limits:\n  message: 4096\n",
    );
    let record = record("receiving");
    let recorder = Composition::start(
        &[
            "agent/tests/components/recorder",
            "--context",
            context.to_str().unwrap(),
        ],
        &[("TEST_RECORD", record.to_str().unwrap())],
    );
    recorder.wait_ready();
    // settle echoes once.
    let echoes = || support::count(&support::events(&record), "echo");
    assert_eq!(echoes(), 1);
    let queue = format!("toa.{application}.test.recorder");
    for (body, expected) in [
        (
            r#"{"operation": "../lifecycle/dispose", "input": {}}"#,
            "test.recorder has no operation \"../lifecycle/dispose\"",
        ),
        (
            r#"{"operation": "echo", "input": "not an object"}"#,
            "test.recorder.echo: input",
        ),
        (r#"{"operation": 7}"#, "expected a JSON call"),
        (r#"{"input": {}}"#, "expected a JSON call"),
        ("\u{ff} not json", "expected a JSON call"),
        (
            &format!(
                r#"{{"operation": "echo", "input": {{"a": "{}"}}}}"#,
                "x".repeat(5_000)
            ),
            "the call is 5041 bytes; a call is at most 4096 (limits.message)",
        ),
    ] {
        let reply = support::rabbit::request("amqp://127.0.0.1:5672", &queue, body);
        assert_eq!(reply["refused"], "RequestContract", "{body}: {reply}");
        let message = reply["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    let names = support::event_names(&record);
    assert!(!names.contains(&"dispose".to_owned()), "{names:?}");
    // Refusals are logged with the call's id and operation, never its input.
    let log = recorder.log();
    assert!(
        log.contains("refused a call") && log.contains("raw-1"),
        "{log}"
    );
    assert!(
        !log.contains("not an object"),
        "an input in the log:\n{log}"
    );
    assert_eq!(echoes(), 1, "{names:?}");
    // What the component declares still reaches it, with the call's id.
    let reply = support::rabbit::request(
        "amqp://127.0.0.1:5672",
        &queue,
        r#"{"operation": "echo", "input": {"a": 1}}"#,
    );
    assert_eq!(reply["reply"], serde_json::json!({"a": 1}), "{reply}");
    let echo = support::events(&record)
        .into_iter()
        .rfind(|e| e["event"] == "echo")
        .unwrap();
    assert_eq!(echo["call"]["id"], "raw-1", "{echo}");
    assert_eq!(echo["call"]["redelivered"], false, "{echo}");
    // Headers of the caller's choosing are read within what an agent writes: a deadline 290
    // million years away (which overflowed the program's time limit and took the call down
    // unanswered) is the longest timeout a call may state from now.
    let before = now_ms();
    let reply = support::rabbit::request_with(
        "amqp://127.0.0.1:5672",
        &queue,
        r#"{"operation": "echo", "input": {"far": true}}"#,
        &[("toa-deadline", i64::MAX), ("x-toa-delivery", i64::MIN)],
    );
    assert_eq!(reply["reply"], serde_json::json!({"far": true}), "{reply}");
    let echo = support::events(&record)
        .into_iter()
        .rfind(|e| e["event"] == "echo")
        .unwrap();
    let deadline = echo["call"]["deadline_ms"]
        .as_i64()
        .unwrap_or_else(|| panic!("{echo}"));
    let longest = i64::from(u32::MAX);
    assert!(
        (before + longest..=now_ms() + longest).contains(&deadline),
        "{deadline}: at most u32::MAX ms from now"
    );
}

fn now_ms() -> i64 {
    (support::now() * 1000.0) as i64
}

#[test]
fn a_dead_program_makes_its_agent_unready_and_its_calls_go_to_the_other_replica() {
    let (context, _, _queues) = context("dead-program");
    let charges = record("dead-program");
    let notes = record("dead-program-notes");
    let probe = support::free_port();
    let probe_listen = format!("127.0.0.1:{probe}");
    let notes_env = ("TEST_NOTES", notes.to_str().unwrap());
    let one = terminals(
        &context,
        "till-1",
        &charges,
        &[notes_env, ("TOA_PROBE_LISTEN", &probe_listen)],
    );
    let two = terminals(&context, "till-2", &charges, &[notes_env]);
    one.wait_ready();
    two.wait_ready();
    let readyz = format!("http://127.0.0.1:{probe}/readyz");
    assert_eq!(support::http_status(&readyz), 200);
    let (_, answer) = two.call("test.terminals.pid", "{ instance: till-1, timeout: 5000 }");
    let pid = answer["reply"].as_i64().unwrap();
    // SAFETY: killing the program the test's composition started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };

    let deadline = Instant::now() + Duration::from_secs(10);
    while support::http_status(&readyz) != 503 {
        assert!(
            Instant::now() < deadline,
            "still ready 10 s after its program died"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every ordinary call now runs on the other replica; none fails.
    for id in 0..20 {
        let (ok, answer) = two.call(
            "test.terminals.note",
            &format!("{{ input: {{ id: {id} }} }}"),
        );
        assert!(ok, "call {id}: {answer}");
    }
    assert_eq!(support::events(&notes).len(), 20);
    // A call naming the process with the dead program fails at once, not at its timeout.
    let started = Instant::now();
    let (_, answer) = two.call("test.terminals.pid", "{ instance: till-1, timeout: 30000 }");
    assert_eq!(answer["error"]["code"], "FAILED", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not running"),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(one.log().contains("the program does not answer"));
}
