//! Traces: a call from a program through its agent, the broker and another agent to the program
//! that runs it is one trace, its spans exported over OTLP/HTTP to a receiver of the test's own
//! (agent/tests/otlp_receiver.py, which decodes them with the OpenTelemetry project's generated
//! messages), and one handed through the local group of two processes. Needs RabbitMQ on 127.0.0.1:5672 and python3 with opentelemetry-proto
//! (scripts/services installs both).

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{broker_context, call_with, free_port, root, Composition};

/// The receiver, and the spans it printed.
struct Receiver {
    child: Child,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start(port: u16) -> Self {
        let mut child = Command::new("python3")
            .arg(root().join("agent/tests/otlp_receiver.py"))
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok);
        assert_eq!(
            first.as_deref(),
            Some("listening"),
            "the receiver did not start"
        );
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let span: Value = serde_json::from_str(&line).unwrap();
                kept.lock().unwrap().push(span);
            }
        });
        Self { child, spans }
    }

    /// The spans of `trace` once there are `count` of them (within 20 s), in order of start.
    fn trace(&self, trace: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            assert!(
                !spans.iter().any(|span| span.get("error").is_some()),
                "the receiver could not decode a request: {spans:?}"
            );
            let mut of_trace: Vec<Value> =
                spans.into_iter().filter(|s| s["trace"] == trace).collect();
            if of_trace.len() >= count {
                of_trace.sort_by_key(|span| span["start"].as_u64());
                return of_trace;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {count} spans of {trace}: {of_trace:?}",
                of_trace.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLERS_SPAN: &str = "00f067aa0ba902b7";
/// A second trace, of a call the local group's first process makes alone.
const ALONE_TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4737";

#[test]
fn one_call_across_two_agents_is_one_trace_with_its_spans_in_order() {
    let port = free_port();
    let receiver = Receiver::start(port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let (context, _application, _queues) = broker_context("traces", "amqp://127.0.0.1:5672");
    let record = std::env::temp_dir().join(format!("toa-traces-{}", std::process::id()));
    let exporting = |instance: &'static str| {
        vec![
            ("TOA_INSTANCE", instance.to_owned()),
            ("TEST_RECORD", record.to_str().unwrap().to_owned()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
        ]
    };
    let start = |component: &str, instance| {
        let env = exporting(instance);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let composition =
            Composition::start(&[component, "--context", context.to_str().unwrap()], &env);
        composition.wait_ready();
        composition
    };
    let callee = start("agent/tests/components/terminals", "till-a");
    let caller = start("agent/tests/components/recorder", "caller");
    let headers =
        format!("traceparent: 00-{TRACE}-{CALLERS_SPAN}-01\r\ntracestate: congo=t61rcWkgMzE\r\n");
    connect(&caller, &headers, "t1");

    let spans = receiver.trace(TRACE, 3);
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "call test.terminals.connect",
            "receive test.terminals",
            "operate test.terminals.connect"
        ],
        "{spans:?}"
    );
    let [call, receive, operate] = &spans[..] else {
        unreachable!()
    };
    // Each the child of the one before; the first, of the program's span that made the call.
    assert_eq!(call["parent"], CALLERS_SPAN);
    assert_eq!(receive["parent"], call["span"]);
    assert_eq!(operate["parent"], receive["span"]);
    // Server, consumer, client; where each ran; the vendors' state passed on.
    let kinds: Vec<u64> = spans.iter().map(|s| s["kind"].as_u64().unwrap()).collect();
    assert_eq!(kinds, [2, 5, 3]);
    let instances: Vec<&str> = spans
        .iter()
        .map(|s| s["instance"].as_str().unwrap())
        .collect();
    assert_eq!(instances, ["caller", "till-a", "till-a"]);
    assert!(spans
        .iter()
        .all(|s| s["state"] == "congo=t61rcWkgMzE" && s["service"] == "toa-agent"));
    // Real times (a mis-encoded fixed64 would read as 0), nested: one machine's clock.
    for span in &spans {
        let (start, end) = (
            span["start"].as_u64().unwrap(),
            span["end"].as_u64().unwrap(),
        );
        assert!(start > 1_700_000_000_000_000_000 && start <= end, "{span}");
        assert_eq!(span["status"], 0, "an answered call is no failure: {span}");
    }
    // `receive` goes on past the reply to the acknowledgement, which may end after the caller
    // has its answer: only the program's run is sure to end before the call does.
    assert!(call["end"].as_u64() >= operate["end"].as_u64(), "{spans:?}");
    assert!(
        receive["end"].as_u64() >= operate["end"].as_u64(),
        "{spans:?}"
    );

    // A declared error is an answer: no failure, its code an attribute of `call` and `operate`.
    let declared = "22222222222222222222222222222222";
    let headers = format!("traceparent: 00-{declared}-{CALLERS_SPAN}-01\r\n");
    let body = r#"{"input": {"terminal": "t9", "amount": 1}, "instance": "till-a"}"#;
    let (_, answer) = call_with(&caller.agent, "test.terminals.charge", &headers, body);
    assert_eq!(answer["error"]["code"], "NOT_HELD", "{answer}");
    let spans = receiver.trace(declared, 3);
    assert!(spans.iter().all(|s| s["status"] == 0), "{spans:?}");
    let errors: Vec<&Value> = spans
        .iter()
        .map(|s| &s["attributes"]["toa.error"])
        .collect();
    assert_eq!(
        errors,
        [
            &Value::from("NOT_HELD"),
            &Value::Null,
            &Value::from("NOT_HELD")
        ]
    );

    // Without a trace, the caller's agent starts one.
    connect(&caller, "", "t2");
    let root = wait_for(&receiver, |s| {
        s["name"] == "call test.terminals.connect" && s["parent"] == ""
    });
    let rooted = receiver.trace(root["trace"].as_str().unwrap(), 3);
    assert_eq!(rooted[1]["parent"], rooted[0]["span"], "{rooted:?}");

    // A caller that does not sample its trace: nothing recorded of it, the call served.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let headers = format!("traceparent: 00-{unsampled}-b7ad6b7169203331-00\r\n");
    connect(&caller, &headers, "t3");
    // A sampled call after it: once its spans are in (each agent exports in order), none of the
    // unsampled one came before.
    let after = "11111111111111111111111111111111";
    let headers = format!("traceparent: 00-{after}-{CALLERS_SPAN}-01\r\n");
    connect(&caller, &headers, "t4");
    receiver.trace(after, 3);
    let recorded = receiver.spans.lock().unwrap().clone();
    assert!(
        !recorded.iter().any(|s| s["trace"] == unsampled),
        "{recorded:?}"
    );
    drop(callee);
}

/// `test.terminals.connect` of `terminal` through `caller`'s local API, with `headers`: answered.
fn connect(caller: &Composition, headers: &str, terminal: &str) {
    let body = format!(r#"{{"input": {{"terminal": "{terminal}"}}}}"#);
    let (status, answer) = call_with(&caller.agent, "test.terminals.connect", headers, &body);
    assert_eq!(status, 200, "{answer}\n{}", caller.log());
}

/// The first span `accept` takes, within 20 s.
fn wait_for(receiver: &Receiver, accept: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(span) = receiver.spans.lock().unwrap().iter().find(|s| accept(s)) {
            return span.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no such span: {:?}",
            receiver.spans.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two `compose` processes of one local group (no broker): a call handed from one to the other
/// is one trace, `call` and `hand` in the first, `run` and `operate` in the second; before the
/// second joined, the first's call had no `hand`.
#[test]
fn a_call_handed_through_the_local_group_is_one_trace() {
    let port = free_port();
    let receiver = Receiver::start(port);
    let endpoint = format!("http://127.0.0.1:{port}");
    let scratch = std::env::temp_dir().join(format!("toa-traces-group-{}", std::process::id()));
    let runtime = scratch.join("run");
    let group = format!("traces-{}", std::process::id());
    let record = scratch.join("record");
    let member = |instance: &str| {
        let env = [
            ("TOA_ALONE", "false"),
            ("TOA_LOCAL_GROUP", group.as_str()),
            ("TOA_RUNTIME_DIR", runtime.to_str().unwrap()),
            ("TOA_INSTANCE", instance),
            ("TEST_RECORD", record.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ];
        let composition = Composition::start(&["agent/tests/components/terminals"], &env);
        composition.wait_ready();
        composition
    };
    let first = member("first");
    // Alone in the group, the first process runs its own component's calls without handing them
    // to itself: no `hand` span.
    let alone = format!("traceparent: 00-{ALONE_TRACE}-{CALLERS_SPAN}-01\r\n");
    connect(&first, &alone, "t1");
    let spans = receiver.trace(ALONE_TRACE, 2);
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "call test.terminals.connect",
            "operate test.terminals.connect"
        ]
    );
    let second = member("second");
    let headers =
        format!("traceparent: 00-{TRACE}-{CALLERS_SPAN}-01\r\ntracestate: congo=t61rcWkgMzE\r\n");
    let body = r#"{"instance": "second"}"#;
    let (status, answer) = call_with(&first.agent, "test.terminals.pid", &headers, body);
    assert_eq!(status, 200, "{answer}\n{}", first.log());

    let spans = receiver.trace(TRACE, 4);
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "call test.terminals.pid",
            "hand test.terminals.pid",
            "run test.terminals.pid",
            "operate test.terminals.pid"
        ],
        "{spans:?}"
    );
    let parents: Vec<&Value> = spans.iter().map(|s| &s["parent"]).collect();
    let callers = Value::from(CALLERS_SPAN);
    let mut expected = vec![&callers];
    expected.extend(spans[..3].iter().map(|s| &s["span"]));
    assert_eq!(parents, expected, "each the child of the one before");
    let instances: Vec<&str> = spans
        .iter()
        .map(|s| s["instance"].as_str().unwrap())
        .collect();
    assert_eq!(instances, ["first", "first", "second", "second"]);
    assert!(
        spans.iter().all(|s| s["state"] == "congo=t61rcWkgMzE"),
        "the vendors' state through the hand-over: {spans:?}"
    );
    drop((first, second));
    let _ = std::fs::remove_dir_all(&scratch);
}
