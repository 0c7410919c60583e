//! Declarations picked up without a restart, and the seed's two sentences on cancelling a call
//! (closing its request): cancelled while the component is still being looked up, it is made
//! nowhere; cancelled after it was sent, it stays in line until its timeout and may still run.

mod support;

use futures::StreamExt;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{broker_context, Composition};

const BROKER: &str = "amqp://127.0.0.1:5672";

struct Setup {
    application: String,
    context: PathBuf,
    declarations: PathBuf,
    record: PathBuf,
    _queues: support::rabbit::Queues,
}

fn setup(name: &str) -> Setup {
    let (context, application, queues) = broker_context(name, BROKER);
    let declarations = std::env::temp_dir().join(format!("toa-declarations-{application}"));
    let _ = std::fs::remove_dir_all(&declarations);
    std::fs::create_dir_all(&declarations).unwrap();
    let record = std::env::temp_dir().join(format!("toa-charges-{application}"));
    let _ = std::fs::remove_file(&record);
    Setup {
        application,
        context,
        declarations,
        record,
        _queues: queues,
    }
}

fn terminals(setup: &Setup, instance: &str, extra: &[(&str, &str)]) -> Composition {
    let mut env = vec![
        ("TOA_INSTANCE", instance),
        ("TEST_RECORD", setup.record.to_str().unwrap()),
        ("TOA_DECLARATIONS", setup.declarations.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    let composition = Composition::start(
        &[
            "agent/tests/components/terminals",
            "--context",
            setup.context.to_str().unwrap(),
        ],
        &env,
    );
    composition.wait_ready();
    composition
}

/// Declares `test.ghost` with `ping`, stateful or not.
fn declare_ghost(dir: &Path, stateful: bool) {
    std::fs::write(
        dir.join("test.ghost.yaml"),
        format!("name: ghost\nnamespace: test\noperations:\n  ping:\n    stateful: {stateful}\n"),
    )
    .unwrap();
}

async fn call(agent: &str, target: &str, body: Value) -> (u16, Value) {
    let (component, operation) = target.rsplit_once('.').unwrap();
    let response = reqwest::Client::new()
        .post(format!("{agent}/v1/call/{component}/{operation}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Makes the call and closes its request after `after`.
async fn cancel_after(agent: &str, target: &str, body: Value, after: Duration) {
    let closed = tokio::time::timeout(after, call(agent, target, body)).await;
    assert!(
        closed.is_err(),
        "the call ended before it was cancelled: {closed:?}"
    );
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_change_without_a_restart() {
    let setup = setup("declared");
    declare_ghost(&setup.declarations, false);
    let caller = terminals(&setup, "till-1", &[]);
    let ping = json!({"input": {}, "instance": "g-1"});
    // Ordinary: naming an instance breaks the contract, nothing is sent.
    let (status, answer) = call(&caller.agent, "test.ghost.ping", ping.clone()).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (400, &json!("RequestContract")),
        "{answer}"
    );
    // Redeclared stateful: the same call passes the contract; nobody holds g-1.
    declare_ghost(&setup.declarations, true);
    wait_until(
        "the new declarations are used",
        Duration::from_secs(10),
        || async {
            let (_, answer) = call(&caller.agent, "test.ghost.ping", ping.clone()).await;
            answer["error"]["code"] == "Addressee"
        },
    )
    .await;
    assert!(caller.log().contains("declarations"), "{}", caller.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_its_component_is_looked_up_is_made_nowhere() {
    let setup = setup("lookup");
    let caller = terminals(&setup, "till-1", &[]);
    // The test holds the name g-1 of the not yet declared `test.ghost`: whatever is sent to it
    // arrives here.
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let queue = format!("toa.{}.test.ghost@g-1", setup.application);
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut received = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let ping = |n: u32| json!({"input": {"n": n}, "instance": "g-1", "timeout": 5000});

    // Nobody declared test.ghost yet: the call waits for its declarations, and is closed.
    cancel_after(
        &caller.agent,
        "test.ghost.ping",
        ping(1),
        Duration::from_millis(500),
    )
    .await;
    declare_ghost(&setup.declarations, true);
    // A call made now is sent (so the queue would have shown the first one too).
    cancel_after(
        &caller.agent,
        "test.ghost.ping",
        ping(2),
        Duration::from_millis(2500),
    )
    .await;
    let first = tokio::time::timeout(Duration::from_secs(5), received.next())
        .await
        .expect("the call made after the declarations appeared arrived")
        .unwrap()
        .unwrap();
    let body: Value = serde_json::from_slice(&first.data).unwrap();
    assert_eq!(body["input"]["n"], 2, "the cancelled call was made: {body}");
    let more = tokio::time::timeout(Duration::from_millis(1500), received.next()).await;
    assert!(more.is_err(), "something else arrived: {more:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_wait_was_cancelled_stays_in_line_and_may_still_run() {
    let setup = setup("cancelled");
    // One call at a time: the second waits in the queue behind the first.
    let till = terminals(&setup, "till-1", &[("TOA_PREFETCH", "1")]);
    let (status, _) = call(
        &till.agent,
        "test.terminals.connect",
        json!({"input": {"terminal": "t1"}}),
    )
    .await;
    assert_eq!(status, 200);
    let charge = |amount: u32, sleep_ms: u32| json!({"input": {"terminal": "t1", "amount": amount, "sleep_ms": sleep_ms}, "instance": "till-1", "timeout": 5000});
    let agent = till.agent.clone();
    let slow =
        tokio::spawn(async move { call(&agent, "test.terminals.charge", charge(1, 1500)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Queued behind the slow one; its caller gives up after 300 ms.
    cancel_after(
        &till.agent,
        "test.terminals.charge",
        charge(2, 0),
        Duration::from_millis(300),
    )
    .await;
    let (_, answer) = slow.await.unwrap();
    assert_eq!(answer["reply"]["charged"], 1, "{answer}");
    let record = setup.record.clone();
    wait_until(
        "the cancelled call ran after all",
        Duration::from_secs(10),
        || {
            let record = record.clone();
            async move {
                std::fs::read_to_string(&record)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .any(|c| c["amount"] == 2)
            }
        },
    )
    .await;
}
