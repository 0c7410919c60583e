//! `toa-agent compose` and `toa-agent call` as a user runs them, with real programs (Python).

mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{call_with, compose_once, control, count, events, free_port, Composition};

/// The README's first command, `toa-agent demo`: its flows give the seed's answers and it ends
/// by itself, drained.
#[test]
fn the_readmes_first_command_runs_the_seeds_flows() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .arg("demo")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the demo did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(status.success(), "{status}\n{out}");
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{out}"))
            .to_owned()
    };
    assert!(line("call 10:").contains(r#"{"reply":{"#), "{out}");
    assert!(
        line("call 11:").contains(r#""code":"TOO_MANY_REQUESTS""#),
        "{out}"
    );
    assert!(out.contains(r#""code":"RequestContract""#), "{out}");
    let mut tokens: Vec<u64> = out
        .lines()
        .filter(|l| l.contains(r#""submitted""#))
        .map(|l| {
            serde_json::from_str::<Value>(l.trim()).unwrap()["reply"]["token"]
                .as_u64()
                .unwrap()
        })
        .collect();
    tokens.sort_unstable();
    assert_eq!(
        tokens,
        [1, 2, 3],
        "three settlements, one token each: {out}"
    );
    let drained: Value = serde_json::from_str(
        line("partitions drained so far:")
            .split_once(": ")
            .unwrap()
            .1,
    )
    .unwrap();
    // The demo looks once, after 1.2 s: the pulse ran (how far it got depends on the machine).
    let partitions = drained["reply"].as_object().unwrap();
    assert!(
        !partitions.is_empty()
            && partitions
                .keys()
                .all(|p| p.parse::<u32>().is_ok_and(|p| p < 16)),
        "{out}"
    );
    assert!(out.contains("drained: dispose ran"), "{out}");
}

#[test]
fn the_seed_examples_run_end_to_end() {
    let composition = Composition::start(
        &[
            "examples/store.catalog",
            "examples/store.orders",
            "examples/notifications",
        ],
        &[],
    );
    composition.wait_ready();
    let ready = support::http_status(&format!("{}/readyz", composition.agent));
    assert_eq!(ready, 200);
    let request = "{ input: { customer: 'c1', product: 'a1' } }";
    for n in 1..=10 {
        let (ok, answer) = composition.call("store.catalog.appraise", request);
        assert!(ok, "appraisal {n}: {answer}");
        assert_eq!(answer["reply"]["product"], "a1");
    }
    let (ok, answer) = composition.call("store.catalog.appraise", request);
    assert!(!ok);
    assert_eq!(
        answer["error"]["code"], "TOO_MANY_REQUESTS",
        "the eleventh within a minute"
    );

    let (ok, answer) = composition.call("store.orders.settle", "{}");
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"]["submitted"], 2);

    // The pulse drains every partition on the only replica.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, answer) = composition.call("notifications.drained", "{}");
        if answer["reply"]
            .as_object()
            .is_some_and(|drained| drained.len() == 16)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pulse did not drain all 16 partitions: {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let (ok, answer) = composition.call("store.catalog.appraise", "{ input: { customer: 1 } }");
    assert!(!ok);
    assert_eq!(answer["error"]["code"], "RequestContract");
    assert_eq!(answer["error"]["number"], 202);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"product\" is a required property"),
        "{answer}"
    );
    let (_, answer) = composition.call("store.orders.settle", "{ input: {}, instance: someone }");
    assert_eq!(answer["error"]["code"], "RequestContract", "{answer}");

    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    assert!(log.contains("draining"), "{log}");
}

#[test]
fn lifecycle_runs_in_order_and_settle_can_call_its_own_operations() {
    let record = std::env::temp_dir().join(format!("toa-record-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let record_path = record.to_str().unwrap();
    let composition = Composition::start(
        &["agent/tests/components/recorder"],
        &[("TEST_RECORD", record_path), ("TOA_INSTANCE", "till-7")],
    );
    composition.wait_ready();
    let (ok, answer) = composition.call("test.recorder.echo", "{ input: { from: cli } }");
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"], json!({"from": "cli"}));
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    let events: Vec<Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["preflight", "echo", "settle", "ready", "echo", "dispose"],
        "{events:?}"
    );
    assert_eq!(
        events[2]["echo"],
        json!({"from": "settle"}),
        "settle called its own operation"
    );
    assert_eq!(
        events[3]["instance"], "till-7",
        "TOA_INSTANCE names the process"
    );
}

#[test]
fn a_start_that_cannot_succeed_stops_with_a_clear_error() {
    let output = compose_once(&["agent/tests/components/pauser"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("component pauser exports pause and no resume"),
        "{stderr}"
    );

    let output = compose_once(&["agent/tests/components/failing"], &[("RUST_LOG", "info")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("failing: preflight failed"), "{stderr}");
    assert!(!stderr.contains("Composition complete"), "{stderr}");
    // The program's own lines, told apart by its component's name.
    assert!(
        stderr.lines().any(|line| line.starts_with("failing | ")
            && line.contains("cannot reach the mail provider")),
        "{stderr}"
    );

    let output = compose_once(&["agent/tests/components/mistyped"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("`operations.hello.type` is effect, and its module exports a computation"),
        "{stderr}"
    );

    let output = compose_once(&["examples/store.catalog"], &[("TOA_INSTANCE", "till 7")]);
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("TOA_INSTANCE: expected 1 to 64 ASCII letters"),
        "{stderr}"
    );
}

#[test]
fn a_manifest_without_program_runs_its_modules_sdk_and_an_undeclared_module_is_named() {
    let sdk = support::root().join("sdk/python");
    let sdk = sdk.to_str().unwrap();
    let composition = Composition::start(
        &["agent/tests/components/programless"],
        &[("PYTHONPATH", sdk)],
    );
    composition.wait_ready();
    let (status, answer) = call_with(
        &composition.agent,
        "test.programless.hello",
        "",
        r#"{"input": {"name": "seed"}}"#,
    );
    assert_eq!((status, &answer["reply"]), (200, &json!({"hello": "seed"})));
    let log = composition.log();
    assert!(
        log.contains("its modules' SDK runs it") && log.contains(r#"["python3", "-m", "toa"]"#),
        "{log}"
    );
    let warned = log.lines().find(|line| line.contains("does not declare"));
    assert!(
        warned.is_some_and(|line| line.contains("stray") && line.contains("WARN")),
        "{log}"
    );
}

#[test]
fn without_a_context_file_the_defaults_and_the_application_name_are_said() {
    let elsewhere = std::env::temp_dir().join(format!("toa-no-context-{}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let pauser = support::root().join("agent/tests/components/pauser");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"));
    let output = support::without_cargos_variables(&mut command)
        .current_dir(&elsewhere)
        .env("RUST_LOG", "info")
        .arg("compose")
        .arg(&pauser)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warned = stderr
        .lines()
        .find(|line| line.contains("no context.toa.yaml here"));
    assert!(
        warned.is_some_and(|line| line.contains("WARN")
            && line.contains("named `local`")
            && line.contains(&*elsewhere.to_string_lossy())),
        "{stderr}"
    );
    // The suite's own runs, from the repository's root, read its context.toa.yaml: no warning.
    let output = compose_once(&["agent/tests/components/pauser"], &[("RUST_LOG", "info")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("no context.toa.yaml"), "{stderr}");
}

#[test]
fn a_compose_on_a_taken_address_says_where_it_serves_and_how_to_reach_it() {
    // Another process holds the address (a first compose, say).
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let second = Composition::start_at(port, &["examples/store.catalog"], &[]);
    second.wait_ready();
    let log = second.log();
    let warned = log.lines().find(|line| line.contains("address is taken"));
    let warned = warned.unwrap_or_else(|| panic!("no warning:\n{log}"));
    let serving = warned
        .split("--agent http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{warned}"));
    assert_ne!(serving, format!("127.0.0.1:{port}"), "{warned}");
    // The address it names is its own: its local API answers there.
    let (status, instance) = support::http_get(&format!("http://{serving}/v1/instance"));
    assert_eq!(status, 200, "{instance}");
    assert!(
        warned.contains("(without, they reach $TOA_AGENT or http://127.0.0.1:7090)"),
        "{warned}"
    );
}

#[test]
fn halt_pauses_and_resume_takes_back_in_the_same_process_only_with_the_token() {
    let record = std::env::temp_dir().join(format!("toa-poller-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let token_file = std::env::temp_dir().join(format!("toa-token-{}", std::process::id()));
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let port = free_port();
    let composition = Composition::start(
        &[
            "agent/tests/components/poller",
            "--control-listen",
            &format!("127.0.0.1:{port}"),
            "--control-token-file",
            token_file.to_str().unwrap(),
        ],
        &[("TEST_RECORD", record.to_str().unwrap())],
    );
    composition.wait_ready();
    let token = Some("s3cret-token");

    // Without the token, or with another, nothing happens.
    assert_eq!(control(port, "GET", "/control/status", None, "").0, 401);
    assert_eq!(
        control(
            port,
            "POST",
            "/control/halt",
            Some("guess"),
            r#"{"halt":"h1"}"#
        )
        .0,
        401
    );
    let (status, body) = control(port, "GET", "/control/status", token, "");
    assert_eq!((status, body["phase"].as_str()), (200, Some("running")));
    assert!(
        !composition.log().contains("s3cret"),
        "the token is never logged"
    );

    // Halt: pause runs once, pulses stop.
    let (status, body) = control(port, "POST", "/control/halt", token, r#"{"halt":"h1"}"#);
    assert_eq!(
        (status, body["phase"].as_str(), body["halt"].as_str()),
        (200, Some("paused"), Some("h1")),
        "{body}"
    );
    assert_eq!(body["calls"]["since_pause"], 0);
    let (_, again) = control(port, "POST", "/control/halt", token, r#"{"halt":"h1"}"#);
    assert_eq!(again["phase"], "paused");
    std::thread::sleep(Duration::from_millis(150)); // a tick in flight at the pause lands
    let ticks = count(&events(&record), "tick");
    std::thread::sleep(Duration::from_millis(600));
    let paused = events(&record);
    assert_eq!(count(&paused, "tick"), ticks, "no pulse while paused");
    assert_eq!(
        count(&paused, "pause"),
        1,
        "halting twice with one id pauses once"
    );

    // A call while paused is seen by the operator.
    let (ok, answer) = composition.call("test.poller.ping", "{}");
    assert!(ok, "calls are still served while paused: {answer}");
    let (_, body) = control(port, "GET", "/control/status", token, "");
    assert_eq!(body["calls"]["since_pause"], 1, "{body}");
    assert!(body["calls"]["last_at_ms"].as_u64().is_some());

    // Resume: only for the halt it paused for; the same process takes back, pulses restart.
    assert_eq!(
        control(port, "POST", "/control/resume", token, r#"{"halt":"h2"}"#).0,
        409
    );
    let (status, body) = control(port, "POST", "/control/resume", token, r#"{"halt":"h1"}"#);
    assert_eq!((status, body["phase"].as_str()), (200, Some("running")));
    let deadline = Instant::now() + Duration::from_secs(5);
    while count(&events(&record), "tick") <= ticks {
        assert!(
            Instant::now() < deadline,
            "pulses did not start again after resume"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = events(&record);
    assert_eq!(count(&all, "resume"), 1);
    assert_eq!(count(&all, "preflight"), 1, "resume is not a restart");
    let pids: std::collections::HashSet<u64> =
        all.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 1, "one process throughout, with its state");
    assert_eq!(
        control(port, "POST", "/control/halt", token, "{not json").0,
        400
    );

    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    assert_eq!(count(&events(&record), "dispose"), 1);
}

#[test]
fn the_rust_terminals_example_speaks_the_same_protocol() {
    let composition = Composition::start(&["examples/terminals"], &[("TOA_INSTANCE", "till-1")]);
    composition.wait_ready();
    let (ok, answer) = composition.call("terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"]["holder"], "till-1");
    let (ok, answer) = composition.call(
        "terminals.charge",
        "{ input: { terminal: t1, amount: 5 }, instance: till-1 }",
    );
    assert!(ok, "{answer}");
    assert_eq!(answer["reply"], json!({"charged": 5, "by": "till-1"}));
    let (_, answer) = composition.call(
        "terminals.charge",
        "{ input: { terminal: t2, amount: 5 }, instance: till-1 }",
    );
    assert_eq!(
        answer["error"]["code"], "NOT_HELD",
        "the operation's own error passes through"
    );
    let (_, answer) = composition.call(
        "terminals.charge",
        "{ input: { terminal: t1, amount: 5 }, instance: till-9 }",
    );
    assert_eq!(
        (
            answer["error"]["code"].as_str(),
            answer["error"]["number"].as_u64()
        ),
        (Some("Addressee"), Some(403))
    );
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
}

#[test]
fn the_run_commands_of_one_phase_run_at_once() {
    let record = std::env::temp_dir().join(format!("toa-sleepers-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let composition = Composition::start(
        &[
            "agent/tests/components/sleepers/a",
            "agent/tests/components/sleepers/b",
        ],
        &[("TEST_RECORD", record.to_str().unwrap())],
    );
    composition.wait_ready();
    let runs = events(&record);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (a, b) = (&runs[0], &runs[1]);
    let overlap = a["from"].as_f64() < b["to"].as_f64() && b["from"].as_f64() < a["to"].as_f64();
    assert!(
        overlap,
        "preflight of both components ran one after the other: {runs:?}"
    );
}

#[test]
fn attached_programs_started_by_someone_else_are_served_and_left_running() {
    // As in a pod: the program runs in its own container, started before the agent, on the port
    // the operator gives it; the agent attaches to it instead of starting it.
    let (program_port, agent_port) = (free_port(), free_port());
    let mut program = std::process::Command::new("python3")
        .arg("../python/run.py")
        .current_dir(support::root().join("examples/store.catalog"))
        .env("TOA_PORT", program_port.to_string())
        .env("TOA_AGENT", format!("http://127.0.0.1:{agent_port}"))
        .env("TOA_COMPONENT", "store.catalog")
        .env("TOA_INSTANCE", "pod-1")
        .spawn()
        .unwrap();
    let composition = Composition::start_at(
        agent_port,
        &[
            "examples/store.catalog",
            "--attach",
            &program_port.to_string(),
        ],
        &[],
    );
    composition.wait_ready();
    let (ok, answer) = composition.call(
        "store.catalog.appraise",
        "{ input: { customer: c1, product: a1 } }",
    );
    assert!(ok, "{answer}");
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    assert!(
        program.try_wait().unwrap().is_none(),
        "an attached program is not the agent's to stop"
    );
    program.kill().unwrap();
    program.wait().unwrap();
}

#[test]
fn drain_returns_once_dispose_ran_and_the_composition_stops() {
    let record = std::env::temp_dir().join(format!("toa-drain-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let mut composition = Composition::start(
        &["agent/tests/components/recorder"],
        &[("TEST_RECORD", record.to_str().unwrap())],
    );
    composition.wait_ready();
    let drained = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .args(["drain", "--agent", &composition.agent])
        .output()
        .unwrap();
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let names = support::event_names(&record);
    assert_eq!(
        names.last().map(String::as_str),
        Some("dispose"),
        "dispose ran before drain returned: {names:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while composition.exited().is_none() {
        assert!(
            Instant::now() < deadline,
            "compose did not stop after the drain:\n{}",
            composition.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(composition.exited(), Some(true));
}

#[test]
fn probes_and_metrics_on_their_own_port_answer_without_a_token_and_serve_nothing_else() {
    let probe_port = free_port();
    let composition = Composition::start(
        &[
            "examples/store.catalog",
            "--probe-listen",
            &format!("127.0.0.1:{probe_port}"),
        ],
        &[],
    );
    composition.wait_ready();
    let probe = |path: &str| support::http_status(&format!("http://127.0.0.1:{probe_port}{path}"));
    assert_eq!(probe("/healthz"), 200);
    assert_eq!(probe("/readyz"), 200, "ready after `ready` ran");
    assert_eq!(
        probe("/v1/instance"),
        404,
        "the local API stays on loopback"
    );
    assert_eq!(probe("/control/status"), 404);
    // The metrics Prometheus scrapes: the component's series, without a token.
    let (status, metrics) = support::http_get(&format!("http://127.0.0.1:{probe_port}/metrics"));
    assert_eq!(status, 200);
    assert!(
        metrics.contains("toa_meter_calls_total{application=\"shop\",group=\"store.catalog\"} 0"),
        "{metrics}"
    );
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
}

/// In a pod the context is the operator's `TOA_*` variables, and the process is a pod: without
/// atomicity nothing coordinates in-process; with it, the keys are the named application's.
#[test]
fn a_pods_context_comes_from_its_variables() {
    let record = std::env::temp_dir().join(format!("toa-pod-vars-{}", std::process::id()));
    let meter = |composition: &Composition| {
        let output = std::process::Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/stderr",
                "-w",
                "%{http_code}",
                "-X",
                "POST",
            ])
            .args(["-H", "content-type: application/json"])
            .args(["-d", r#"{"keys": ["k"], "deltas": [60000]}"#])
            .arg(format!("{}/v1/test.recorder/meter", composition.agent))
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let application = format!("pod-vars-{}", std::process::id());
    let without = Composition::start(
        &["agent/tests/components/recorder"],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("TOA_APPLICATION", &application),
            ("TOA_KUBERNETES_NAMESPACE", "test"),
        ],
    );
    without.wait_ready();
    let (status, body) = meter(&without);
    assert_eq!(status, "501", "{body}");
    assert!(body.contains("REQUIRES_ATOMICITY"), "{body}");
    drop(without);

    let with = Composition::start(
        &["agent/tests/components/recorder"],
        &[
            ("TEST_RECORD", record.to_str().unwrap()),
            ("TOA_APPLICATION", &application),
            ("TOA_KUBERNETES_NAMESPACE", "test"),
            ("TOA_ATOMICITY_REDIS", "redis://127.0.0.1:6379"),
        ],
    );
    with.wait_ready();
    let (status, body) = meter(&with);
    assert_eq!(status, "200", "{body}");
    let keys = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "--scan", "--pattern"])
        .arg(format!("*{application}*"))
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&keys.stdout);
    // In a pod the application's keys carry its Kubernetes namespace.
    let prefix = format!("toa:test/{application}:test.recorder:");
    assert!(
        keys.lines().any(|k| k.starts_with(&prefix)),
        "no key of {application} in the shared Redis: {keys:?}"
    );

    // A bad variable stops the start with its name.
    let output = compose_once(
        &["agent/tests/components/recorder"],
        &[
            ("TOA_APPLICATION", &application),
            ("TOA_KUBERNETES_NAMESPACE", "test"),
            ("TOA_ATOMICITY_REDIS", "redis://a:6379,redis://b:6379"),
        ],
    );
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("Atomicity takes an odd number of addresses, 2 given."),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // A broker without both credentials: guest/guest is for local runs, not for a pod.
    for password in [None, Some("p4ssw0rd-value")] {
        let mut vars = vec![
            ("TOA_APPLICATION", application.as_str()),
            ("TOA_KUBERNETES_NAMESPACE", "test"),
            ("TOA_AMQP", "amqp://127.0.0.1:5672"),
        ];
        vars.extend(password.map(|p| ("TOA_AMQP_PASSWORD", p)));
        let output = compose_once(&["agent/tests/components/recorder"], &vars);
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{said}");
        assert!(
            said.contains("`TOA_AMQP_USERNAME`, `TOA_AMQP_PASSWORD`: in a pod"),
            "{said}"
        );
        assert!(!said.contains("p4ssw0rd-value"), "{said}");
    }

    // Without its Kubernetes namespace a pod's names could meet another namespace's.
    for namespace in [None, Some("")] {
        let mut vars = vec![("TOA_APPLICATION", application.as_str())];
        vars.extend(namespace.map(|n| ("TOA_KUBERNETES_NAMESPACE", n)));
        let output = compose_once(&["agent/tests/components/recorder"], &vars);
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{said}");
        assert!(
            said.contains("`TOA_KUBERNETES_NAMESPACE`: in a pod"),
            "{said}"
        );
    }
}

#[test]
fn a_timeout_past_the_brokers_limit_or_a_bad_instance_is_refused_not_a_crash() {
    // i64::MAX as a timeout and a 300-character instance once panicked the handler (no answer at
    // all); they are contract refusals, and the agent answers on.
    let composition = Composition::start(&["examples/terminals"], &[("TOA_INSTANCE", "till-1")]);
    composition.wait_ready();
    let long = "x".repeat(300);
    for (request, says) in [
        (
            format!(
                "{{ input: {{ terminal: t1, amount: 5 }}, instance: till-1, timeout: {} }}",
                i64::MAX
            ),
            "expected a timeout of at most 4294967295 ms",
        ),
        (
            format!("{{ input: {{ terminal: t1, amount: 5 }}, instance: {long} }}"),
            "`instance`: expected 1 to 64 ASCII letters",
        ),
    ] {
        let (ok, answer) = composition.call("terminals.charge", &request);
        assert!(!ok, "{answer}");
        assert_eq!(answer["error"]["code"], "RequestContract", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{answer}");
    }
    let (ok, answer) = composition.call("terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok, "{answer}");
}

/// A call to one process with 25 ms or less left is not started in-process either (the callee's
/// margin, docs/calls.md): `Abandoned`; with time enough the same call runs.
#[test]
fn an_in_process_call_with_no_time_to_start_is_abandoned_and_one_with_time_runs() {
    let composition = Composition::start(&["examples/terminals"], &[("TOA_INSTANCE", "till-1")]);
    composition.wait_ready();
    let (ok, answer) = composition.call("terminals.connect", "{ input: { terminal: t1 } }");
    assert!(ok, "{answer}");
    let charge = |timeout: u32| {
        format!("{{ input: {{ terminal: t1, amount: 5 }}, instance: till-1, timeout: {timeout} }}")
    };
    let (ok, answer) = composition.call("terminals.charge", &charge(20));
    assert!(!ok, "{answer}");
    assert_eq!(answer["error"]["code"], "Abandoned", "{answer}");
    let (ok, answer) = composition.call("terminals.charge", &charge(5000));
    assert!(ok, "{answer}");
}

#[test]
fn the_python_helpers_onassigned_hears_the_assignment_until_off() {
    let record = std::env::temp_dir().join(format!("toa-assigned-{}", std::process::id()));
    let _ = std::fs::remove_file(&record);
    let composition = Composition::start(
        &["agent/tests/components/assigned"],
        &[("TEST_RECORD", record.to_str().unwrap())],
    );
    composition.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(10);
    while events(&record).is_empty() {
        assert!(Instant::now() < deadline, "no assignment heard");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A local run: one replica owns every slot.
    let first = &events(&record)[0];
    assert_eq!(first["event"], "assigned");
    assert_eq!(first["assignment"]["n"], 1, "{first}");
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
    assert_eq!(events(&record).last().unwrap()["event"], "off");
}

/// The agent's logs as a log pipeline reads them: `TOA_LOG_FORMAT=json` (`--log-format`) writes
/// one JSON object a line, `TOA_LOG_LEVEL=warn` leaves the info events out, and a value neither
/// flag takes stops the start, naming the flag.
#[test]
fn the_agents_logs_come_at_the_level_and_in_the_format_asked() {
    let run = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.extend([("RUST_LOG", ""), ("TOA_INSTANCE", "logs")]);
        let composition = Composition::start(&["agent/tests/components/terminals"], &env);
        // Served: a call is answered (whatever the log says).
        let url = format!("{}/metrics", composition.agent);
        let deadline = Instant::now() + Duration::from_secs(30);
        while support::http_get_or_none(&url) != Some(200)
            || call_with(
                &composition.agent,
                "test.terminals.pid",
                "",
                r#"{"instance":"logs"}"#,
            )
            .0 != 200
        {
            assert!(Instant::now() < deadline, "{}", composition.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        // Drained: whatever it logs on the way up and down is in the log by then.
        let (stopped, log) = composition.terminate(Duration::from_secs(30));
        assert!(stopped, "{log}");
        log
    };
    // The agent's own lines (the program's come prefixed with its component's name).
    let agents = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|line| line.contains("toa_agent"))
            .map(str::to_owned)
            .collect()
    };
    let json = run(&[("TOA_LOG_FORMAT", "json")]);
    let events: Vec<Value> = agents(&json)
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(
        events
            .iter()
            .all(|e| e["timestamp"].is_string() && e["target"].is_string()),
        "{json}"
    );
    let complete = events
        .iter()
        .find(|e| e["message"] == "Composition complete");
    assert_eq!(
        complete.map(|e| &e["level"]),
        Some(&json!("INFO")),
        "{json}"
    );
    let quiet = run(&[("TOA_LOG_LEVEL", "warn")]);
    assert!(!quiet.contains("Composition complete"), "{quiet}");
    assert!(
        !agents(&quiet).iter().any(|line| line.contains(" INFO ")),
        "{quiet}"
    );
    for (flag, bad) in [("--log-format", "xml"), ("--log-level", "loud")] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
            .args([&format!("{flag}={bad}"), "call", "a.b.c"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains(&format!("invalid value '{bad}' for '{flag}")),
            "{said}"
        );
    }
}

/// Each operation's runs are counted by outcome and timed: `toa_operations_total` and
/// `toa_operation_duration_seconds` on `/metrics`, one series per operation.
#[test]
fn the_runs_of_each_operation_are_counted_by_outcome_and_timed() {
    let composition = Composition::start(
        &["agent/tests/components/terminals"],
        &[("TOA_INSTANCE", "counted")],
    );
    composition.wait_ready();
    let call = |operation: &str, body: &str| {
        let target = format!("test.terminals.{operation}");
        call_with(&composition.agent, &target, "", body)
    };
    for _ in 0..2 {
        assert_eq!(call("pid", r#"{"instance":"counted"}"#).0, 200);
    }
    let unheld = r#"{"input":{"terminal":"t9","amount":1},"instance":"counted"}"#;
    let (_, refused) = call("charge", unheld);
    assert_eq!(
        refused["error"]["code"], "NOT_HELD",
        "one of its errors: {refused}"
    );
    let (status, failed) = call("note", r#"{"input":{"id":1,"fail":true}}"#);
    assert_ne!(status, 200, "the program raised: {failed}");
    let (status, metrics) = support::http_get(&format!("{}/metrics", composition.agent));
    assert_eq!(status, 200);
    let series = |name: &str, labels: &str| {
        let line = metrics
            .lines()
            .find(|line| line.starts_with(name) && line.contains(labels));
        line.and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let runs = |operation: &str, outcome: &str| {
        let labels =
            format!(r#"group="test.terminals",operation="{operation}",outcome="{outcome}"}}"#);
        series("toa_operations_total{", &labels)
    };
    assert_eq!(runs("pid", "ok"), Some(2.0), "{metrics}");
    assert_eq!(runs("charge", "error"), Some(1.0), "{metrics}");
    assert_eq!(runs("note", "failed"), Some(1.0), "{metrics}");
    let timed = r#"group="test.terminals",operation="pid"}"#;
    assert_eq!(
        series("toa_operation_duration_seconds_count{", timed),
        Some(2.0),
        "{metrics}"
    );
    let (stopped, log) = composition.terminate(Duration::from_secs(20));
    assert!(stopped, "{log}");
}
