//! Receivers (DESIGN 18): store.orders' events run store.ledger's operations, across processes
//! over the tests' RabbitMQ and PostgreSQL, and in-process in a local run without a broker. What
//! ran is checked afterwards from a record: the ledger's objects (one per event its transition
//! ran for) and the lines its effect appended.

mod support;

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{call_with, Composition};

const ORDERS: &str = "agent/tests/components/orders-events";
const LEDGER: &str = "agent/tests/components/ledger";
const FOLLOWER: &str = "agent/tests/components/follower";
const BROKER: &str = "amqp://127.0.0.1:5672";
const STORAGE: &str = "storage: postgres://127.0.0.1:5432/toa\n";
const LOGIN: [(&str, &str); 2] = [
    ("TOA_STORAGE_USERNAME", "toa"),
    ("TOA_STORAGE_PASSWORD", "toa"),
];

/// The files the ledger's `note` appends to and fails while present.
struct Files {
    record: PathBuf,
    fail: PathBuf,
}

impl Files {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let files = Self {
            record: dir.join(format!("toa-ledger-{name}-{pid}.record")),
            fail: dir.join(format!("toa-ledger-{name}-{pid}.fail")),
        };
        let _ = std::fs::remove_file(&files.record);
        let _ = std::fs::remove_file(&files.fail);
        files
    }

    fn env(&self) -> Vec<(&str, &str)> {
        LOGIN
            .into_iter()
            .chain([
                ("TEST_RECORD", self.record.to_str().unwrap()),
                ("TEST_FAIL", self.fail.to_str().unwrap()),
            ])
            .collect()
    }

    /// What `note` ran for: (order, version) → how often.
    fn noted(&self) -> BTreeMap<(String, u64), usize> {
        let text = std::fs::read_to_string(&self.record).unwrap_or_default();
        let mut noted = BTreeMap::new();
        for line in text.lines() {
            let input: Value = serde_json::from_str(line).unwrap();
            let key = (
                input["order"].as_str().unwrap().to_owned(),
                input["version"].as_u64().unwrap(),
            );
            *noted.entry(key).or_default() += 1;
        }
        noted
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.record);
        let _ = std::fs::remove_file(&self.fail);
    }
}

fn call(agent: &Composition, target: &str, body: &Value) -> (u16, Value) {
    call_with(&agent.agent, target, "", &body.to_string())
}

/// The ledger's objects: (order, version) → how many objects say it.
fn ledger(agent: &Composition) -> BTreeMap<(String, u64), usize> {
    let mut kept = BTreeMap::new();
    let mut after = Value::Null;
    loop {
        let page = json!({"input": {"limit": 1000, "after": after}});
        let page = if after.is_null() {
            json!({"input": {"limit": 1000}})
        } else {
            page
        };
        let (status, answer) = call(agent, "store.ledger.enumerate", &page);
        assert_eq!(status, 200, "{answer}");
        for item in answer["reply"]["items"].as_array().unwrap() {
            let key = (
                item["order"].as_str().unwrap().to_owned(),
                item["version"].as_u64().unwrap(),
            );
            *kept.entry(key).or_default() += 1;
        }
        after = answer["reply"]["next"].clone();
        if after.is_null() {
            return kept;
        }
    }
}

/// Waits until `done` holds of what `look` sees, within `limit`; then looks once more after
/// `quiet`, so that a late copy would be seen too.
fn settle<T: std::fmt::Debug>(
    limit: Duration,
    quiet: Duration,
    look: impl Fn() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let seen = look();
        if done(&seen) {
            break;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(quiet);
    look()
}

/// 20 orders (version 1), 10 of them approved (version 2): every stored change.
fn order(orders: &Composition) -> BTreeSet<(String, u64)> {
    let mut stored = BTreeSet::new();
    for n in 0..20 {
        let id = format!("o{n:02}");
        let body = json!({"query": {"id": id}, "input": {"total": n}});
        let (status, answer) = call(orders, "store.orders.transit", &body);
        assert_eq!(status, 200, "{answer}");
        stored.insert((id.clone(), 1));
        if n % 2 == 0 {
            let (status, answer) = call(
                orders,
                "store.orders.approve",
                &json!({"query": {"id": id}}),
            );
            assert_eq!(status, 200, "{answer}");
            stored.insert((id, 2));
        }
    }
    stored
}

/// Publishes `events` (id, version, payload) of `store.orders.changed` to the application's
/// exchange as a relay would, and with `garbage` a message that is no event (not JSON). Each is
/// confirmed by the broker before the next: without confirms, closing the connection at once
/// could leave the last publishes unsent (CI saw the garbage and three copies never arrive).
async fn publish(application: &str, events: &[(String, u64, Value)], garbage: bool) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let exchange = format!("toa.{application}#events");
    let label = "store.orders.changed";
    let send = |body: Vec<u8>, properties: lapin::BasicProperties| {
        let channel = channel.clone();
        let exchange = exchange.clone();
        async move {
            let options = BasicPublishOptions::default();
            let confirmed = channel
                .basic_publish(
                    exchange.as_str().into(),
                    label.into(),
                    options,
                    &body,
                    properties,
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(
                confirmed.is_ack(),
                "the broker refused an event: {confirmed:?}"
            );
        }
    };
    for (id, version, payload) in events {
        let mut headers = FieldTable::default();
        headers.insert("toa-label".into(), AMQPValue::LongString(label.into()));
        let properties = lapin::BasicProperties::default()
            .with_message_id(format!("{label}/{id}/{version}").into())
            .with_headers(headers);
        send(payload.to_string().into_bytes(), properties).await;
    }
    if garbage {
        let properties = lapin::BasicProperties::default().with_message_id("garbage/1".into());
        send(b"not json".to_vec(), properties).await;
    }
    let _ = connection.close(200, "done".into()).await;
}

/// An order as store.orders publishes it at `version`.
fn order_event(id: &str, version: u64) -> (String, u64, Value) {
    let status = format!("s{version}");
    let total = id[1..].parse::<u64>().unwrap_or(0);
    let payload = json!({"id": id, "VERSION": version, "status": status, "total": total});
    (id.to_owned(), version, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_runs_its_receivers_transition_once_however_often_it_comes() {
    let (context, application, _queues) =
        support::broker_context_with("receivers", BROKER, STORAGE);
    let context = context.display().to_string();
    let files = Files::new("once");
    let ledger_process = Composition::start(&[LEDGER, "--context", &context], &files.env());
    ledger_process.wait_ready();
    let orders = Composition::start(&[ORDERS, "--context", &context], &LOGIN);
    orders.wait_ready();
    let stored = order(&orders);
    // Copies of half the events, and a message that is no event: the copies run nothing, the
    // bad one is dead-lettered, and neither stops the others.
    let copies: Vec<(String, u64, Value)> = stored
        .iter()
        .step_by(2)
        .map(|(id, version)| {
            let (id, version, mut payload) = order_event(id, *version);
            payload["status"] = json!(if version == 1 { "new" } else { "approved" });
            (id, version, payload)
        })
        .collect();
    publish(&application, &copies, true).await;
    let expected: BTreeMap<(String, u64), usize> = stored.iter().map(|k| (k.clone(), 1)).collect();
    let kept = settle(
        Duration::from_secs(30),
        Duration::from_secs(2),
        || ledger(&ledger_process),
        |kept| kept.len() >= stored.len(),
    );
    assert_eq!(
        kept, expected,
        "one object per stored change, however often its event came"
    );
    // The effect runs at least once per event (its adaptation made the request).
    let noted = files.noted();
    let keys: BTreeSet<(String, u64)> = noted.keys().cloned().collect();
    assert_eq!(keys, stored, "note ran for every stored change");
    // Every copy came and was answered from the record (a copy may come before its original,
    // which is then the one answered so), and the bad message was dead-lettered by its id.
    let dead =
        |log: &String| log.contains("an event was dead-lettered") && log.contains("garbage/1");
    let repeated = |log: &String| log.matches("a call applied already").count();
    let log = settle(
        Duration::from_secs(30),
        Duration::ZERO,
        || ledger_process.log(),
        |log| dead(log) && repeated(log) >= copies.len(),
    );
    // A redelivery (an acknowledgement lost) may be answered from the record too: at least.
    assert!(
        dead(&log),
        "the message that is no event is dead-lettered by its id"
    );
    assert!(
        repeated(&log) >= copies.len(),
        "each copy answered from the record"
    );
}

fn requeue(context: &str) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toa-agent"))
        .current_dir(support::root())
        .args(["requeue", "store.ledger", "--context", context])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_receiver_fails_every_time_is_dead_lettered_and_the_command_sends_it_back() {
    let limits = format!("{STORAGE}limits: {{ deliveries: 3 }}\n");
    let (context, _application, _queues) = support::broker_context_with("dead", BROKER, &limits);
    let context = context.display().to_string();
    let files = Files::new("dead");
    std::fs::write(&files.fail, "").unwrap();
    let ledger_process = Composition::start(&[LEDGER, "--context", &context], &files.env());
    ledger_process.wait_ready();
    let orders = Composition::start(&[ORDERS, "--context", &context], &LOGIN);
    orders.wait_ready();
    for id in ["d1", "d2"] {
        let body = json!({"query": {"id": id}, "input": {"total": 1}});
        assert_eq!(call(&orders, "store.orders.transit", &body).0, 200);
    }
    let dead = |log: &str| {
        ["d1", "d2"]
            .iter()
            .filter(|id| {
                log.contains(&format!("store.orders.noted/{id}/1"))
                    && log.contains("delivered 3 times")
            })
            .count()
    };
    settle(
        Duration::from_secs(30),
        Duration::ZERO,
        || ledger_process.log(),
        |log| dead(log) == 2 && log.matches("an event was dead-lettered").count() >= 2,
    );
    let (_, metrics) = support::http_get(&format!("{}/metrics", ledger_process.agent));
    let counted = metrics
        .lines()
        .find(|line| line.starts_with("toa_events_dead_lettered_total{"))
        .and_then(|line| line.rsplit(' ').next());
    assert_eq!(counted, Some("2"), "{metrics}");
    assert!(files.noted().is_empty(), "note never ran through");
    // Mended: the command sends both back, and they run.
    std::fs::remove_file(&files.fail).unwrap();
    let (ok, said) = requeue(&context);
    assert!(ok && said.contains("2 events of store.ledger"), "{said}");
    let noted = settle(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || files.noted(),
        |n| n.len() == 2,
    );
    let keys: Vec<(String, u64)> = noted.keys().cloned().collect();
    assert_eq!(keys, [("d1".to_owned(), 1), ("d2".to_owned(), 1)]);
    let (ok, said) = requeue(&context);
    assert!(ok && said.contains("0 events"), "nothing left: {said}");
}

#[test]
fn without_a_broker_a_local_run_delivers_its_events_to_its_receivers_in_process() {
    let files = Files::new("local");
    let context = std::env::temp_dir().join(format!(
        "toa-context-receivers-local-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&context, "name: local\n").unwrap();
    let both = Composition::start(
        &[ORDERS, LEDGER, "--context", context.to_str().unwrap()],
        &files.env(),
    );
    both.wait_ready();
    let stored = order(&both);
    let expected: BTreeMap<(String, u64), usize> = stored.iter().map(|k| (k.clone(), 1)).collect();
    let kept = settle(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || ledger(&both),
        |kept| kept.len() >= stored.len(),
    );
    assert_eq!(kept, expected);
    let keys: BTreeSet<(String, u64)> = files.noted().keys().cloned().collect();
    assert_eq!(keys, stored);
    let _ = std::fs::remove_file(Path::new(&context));
}

/// `total` transitions through `orders`, 100 orders `total / 100` times each, every call with
/// a key and made again (with it) until it is answered: what was stored.
fn transit_keyed(
    orders: &str,
    total: usize,
    done: &std::sync::atomic::AtomicUsize,
) -> BTreeSet<(String, u64)> {
    let mut stored = BTreeSet::new();
    for n in 0..total {
        let (id, version) = (format!("k{:02}", n % 100), (n / 100 + 1) as u64);
        let body = json!({"query": {"id": id}, "input": {"total": version}, "key": format!("t-{id}-{version}")});
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, answer) = call_with(orders, "store.orders.transit", "", &body.to_string());
            if status == 200 {
                assert_eq!(answer["reply"]["VERSION"], version, "{answer}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{id} v{version}: still {status} {answer}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        stored.insert((id, version));
        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    stored
}

#[test]
fn a_thousand_transitions_under_a_broker_restart_each_run_their_receivers_transition_once() {
    let mut broker = support::rabbit::RabbitNode::start();
    let (context, _application, _queues) =
        support::broker_context_with("restarted", &broker.url(), STORAGE);
    let context = context.display().to_string();
    let files = Files::new("restart");
    let ledger_process = Composition::start(&[LEDGER, "--context", &context], &files.env());
    ledger_process.wait_ready();
    let orders = Composition::start(&[ORDERS, "--context", &context], &LOGIN);
    orders.wait_ready();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let calling = {
        let (agent, done) = (orders.agent.clone(), done.clone());
        std::thread::spawn(move || transit_keyed(&agent, 1000, &done))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(std::sync::atomic::Ordering::SeqCst) < 300 {
        assert!(
            Instant::now() < deadline,
            "300 transitions took over a minute"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.restart();
    let restarted_at = done.load(std::sync::atomic::Ordering::SeqCst);
    let stored = calling.join().unwrap();
    assert_eq!(stored.len(), 1000);
    let expected: BTreeMap<(String, u64), usize> = stored.iter().map(|k| (k.clone(), 1)).collect();
    let kept = settle(
        Duration::from_secs(60),
        Duration::from_secs(3),
        || ledger(&ledger_process),
        |kept| kept.len() >= stored.len(),
    );
    let twice: Vec<_> = kept.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(
        kept, expected,
        "every stored change's event, applied once; none of a write not stored"
    );
    let keys: BTreeSet<(String, u64)> = files.noted().keys().cloned().collect();
    assert_eq!(keys, stored, "the effect ran at least once for every event");
    eprintln!("the broker restarted after {restarted_at} transitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latest_receiver_stores_each_objects_events_in_rising_versions_only() {
    let (context, application, _queues) = support::broker_context_with("latest", BROKER, STORAGE);
    let context = context.display().to_string();
    let follower = Composition::start(&[FOLLOWER, "--context", &context], &LOGIN);
    follower.wait_ready();
    // Three orders' events out of order, with copies, taken 32 at a time at once.
    let versions = [3, 1, 2, 6, 5, 4, 6, 2, 1];
    let ids = ["f1", "f2", "f3"];
    let events: Vec<(String, u64, Value)> = versions
        .iter()
        .flat_map(|version| ids.map(|id| order_event(id, *version)))
        .collect();
    publish(&application, &events, false).await;
    let observe = |id: &str| {
        let body = json!({"query": {"id": id}});
        let (status, answer) = call(&follower, "store.follower.observe", &body);
        assert_eq!(status, 200, "{answer}");
        answer["reply"].clone()
    };
    let seen = settle(
        Duration::from_secs(30),
        Duration::from_secs(1),
        || ids.map(observe),
        |orders| orders.iter().all(|order| order["status"] == "s6"),
    );
    for order in &seen {
        let stored: Vec<u64> = order["seen"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert!(
            stored.windows(2).all(|pair| pair[0] < pair[1]) && stored.last() == Some(&6),
            "each version stored after an older one only, the newest last: {order}"
        );
    }
    eprintln!(
        "versions stored: {:?}",
        seen.iter().map(|o| o["seen"].clone()).collect::<Vec<_>>()
    );
}

/// The pid of the program `agent` started (its one child).
fn program_of(agent: &Composition) -> i32 {
    let output = std::process::Command::new("pgrep")
        .args(["-P", &agent.pid().to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    text.split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_wait_while_the_receivers_program_is_down_and_none_is_dead_lettered() {
    let (context, application, _queues) = support::broker_context_with("down", BROKER, STORAGE);
    let context = context.display().to_string();
    let files = Files::new("down");
    let first = Composition::start(&[LEDGER, "--context", &context], &files.env());
    first.wait_ready();
    // The program goes away; its agent stays: the events it would take wait for another.
    // SAFETY: signalling a process of the test's own.
    unsafe { libc::kill(program_of(&first), libc::SIGKILL) };
    settle(
        Duration::from_secs(10),
        Duration::ZERO,
        || first.log(),
        |log| log.contains("the program is down"),
    );
    let events: Vec<(String, u64, Value)> =
        (0..10).map(|n| order_event(&format!("d{n}"), 1)).collect();
    publish(&application, &events, false).await;
    // Longer than the pauses of every delivery a failing receiver would get.
    std::thread::sleep(Duration::from_secs(4));
    let second = Composition::start(&[LEDGER, "--context", &context], &files.env());
    second.wait_ready();
    let kept = settle(
        Duration::from_secs(30),
        Duration::from_millis(500),
        || ledger(&second),
        |kept| kept.len() >= events.len(),
    );
    let expected: BTreeMap<(String, u64), usize> =
        (0..10).map(|n| ((format!("d{n}"), 1), 1)).collect();
    assert_eq!(kept, expected);
    let log = first.log();
    assert!(!log.contains("dead-lettered"), "{log}");
}
