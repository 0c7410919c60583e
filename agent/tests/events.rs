//! Events from stored writes (DESIGN 18) over the tests' RabbitMQ and PostgreSQL: a stored
//! change's events leave through the outbox, and the events of a process that stopped between
//! its commits and their publication are published by another replica's relay; the record of
//! what reached a queue of the test's own (bound to every label) is checked afterwards.

mod support;

use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use support::{call_with, Composition};

const ORDERS: &str = "agent/tests/components/orders-events";
/// The orders with an event whose condition the program keeps.
const CONDITIONAL: &str = "agent/tests/components/orders-conditional";
/// The events' lease (agent/src/entities/store.rs), as docs/events.md states it.
const LEASE: Duration = Duration::from_secs(5);
const BROKER: &str = "amqp://127.0.0.1:5672";
const STORAGE: &str = "storage: postgres://127.0.0.1:5432/toa\n";
const LOGIN: [(&str, &str); 2] = [
    ("TOA_STORAGE_USERNAME", "toa"),
    ("TOA_STORAGE_PASSWORD", "toa"),
];

/// A queue of the test's own bound to every event of `application`: what reaches it.
async fn listen(application: &str) -> (lapin::Connection, lapin::Consumer) {
    use lapin::options::{BasicConsumeOptions, ExchangeDeclareOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    // As the agents declare it: a durable topic exchange.
    let exchange = format!("toa.{application}#events");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let topic = lapin::ExchangeKind::Topic;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            topic,
            durable,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare("".into(), exclusive, FieldTable::default())
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.name().as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            Default::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let no_ack = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let consumer = channel
        .basic_consume(
            queue.name().as_str().into(),
            "".into(),
            no_ack,
            FieldTable::default(),
        )
        .await
        .unwrap();
    (connection, consumer)
}

/// What reached the queue: each message's id, how often, and its payload; until `expected`
/// distinct ids came (or 30 s passed), and for a lease and 1.5 s more, so that a copy (a relay
/// publishes only after the lease) or an event of a write that was not stored would be seen too.
async fn received(
    consumer: &mut lapin::Consumer,
    expected: usize,
) -> (BTreeMap<String, (usize, Value)>, Instant) {
    let mut seen: BTreeMap<String, (usize, Value)> = BTreeMap::new();
    let mut last = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_until: Option<Instant> = None;
    loop {
        let until = quiet_until.unwrap_or(deadline).min(deadline);
        let wait = until.saturating_duration_since(Instant::now());
        let Ok(Some(Ok(delivery))) = tokio::time::timeout(wait, consumer.next()).await else {
            return (seen, last);
        };
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .to_string();
        let payload: Value = serde_json::from_slice(&delivery.data).unwrap();
        let label = delivery.routing_key.to_string();
        assert!(id.starts_with(&label), "{id} published as {label}");
        seen.entry(id).or_insert((0, payload)).0 += 1;
        last = Instant::now();
        if seen.len() >= expected && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + LEASE + Duration::from_millis(1500));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stored_change_is_published_once_even_when_its_committer_stops_before_publishing() {
    let (context, application, _queues) = support::broker_context_with("events", BROKER, STORAGE);
    let context = context.display().to_string();
    let (_connection, mut consumer) = listen(&application).await;
    // `held` stores its writes and publishes nothing (neither itself nor by its relay), as a
    // process that stops right after its commits; `relaying` is another replica, whose relay
    // finds them after their lease.
    let held = holding(&context);
    let relaying = Composition::start(&[ORDERS, "--context", &context], &LOGIN);
    held.wait_ready();
    relaying.wait_ready();
    let call = |agent: &Composition, operation: &str, body: Value| {
        let target = format!("store.orders.{operation}");
        call_with(&agent.agent, &target, "", &body.to_string())
    };
    // 30 orders through each; 15 of each approved through the other; a write the schema
    // refuses, which publishes nothing.
    let mut stored: BTreeSet<(String, u64)> = BTreeSet::new();
    for n in 0..30 {
        for (agent, side) in [(&held, "h"), (&relaying, "r")] {
            let id = format!("{side}{n:02}");
            let order = json!({"query": {"id": id}, "input": {"total": n}});
            let (status, answer) = call(agent, "transit", order);
            assert_eq!(status, 200, "{answer}");
            stored.insert((id, 1));
        }
    }
    for n in 0..15 {
        for (agent, side) in [(&relaying, "h"), (&held, "r")] {
            let id = format!("{side}{n:02}");
            let (status, answer) = call(agent, "approve", json!({"query": {"id": id}}));
            assert_eq!(
                (status, &answer["reply"]["VERSION"]),
                (200, &json!(2)),
                "{answer}"
            );
            stored.insert((id, 2));
        }
    }
    let refused = json!({"query": {"id": "r00"}, "input": {"total": -1}});
    assert_eq!(call(&relaying, "transit", refused).0, 422);
    held.kill();
    let killed = Instant::now();
    let (seen, last) = received(&mut consumer, stored.len() * 2).await;
    let expected: BTreeSet<String> = stored
        .iter()
        .flat_map(|(id, version)| {
            ["changed", "noted"].map(|event| format!("store.orders.{event}/{id}/{version}"))
        })
        .collect();
    let ids: BTreeSet<String> = seen.keys().cloned().collect();
    assert_eq!(
        ids, expected,
        "every stored change's events, and nothing else"
    );
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, (n, _))| *n > 1)
        .map(|(id, _)| id)
        .collect();
    assert!(
        twice.is_empty(),
        "published twice from the outbox: {twice:?}"
    );
    let approved = &seen["store.orders.changed/h03/2"].1;
    assert_eq!(
        approved,
        &json!({"id": "h03", "VERSION": 2, "status": "approved", "total": 3})
    );
    eprintln!(
        "the stopped process's last event arrived {:.1} s after it was killed",
        last.duration_since(killed).as_secs_f64()
    );
}

/// A process of the orders that publishes nothing (`TOA_TEST_HOLD_EVENTS=1`: neither what it
/// stores nor by its relay), as one that stops right after its commits.
fn holding(context: &str) -> Composition {
    let env: Vec<(&str, &str)> = LOGIN
        .into_iter()
        .chain([("TOA_TEST_HOLD_EVENTS", "1")])
        .collect();
    Composition::start(&[ORDERS, "--context", context], &env)
}

/// `relaying` with its control endpoint on a free port (token `TOKEN`): the process and port.
fn with_control(context: &str) -> (Composition, u16) {
    let token = std::env::temp_dir().join(format!("toa-events-token-{}", std::process::id()));
    std::fs::write(&token, TOKEN).unwrap();
    let port = support::free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        ORDERS,
        "--context",
        context,
        "--control-listen",
        &listen,
        "--control-token-file",
        token.to_str().unwrap(),
    ];
    (Composition::start(&args, &LOGIN), port)
}

const TOKEN: &str = "events-test-token";

/// Asks the control endpoint for `action` (`halt`, `resume`) of halt `h-1`: the phase after it.
fn control(port: u16, action: &str) -> String {
    let path = format!("/control/{action}");
    let (code, body) = support::control(port, "POST", &path, Some(TOKEN), r#"{"halt":"h-1"}"#);
    assert_eq!(code, 200, "{body}");
    body["phase"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_relays_nothing_until_it_resumes() {
    let (context, application, _queues) =
        support::broker_context_with("paused-relay", BROKER, STORAGE);
    let context = context.display().to_string();
    let (_connection, mut consumer) = listen(&application).await;
    // Alone, so every call is its own: ten orders stored, never published, and it stops. Not
    // killed: a call's delivery is acknowledged after its answer, so a kill right after the last
    // answer could leave it unacknowledged, and the next replica would run it again and publish
    // that write itself (CI saw `p9` at version 2, published by the halted replica).
    let held = holding(&context);
    held.wait_ready();
    for n in 0..10 {
        let order = json!({"query": {"id": format!("p{n}")}, "input": {"total": n}});
        let (status, answer) =
            call_with(&held.agent, "store.orders.transit", "", &order.to_string());
        assert_eq!(status, 200, "{answer}");
    }
    let (stopped, log) = held.terminate(Duration::from_secs(30));
    assert!(stopped, "the holding process did not stop cleanly:\n{log}");
    // Another replica, halted as soon as its control endpoint answers (while it starts, long
    // before the events' lease runs out): its relay never starts.
    let (relaying, port) = with_control(&context);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "no control endpoint:\n{}",
            relaying.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let phase = control(port, "halt");
    assert!(["starting", "paused"].contains(&phase.as_str()), "{phase}");
    relaying.wait_ready();
    // Past the events' lease and two of the relay's rounds, nothing came.
    let quiet = LEASE + Duration::from_millis(2500);
    let early = tokio::time::timeout(quiet, consumer.next()).await;
    assert!(
        early.is_err(),
        "an event while the only relay was paused: {early:?}"
    );
    assert_eq!(control(port, "resume"), "running");
    let (seen, _) = received(&mut consumer, 20).await;
    assert_eq!(seen.len(), 20, "{:?}", seen.keys());
    assert!(seen.values().all(|(n, _)| *n == 1), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_decides_which_events_a_write_publishes_from_the_object_and_what_it_was() {
    let (context, application, _queues) =
        support::broker_context_with("conditions", BROKER, STORAGE);
    let context = context.display().to_string();
    let (_connection, mut consumer) = listen(&application).await;
    let orders = Composition::start(&[CONDITIONAL, "--context", &context], &LOGIN);
    orders.wait_ready();
    let call = |operation: &str, body: Value| {
        let target = format!("store.orders.{operation}");
        call_with(&orders.agent, &target, "", &body.to_string())
    };
    let on = |input: Value| json!({"query": {"id": "o1"}, "input": input});
    // v1 new, v2 approved, v3 approved still (its total changed), then by assignments: v4 new,
    // v5 approved again.
    let writes = [
        ("transit", on(json!({"total": 5}))),
        ("approve", json!({"query": {"id": "o1"}})),
        ("transit", on(json!({"total": 6}))),
        ("assign", on(json!({"status": "new"}))),
        ("assign", on(json!({"status": "approved"}))),
    ];
    for (version, (operation, body)) in (1..).zip(writes) {
        let (status, answer) = call(operation, body);
        assert_eq!(status, 200, "{operation}: {answer}");
        assert_eq!(answer["reply"]["VERSION"], json!(version), "{answer}");
    }
    // The condition fails: so does the write, and nothing of it is stored or published.
    let (status, failed) = call(
        "transit",
        json!({"query": {"id": "o2"}, "input": {"total": 13}}),
    );
    assert!(status >= 500, "{status} {failed}");
    assert!(
        !failed.to_string().contains("13 is refused"),
        "the condition's message holds the object's data and is not passed on: {failed}"
    );
    let (status, missing) = call("observe", json!({"query": {"id": "o2"}}));
    assert_eq!(
        (status, &missing["reply"]["VERSION"]),
        (200, &json!(0)),
        "{missing}"
    );
    let (seen, _) = received(&mut consumer, 7).await;
    let ids: BTreeSet<&str> = seen.keys().map(String::as_str).collect();
    let expected = BTreeSet::from([
        "store.orders.changed/o1/1",
        "store.orders.changed/o1/2",
        "store.orders.changed/o1/3",
        "store.orders.changed/o1/4",
        "store.orders.changed/o1/5",
        "store.orders.approved/o1/2",
        "store.orders.approved/o1/5",
    ]);
    assert_eq!(ids, expected, "{}", orders.log());
    assert!(seen.values().all(|(n, _)| *n == 1), "{seen:?}");
}
