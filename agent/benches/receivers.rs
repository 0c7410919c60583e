//! Events from a transition to a receiver's stored write, against bare PostgreSQL and RabbitMQ,
//! on the tests' servers (scripts/services: PostgreSQL 127.0.0.1:5432, RabbitMQ 127.0.0.1:5672).
//!
//!   cargo bench -p toa-agent --bench receivers
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>`; rates per second.
//! - `received_per_s`: store.orders' transitions (agent/tests/components/orders-events: each
//!   write publishes `changed` and `noted`) whose `changed` event store.ledger's receiver stored
//!   (a transition with its inbox record; `noted` runs an effect), per second from the first
//!   call to the last receiver's write, both components in one agent; against a bare chain from
//!   this process: a transaction updating a row and inserting its two event rows, two confirmed
//!   publishes, and a consumer that for `changed` stores a row and its inbox row in one
//!   transaction before acknowledging (and acknowledges `noted`).

use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{bare_write, compose, connect, free_port, line, measure, posts, wait_ready};

const CALLERS: usize = 16;
const CALLS: usize = 3_000;
const OBJECTS: usize = 1_000;
const BROKER: &str = "amqp://127.0.0.1:5672";

/// Waits until `count` rows are in `table` (polled every 20 ms, at most 120 s): when.
async fn counted(client: &tokio_postgres::Client, table: &str, count: i64) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let statement = format!("SELECT count(*) FROM {table}");
        let rows: i64 = client
            .query_one(&statement, &[])
            .await
            .map_or(0, |r| r.get(0));
        if rows >= count {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{rows} of {count} rows in {table} after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `CALLS` transits of the orders on `OBJECTS` objects, through the agent at `port`.
async fn transits(http: &reqwest::Client, port: u16) {
    let url = format!("http://127.0.0.1:{port}/v1/call/store.orders/transit");
    posts(http.clone(), url, (CALLERS, CALLS), |n| {
        format!(
            r#"{{"query": {{"id": "o-{}"}}, "input": {{"total": {n}}}}}"#,
            n % OBJECTS
        )
    })
    .await;
}

#[tokio::main]
async fn main() {
    let port = free_port();
    let application = format!("bench-receivers-{}", std::process::id());
    let context = format!("amqp: {BROKER}\nstorage: postgres://127.0.0.1:5432/toa\n");
    let components = [
        "agent/tests/components/orders-events",
        "agent/tests/components/ledger",
    ];
    let env = [
        ("TEST_RECORD", "/dev/null"),
        ("TEST_FAIL", "/nonexistent/toa-bench"),
    ];
    let _agent = compose(port, (&application, &context), &components, &env);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    wait_ready(&http, port).await;
    let client = connect().await;
    let ledger = format!("\"toa_{application}\".\"store.ledger\"");
    // Warm the paths (tables, pools, declarations): one round, counted.
    let started = Instant::now();
    transits(&http, port).await;
    let writes = (CALLS / CALLERS * CALLERS) as i64;
    counted(&client, &ledger, writes).await;
    let warm = writes as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    transits(&http, port).await;
    let last = counted(&client, &ledger, 2 * writes).await;
    let ours = writes as f64 / last.duration_since(started).as_secs_f64();
    let bare = bare_chain(&client).await;
    line("received_per_s_first_round", warm, Some(bare));
    line("received_per_s", ours, Some(bare));
    cleanup(&client, &application).await;
}

/// The bare chain's tables: the objects, their outbox, the receiver's rows and its inbox.
async fn bare_tables(client: &tokio_postgres::Client, table: &str) {
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL, state jsonb NOT NULL); \
             CREATE TABLE {table}_outbox (id text, version bigint, label text, payload jsonb, \
             at timestamptz DEFAULT now(), PRIMARY KEY (id, version, label)); \
             CREATE TABLE {table}_received (id text PRIMARY KEY, state jsonb NOT NULL); \
             CREATE TABLE {table}_inbox (key text PRIMARY KEY, at timestamptz DEFAULT now()); \
             INSERT INTO {table} SELECT 'o-' || n, 0, '{{}}' FROM generate_series(0, {}) n",
            OBJECTS - 1
        ))
        .await
        .unwrap();
}

/// A quorum queue bound to `exchange` by both labels, whose consumer stores each `changed` (a row
/// and its inbox row, one transaction) and acknowledges every message.
async fn bare_receiver(exchange: &str, table: &str) -> lapin::Channel {
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let topic = lapin::ExchangeKind::Topic;
    let durable = lapin::options::ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(exchange.into(), topic, durable, FieldTable::default())
        .await
        .unwrap();
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let queue = format!("{exchange}.received");
    channel
        .queue_declare(queue.as_str().into(), options, quorum)
        .await
        .unwrap();
    for label in ["changed", "noted"] {
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.into(),
                label.into(),
                Default::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    channel
        .basic_qos(32, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(tokio::sync::Mutex::new(connect().await));
    }
    let shared = Arc::new((clients, table.to_owned()));
    tokio::spawn(async move {
        let mut n = 0usize;
        while let Some(Ok(delivery)) = consumer.next().await {
            n += 1;
            let shared = shared.clone();
            tokio::spawn(async move {
                let (clients, table) = &*shared;
                if delivery.routing_key.as_str() == "changed" {
                    let state: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap();
                    let id = format!("r-{n}");
                    let mut client = clients[n % clients.len()].lock().await;
                    let transaction = client.transaction().await.unwrap();
                    transaction
                        .execute(
                            &format!("INSERT INTO {table}_inbox (key) VALUES ($1)"),
                            &[&id],
                        )
                        .await
                        .unwrap();
                    let state = tokio_postgres::types::Json(state);
                    transaction
                        .execute(
                            &format!("INSERT INTO {table}_received (id, state) VALUES ($1, $2)"),
                            &[&id, &state],
                        )
                        .await
                        .unwrap();
                    transaction.commit().await.unwrap();
                }
                delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .unwrap();
            });
        }
    });
    channel
}

/// The bare chain, `CALLS` writes from `CALLERS` tasks over 8 connections and one confirming
/// channel, until its receiver stored every `changed`: writes per second.
async fn bare_chain(client: &tokio_postgres::Client) -> f64 {
    let table = format!("bench_receivers_{}", std::process::id());
    bare_tables(client, &table).await;
    let exchange = format!("toa.bench-receivers-{}#bare", std::process::id());
    let _receiving = bare_receiver(&exchange, &table).await;
    let connection = lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(Default::default()).await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(tokio::sync::Mutex::new(connect().await));
    }
    let shared = Arc::new((clients, channel, table.clone(), exchange.clone()));
    let started = Instant::now();
    measure(CALLERS, CALLS, move |n| {
        let shared = shared.clone();
        async move {
            let (clients, channel, table, exchange) = &*shared;
            bare_write(clients, channel, (table, exchange), (n, OBJECTS)).await;
        }
    })
    .await;
    let writes = (CALLS / CALLERS * CALLERS) as i64;
    let last = counted(client, &format!("{table}_received"), writes).await;
    writes as f64 / last.duration_since(started).as_secs_f64()
}

/// Drops the bare tables and queue, the application's schema, queues and exchange.
async fn cleanup(client: &tokio_postgres::Client, application: &str) {
    let table = format!("bench_receivers_{}", std::process::id());
    let _ = client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_outbox, {table}_received, {table}_inbox; \
             DROP SCHEMA IF EXISTS \"toa_{application}\" CASCADE"
        ))
        .await;
    let Ok(connection) =
        lapin::Connection::connect(BROKER, lapin::ConnectionProperties::default()).await
    else {
        return;
    };
    let Ok(channel) = connection.create_channel().await else {
        return;
    };
    let bare = format!("toa.bench-receivers-{}#bare", std::process::id());
    for queue in [
        format!("toa.{application}.store.ledger#receivers"),
        format!("toa.{application}.store.ledger#receivers-dead"),
        format!("{bare}.received"),
    ] {
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
    }
    for exchange in [format!("toa.{application}#events"), bare] {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await;
    }
}
