//! The halt as a process lives it, through the control endpoint of real `toa-agent compose`
//! processes: calls received over the real broker count, a failed `pause` is undone, a halt asked
//! for while starting is kept, and a halt runs to its end when its request is dropped.

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::{broker_context, control, count, events, free_port, Composition};

const TOKEN: &str = "halt-test-token";

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("toa-halt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// A composition with its control endpoint on a free port: the composition and the port.
fn with_control(name: &str, components: &[&str], env: &[(&str, &str)]) -> (Composition, u16) {
    let token = temp(&format!("{name}-token"));
    std::fs::write(&token, TOKEN).unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut args: Vec<&str> = components.to_vec();
    args.extend([
        "--control-listen",
        &listen,
        "--control-token-file",
        token.to_str().unwrap(),
    ]);
    (Composition::start(&args, env), port)
}

fn status(port: u16) -> Value {
    let (code, body) = control(port, "GET", "/control/status", Some(TOKEN), "");
    assert_eq!(code, 200, "{body}");
    body
}

/// Polls the status until `accept` takes it, within `limit`.
fn status_until(port: u16, limit: Duration, accept: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        // The endpoint may not be bound yet right after the start.
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let body = status(port);
            if accept(&body) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "status still {body} after {limit:?}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "no control endpoint within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn halt(port: u16, id: &str) -> (u16, Value) {
    control(
        port,
        "POST",
        "/control/halt",
        Some(TOKEN),
        &format!(r#"{{"halt":"{id}"}}"#),
    )
}

fn resume(port: u16, id: &str) -> (u16, Value) {
    control(
        port,
        "POST",
        "/control/resume",
        Some(TOKEN),
        &format!(r#"{{"halt":"{id}"}}"#),
    )
}

fn named<'a>(all: &'a [Value], event: &str, component: &str) -> Vec<&'a Value> {
    all.iter()
        .filter(|e| e["event"] == event && e["component"].as_str().unwrap().ends_with(component))
        .collect()
}

#[test]
fn calls_received_over_the_broker_count_and_a_running_one_is_in_flight() {
    // A (terminals) is called only by B (recorder) through B's agent, over the real broker.
    let (context, _, _queues) = broker_context("received", "amqp://127.0.0.1:5672");
    let context = context.to_str().unwrap().to_owned();
    let charges = temp("received-charges");
    let (a, port) = with_control(
        "received",
        &["agent/tests/components/terminals", "--context", &context],
        &[
            ("TOA_INSTANCE", "till-1"),
            ("TEST_RECORD", charges.to_str().unwrap()),
        ],
    );
    let b_record = temp("received-b");
    let b = Composition::caller(std::path::Path::new(&context), &b_record);
    a.wait_ready();

    let (code, body) = halt(port, "h1");
    assert_eq!(
        (code, body["phase"].as_str()),
        (200, Some("paused")),
        "{body}"
    );
    assert_eq!(body["calls"]["since_pause"], 0);

    let (ok, answer) = b.call("test.terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok, "{answer}");
    let counted = status(port);
    assert_eq!(
        counted["calls"]["since_pause"], 1,
        "a call received counts: {counted}"
    );
    assert_eq!(counted["calls"]["in_flight"], 0);
    let first = counted["calls"]["last_at_ms"].as_u64().unwrap();

    // A charge that takes 1.5 s is in flight in A for that long.
    let agent = b.agent.clone();
    let slow = std::thread::spawn(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args([
                "call",
                "test.terminals.charge",
                "{ input: { terminal: t1, amount: 3, sleep_ms: 1500 }, instance: till-1, timeout: 10000 }",
                "--agent",
                &agent,
            ])
            .output()
            .unwrap()
    });
    let running = status_until(port, Duration::from_secs(10), |s| {
        s["calls"]["in_flight"] == 1
    });
    assert_eq!(running["calls"]["since_pause"], 2, "{running}");
    let output = slow.join().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let after = status(port);
    assert_eq!(after["calls"]["in_flight"], 0, "{after}");
    let charge = &events(&charges)[0];
    let ended_ms = (charge["ended"].as_f64().unwrap() * 1000.0) as u64;
    let last = after["calls"]["last_at_ms"].as_u64().unwrap();
    assert!(
        last >= ended_ms && last > first,
        "quiet starts when the call ended ({ended_ms}), reported {last}"
    );
}

#[test]
fn a_failed_pause_is_undone_reported_and_not_tried_again() {
    let record = temp("failed-pause");
    let (composition, port) = with_control(
        "failed-pause",
        &[
            "agent/tests/components/halters/a",
            "agent/tests/components/halters/b",
        ],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("HALTER_FAIL_PAUSE", "b"),
            ("HALTER_PAUSE_MS", "600"),
        ],
    );
    composition.wait_ready();
    let port2 = port;
    let asked = std::thread::spawn(move || halt(port2, "h1"));
    // The status answers while the pause runs, without waiting for it.
    let pausing = status_until(port, Duration::from_secs(5), |s| s["phase"] == "pausing");
    assert_eq!(pausing["halt"], "h1");
    let (code, body) = asked.join().unwrap();
    assert_eq!(code, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("b") && message.contains("pause"),
        "{message}"
    );

    let after = status(port);
    assert_eq!(after["phase"], "running", "{after}");
    assert_eq!(after["failure"]["halt"], "h1");
    assert_eq!(after["failure"]["command"], "pause");
    let all = events(&record);
    assert_eq!(named(&all, "pause", "a").len(), 1);
    assert_eq!(named(&all, "pause-failed", "b").len(), 1);
    assert_eq!(named(&all, "resume", "a").len(), 1, "a's pause is undone");
    assert!(named(&all, "resume", "b").is_empty(), "b never paused");
    // The pulses run again.
    let ticks = count(&all, "tick");
    let deadline = Instant::now() + Duration::from_secs(5);
    while count(&events(&record), "tick") <= ticks + 2 {
        assert!(Instant::now() < deadline, "pulses did not start again");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The same halt is not tried again; a new one is.
    let (code, body) = halt(port, "h1");
    assert_eq!(code, 409, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not tried again"));
    assert_eq!(named(&events(&record), "pause-failed", "b").len(), 1);
    let (code, _) = halt(port, "h2");
    assert_eq!(code, 409);
    assert_eq!(named(&events(&record), "pause-failed", "b").len(), 2);
    assert_eq!(status(port)["failure"]["halt"], "h2");
}

#[test]
fn a_halt_runs_to_its_end_when_its_request_is_dropped() {
    use std::io::Write;
    let record = temp("dropped");
    let (composition, port) = with_control(
        "dropped",
        &[
            "agent/tests/components/halters/a",
            "agent/tests/components/halters/b",
        ],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("HALTER_PAUSE_MS", "800"),
        ],
    );
    composition.wait_ready();
    {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = r#"{"halt":"h1"}"#;
        write!(
            stream,
            "POST /control/halt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        status_until(port, Duration::from_secs(5), |s| s["phase"] == "pausing");
        // The caller gives up mid-pause.
    }
    let paused = status_until(port, Duration::from_secs(10), |s| s["phase"] == "paused");
    assert_eq!(paused["halt"], "h1");
    let all = events(&record);
    assert_eq!(named(&all, "pause", "a").len(), 1);
    assert_eq!(named(&all, "pause", "b").len(), 1);
    let (code, body) = resume(port, "h1");
    assert_eq!((code, body["phase"].as_str()), (200, Some("running")));
}

#[test]
fn a_halt_asked_for_while_starting_pauses_the_process_once_it_is_up() {
    let record = temp("starting");
    let (composition, port) = with_control(
        "starting",
        &["agent/tests/components/halters/a"],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("HALTER_PREFLIGHT_MS", "1500"),
        ],
    );
    let starting = status_until(port, Duration::from_secs(10), |_| true);
    assert_eq!(starting["phase"], "starting", "{starting}");
    let (code, body) = halt(port, "h1");
    assert_eq!(
        (code, body["phase"].as_str(), body["halt"].as_str()),
        (200, Some("starting"), Some("h1")),
        "{body}"
    );
    let paused = status_until(port, Duration::from_secs(15), |s| s["phase"] == "paused");
    assert_eq!(paused["halt"], "h1");
    composition.wait_ready();
    std::thread::sleep(Duration::from_millis(300)); // three pulse intervals
    let all = events(&record);
    assert_eq!(named(&all, "preflight", "a").len(), 1);
    assert_eq!(named(&all, "pause", "a").len(), 1);
    assert_eq!(count(&all, "tick"), 0, "pulses never started: {all:?}");
    let (code, body) = resume(port, "h1");
    assert_eq!((code, body["phase"].as_str()), (200, Some("running")));
    let deadline = Instant::now() + Duration::from_secs(5);
    while count(&events(&record), "tick") == 0 {
        assert!(
            Instant::now() < deadline,
            "pulses did not start after resume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
