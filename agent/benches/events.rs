//! Events through the outbox against bare PostgreSQL and RabbitMQ, from the same process, on
//! the tests' servers (scripts/services: PostgreSQL 127.0.0.1:5432, RabbitMQ 127.0.0.1:5672).
//!
//!   cargo bench -p toa-agent --bench events
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>`; latencies in µs, rates per second.
//! - `transit_*`: a transition with one event (agent/tests/components/orders-events, two events
//!   declared: each write stores and publishes two) against the same transition on a component
//!   without events (stock-retry), both through one agent: what the outbox adds to a call.
//! - `events_per_s`: stored writes whose events all reached a queue of this process's own, per
//!   second, against a bare pair from this process: a transaction that updates the row and
//!   inserts its two event rows, then two confirmed publishes.

use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{bare_write, compose, connect, free_port, line, measure, posts, wait_ready};

const CALLERS: usize = 16;
const CALLS: usize = 3_000;
const OBJECTS: usize = 1_000;
const BROKER: &str = "amqp://127.0.0.1:5672";

/// A queue of this process's own bound to every label of `exchange` (declared as the agent
/// does), and its consumer.
async fn listen(exchange: &str) -> (lapin::Channel, lapin::Consumer) {
    use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let topic = lapin::ExchangeKind::Topic;
    channel
        .exchange_declare(exchange.into(), topic, durable, FieldTable::default())
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
    let name = queue.name().as_str();
    let bind = Default::default();
    channel
        .queue_bind(
            name.into(),
            exchange.into(),
            "#".into(),
            bind,
            FieldTable::default(),
        )
        .await
        .unwrap();
    let no_ack = lapin::options::BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let consumer = channel
        .basic_consume(name.into(), "".into(), no_ack, FieldTable::default())
        .await
        .unwrap();
    (channel, consumer)
}

/// Takes `count` messages off `consumer`: when the last came.
async fn drained(consumer: &mut lapin::Consumer, count: usize) -> Instant {
    for _ in 0..count {
        let next = tokio::time::timeout(Duration::from_secs(60), consumer.next()).await;
        next.expect("the events came within 60 s").unwrap().unwrap();
    }
    Instant::now()
}

/// `CALLS` transits of `component` on `OBJECTS` objects through the agent.
async fn transits(
    http: &reqwest::Client,
    port: u16,
    component: &str,
    property: &str,
) -> common::Figures {
    let url = format!("http://127.0.0.1:{port}/v1/call/{component}/transit");
    let property = property.to_owned();
    posts(http.clone(), url, (CALLERS, CALLS), move |n| {
        format!(
            r#"{{"query": {{"id": "o-{}"}}, "input": {{"{property}": {n}}}}}"#,
            n % OBJECTS
        )
    })
    .await
}

#[tokio::main]
async fn main() {
    let port = free_port();
    let application = format!("bench-events-{}", std::process::id());
    let context = format!("amqp: {BROKER}\nstorage: postgres://127.0.0.1:5432/toa\n");
    let components = [
        "agent/tests/components/orders-events",
        "agent/tests/components/stock-retry",
    ];
    let _agent = compose(port, (&application, &context), &components, &[]);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_ready(&http, port).await;
    let (_channel, mut consumer) = listen(&format!("toa.{application}#events")).await;
    // Warm both paths (tables, pools, the exchange's declaration).
    transits(&http, port, "fulfilment.stock", "available").await;
    let started = Instant::now();
    let with = transits(&http, port, "store.orders", "total").await;
    // `measure` makes CALLS / CALLERS calls per caller; each write publishes two events.
    let writes = CALLS / CALLERS * CALLERS;
    let last = drained(&mut consumer, writes * 2).await;
    let plain = transits(&http, port, "fulfilment.stock", "available").await;
    line("transit_with_events_p50_us", with.p50, Some(plain.p50));
    line("transit_with_events_p99_us", with.p99, Some(plain.p99));
    line("transit_with_events_per_s", with.rate, Some(plain.rate));
    let ours = writes as f64 / last.duration_since(started).as_secs_f64();
    let bare = bare_pair(&format!("toa.{application}#bare")).await;
    line("events_per_s", ours, Some(bare));
    cleanup(&application).await;
}

/// The bare pair, `CALLS` times from `CALLERS` tasks over 8 connections and one confirming
/// channel: a transaction updating a row and inserting two event rows, then two confirmed
/// publishes to `exchange`. Writes per second.
async fn bare_pair(exchange: &str) -> f64 {
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(tokio::sync::Mutex::new(connect().await));
    }
    let table = format!("bench_events_{}", std::process::id());
    clients[0]
        .lock()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL, state jsonb NOT NULL); \
             CREATE TABLE {table}_outbox (id text, version bigint, label text, payload jsonb, \
             at timestamptz DEFAULT now(), PRIMARY KEY (id, version, label)); \
             INSERT INTO {table} SELECT 'o-' || n, 0, '{{}}' FROM generate_series(0, {}) n",
            OBJECTS - 1
        ))
        .await
        .unwrap();
    let (channel, _consumer) = listen(exchange).await;
    channel.confirm_select(Default::default()).await.unwrap();
    let shared = Arc::new((clients, channel, table.clone(), exchange.to_owned()));
    let figures = measure(CALLERS, CALLS, move |n| {
        let shared = shared.clone();
        async move {
            let (clients, channel, table, exchange) = &*shared;
            bare_write(clients, channel, (table, exchange), (n, OBJECTS)).await;
        }
    })
    .await;
    figures.rate
}

/// Drops the bare tables, the application's schema and its exchange.
async fn cleanup(application: &str) {
    let client = connect().await;
    let table = format!("bench_events_{}", std::process::id());
    let _ = client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_outbox; \
             DROP SCHEMA IF EXISTS \"toa_{application}\" CASCADE"
        ))
        .await;
    if let Ok(connection) =
        lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default()).await
    {
        if let Ok(channel) = connection.create_channel().await {
            for exchange in ["events", "bare"] {
                let name = format!("toa.{application}#{exchange}");
                let _ = channel
                    .exchange_delete(name.as_str().into(), Default::default())
                    .await;
            }
        }
    }
}
