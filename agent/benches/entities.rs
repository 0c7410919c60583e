//! Entities through the agent against PostgreSQL, against bare tokio-postgres from the same
//! process, on the tests' server (scripts/services: 127.0.0.1:5432, role and database toa).
//!
//!   cargo bench -p toa-agent --bench entities
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>`; latencies in µs, rates per second, RSS in MB.
//! Ours: a caller → the agent's local API (HTTP) → the inherited `transit` (read, compare-and-set)
//! → PostgreSQL, and back; the program is not asked (the inherited operations are the agent's).
//! The baseline: the same read and compare-and-set update, sent by this process straight to the
//! server over as many connections as the agent's pool (8), with its statements prepared once, as
//! the agent's are. Observation: `observe` through the agent
//! against a bare SELECT plus one bare loopback HTTP round trip (the local call a caller makes).

use std::sync::Arc;

mod common;
use common::{compose, connect, free_port, line, measure, post, rss_mb, wait_ready};

const CALLERS: usize = 16;
/// The bare baseline's connections: as many as the agent's pool has (entities/backend.rs), so
/// that both have the same connections to the server; 16 callers share them.
const CONNECTIONS: usize = 8;
const CALLS: usize = 4_000;
const OBJECTS: usize = 1_000;

/// One connection of the bare baseline, with its statements prepared once (as the agent's
/// are, per pooled connection).
struct Bare {
    client: tokio_postgres::Client,
    read: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
}

/// The bare baseline's table and pool: `connections` clients.
async fn bare(connections: usize) -> (Arc<Vec<Bare>>, String) {
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(connect().await);
    }
    let table = format!("bench_bare_{}", std::process::id());
    clients[0]
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id text COLLATE \"C\" PRIMARY KEY, \
             version bigint NOT NULL, deleted boolean NOT NULL DEFAULT false, state jsonb NOT NULL, \
             attempt text NOT NULL)"
        ))
        .await
        .unwrap();
    let mut bare = Vec::new();
    for client in clients {
        let read = format!("SELECT version, state FROM {table} WHERE id = $1");
        let insert = format!(
            "INSERT INTO {table} (id, version, state, attempt) VALUES ($1, 1, $2, $3) \
             ON CONFLICT (id) DO NOTHING"
        );
        let update = format!(
            "UPDATE {table} SET version = version + 1, state = $3, attempt = $4 \
             WHERE id = $1 AND version = $2"
        );
        let (read, insert, update) = (
            client.prepare(&read).await.unwrap(),
            client.prepare(&insert).await.unwrap(),
            client.prepare(&update).await.unwrap(),
        );
        bare.push(Bare {
            client,
            read,
            insert,
            update,
        });
    }
    (Arc::new(bare), table)
}

/// One bare transition: read, then compare-and-set, again on a lost write.
async fn bare_transit(bare: &Bare, id: &str, n: i64) {
    let client = &bare.client;
    loop {
        let row = client.query_opt(&bare.read, &[&id]).await.unwrap();
        let state = serde_json::json!({ "available": n });
        let state = tokio_postgres::types::Json(state);
        let attempt = format!("{n}");
        let changed = match row {
            None => client.execute(&bare.insert, &[&id, &state, &attempt]).await,
            Some(row) => {
                let version: i64 = row.get(0);
                let changes = [&id as _, &version as _, &state as _, &attempt as _];
                client.execute(&bare.update, &changes).await
            }
        };
        if changed.unwrap() == 1 {
            return;
        }
    }
}

#[tokio::main]
async fn main() {
    let port = free_port();
    let application = format!("bench-{}", std::process::id());
    let context = "storage: postgres://127.0.0.1:5432/toa\n";
    let components = ["agent/tests/components/stock-retry"];
    let agent = compose(port, (&application, context), &components, &[]);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://127.0.0.1:{port}/v1/call/fulfilment.stock");
    wait_ready(&http, port).await;
    let (clients, table) = bare(CONNECTIONS).await;
    let mut plain_many = None;
    for (name, objects) in [("hot", 1), ("many", OBJECTS)] {
        let url = format!("{base}/transit");
        let http = http.clone();
        let ours = measure(CALLERS, CALLS, move |n| {
            let (http, url) = (http.clone(), url.clone());
            let body = format!(
                r#"{{"query": {{"id": "{name}-{}"}}, "input": {{"available": {n}}}}}"#,
                n % objects
            );
            async move { post(&http, &url, body).await }
        })
        .await;
        let clients = clients.clone();
        let baseline = measure(CALLERS, CALLS, move |n| {
            let clients = clients.clone();
            async move {
                let id = format!("{name}-{}", n % objects);
                bare_transit(&clients[n % CONNECTIONS], &id, n as i64).await;
            }
        })
        .await;
        line(
            &format!("transit_{name}_p50_us"),
            ours.p50,
            Some(baseline.p50),
        );
        line(
            &format!("transit_{name}_per_s"),
            ours.rate,
            Some(baseline.rate),
        );
        plain_many = Some(ours);
    }
    keyed(&http, &base, plain_many.expect("measured")).await;
    observation(&http, &base, &clients).await;
    line("agent_rss_mb", rss_mb(agent.0.id()), None);
    clients[0]
        .client
        .batch_execute(&format!(
            "DROP TABLE {table}; DROP SCHEMA IF EXISTS \"toa_{application}\" CASCADE"
        ))
        .await
        .unwrap();
}

/// The same transitions on many objects, each with a caller's idempotency key: the store keeps
/// its record in the write's transaction (four statements instead of one). Against the plain
/// ones (`plain`), to show what the record costs.
async fn keyed(http: &reqwest::Client, base: &str, plain: common::Figures) {
    let url = format!("{base}/transit");
    let client = http.clone();
    let run = std::process::id();
    let ours = measure(CALLERS, CALLS, move |n| {
        let (http, url) = (client.clone(), url.clone());
        let body = format!(
            r#"{{"query": {{"id": "many-{}"}}, "input": {{"available": {n}}}, "key": "k-{run}-{n}"}}"#,
            n % OBJECTS
        );
        async move { post(&http, &url, body).await }
    })
    .await;
    line("transit_keyed_p50_us", ours.p50, Some(plain.p50));
    line("transit_keyed_per_s", ours.rate, Some(plain.rate));
}

/// `observe` through the agent, one caller, against a bare SELECT plus a bare loopback HTTP
/// round trip.
async fn observation(http: &reqwest::Client, base: &str, clients: &Arc<Vec<Bare>>) {
    let url = format!("{base}/observe");
    let client = http.clone();
    let ours = measure(1, 2_000, move |n| {
        let (http, url) = (client.clone(), url.clone());
        let body = format!(r#"{{"query": {{"id": "many-{}"}}}}"#, n % OBJECTS);
        async move { post(&http, &url, body).await }
    })
    .await;
    let clients = clients.clone();
    let select = measure(1, 2_000, move |n| {
        let clients = clients.clone();
        async move {
            let id = format!("many-{}", n % OBJECTS);
            clients[0]
                .client
                .query_opt(&clients[0].read, &[&id])
                .await
                .unwrap();
        }
    })
    .await;
    let echo = echo_server().await;
    let client = http.clone();
    let round_trip = measure(1, 2_000, move |_| {
        let (http, echo) = (client.clone(), echo.clone());
        async move { post(&http, &echo, "{}".to_owned()).await }
    })
    .await;
    line(
        "observe_p50_us",
        ours.p50,
        Some(select.p50 + round_trip.p50),
    );
}

/// A loopback HTTP server answering every POST with `{}`: a bare local call.
async fn echo_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "{}" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}
