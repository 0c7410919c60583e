//! The poller example (`examples/poller`): a timer of the component's own polls after the start,
//! stops when the process is halted (`pause`), and polls again after `resume`, in the same process
//! with the same state.

mod support;

use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{control, count, events, free_port, Composition};

/// The poller's interval in this test (`POLLER_INTERVAL_MS`).
const INTERVAL: Duration = Duration::from_millis(100);
/// How long a paused poller is watched for polls that should not happen: ten intervals.
const OBSERVATION: Duration = Duration::from_millis(1000);
const TOKEN: &str = "poller-token";

/// The position of the only `name` event.
fn only(events: &[Value], name: &str) -> usize {
    let at: Vec<usize> = (0..events.len())
        .filter(|&i| events[i]["event"] == name)
        .collect();
    assert_eq!(at.len(), 1, "one {name} in {events:#?}");
    at[0]
}

/// Waits (at most 20 s) until the record satisfies `done`; the events then.
fn wait_until(record: &Path, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = events(record);
        if done(&events) {
            return events;
        }
        assert!(Instant::now() < deadline, "{what} within 20 s: {events:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_poller_stops_on_halt_and_polls_again_after_resume_in_the_same_process() {
    let dir = std::env::temp_dir().join(format!("toa-poller-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (record, watched, token_file) =
        (dir.join("record"), dir.join("watched"), dir.join("token"));
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let port = free_port();
    let composition = Composition::start(
        &[
            "examples/poller",
            "--control-listen",
            &format!("127.0.0.1:{port}"),
            "--control-token-file",
            token_file.to_str().unwrap(),
        ],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("POLLER_WATCH", watched.to_str().unwrap()),
            ("POLLER_INTERVAL_MS", &INTERVAL.as_millis().to_string()),
        ],
    );
    composition.wait_ready();

    // After the start it polls, and a poll sees the watched file change.
    wait_until(&record, "three polls", |e| count(e, "poll") >= 3);
    std::fs::write(&watched, "prices").unwrap();
    wait_until(&record, "a poll that saw the file change", |e| {
        e.iter()
            .any(|e| e["event"] == "poll" && e["changed"] == true)
    });

    // Halt: `pause` has run when the halt answers, and no poll comes after it.
    let (status, body) = control(
        port,
        "POST",
        "/control/halt",
        Some(TOKEN),
        r#"{"halt":"h1"}"#,
    );
    assert_eq!(
        (status, body["phase"].as_str()),
        (200, Some("paused")),
        "{body}"
    );
    let paused = events(&record);
    let pause = only(&paused, "pause");
    let polls = count(&paused, "poll");
    assert_eq!(
        paused[pause]["polls"], polls,
        "pause ends the poll in flight"
    );
    std::thread::sleep(OBSERVATION); // ten intervals: a timer left running would poll here
    let quiet = events(&record);
    assert_eq!(
        quiet.len(),
        paused.len(),
        "nothing happens while paused: {:#?}",
        &quiet[pause..]
    );
    let (_, body) = control(port, "GET", "/control/status", Some(TOKEN), "");
    assert_eq!(body["phase"], "paused", "{body}");
    assert_eq!(body["calls"]["since_pause"], 0, "{body}");

    // Resume: the same process polls again, counting on from where it stopped.
    let (status, body) = control(
        port,
        "POST",
        "/control/resume",
        Some(TOKEN),
        r#"{"halt":"h1"}"#,
    );
    assert_eq!(
        (status, body["phase"].as_str()),
        (200, Some("running")),
        "{body}"
    );
    let resumed = wait_until(&record, "two polls after resume", |e| {
        count(e, "poll") >= polls + 2
    });
    let resume = only(&resumed, "resume");
    assert_eq!(resume, paused.len(), "resume comes right after pause");
    let after: Vec<&Value> = resumed[resume + 1..]
        .iter()
        .filter(|e| e["event"] == "poll")
        .collect();
    assert_eq!(
        after[0]["n"],
        polls + 1,
        "the same state: the count goes on"
    );
    assert_eq!(count(&resumed, "preflight"), 1, "resume is not a restart");
    let pids: std::collections::HashSet<u64> =
        resumed.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 1, "one process throughout: {pids:?}");
    let (ok, answer) = composition.call("poller.polls", "{}");
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"]["polling"], true, "{answer}");

    // The stop: dispose stops the timer too.
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    let all = events(&record);
    let dispose = only(&all, "dispose");
    assert_eq!(dispose, all.len() - 1, "nothing after dispose: {all:#?}");
    assert_eq!(all[dispose]["polls"], count(&all, "poll"));
    let _ = std::fs::remove_dir_all(&dir);
}
