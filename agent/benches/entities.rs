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
//! the agent's are, and the 16 callers' statements pipelined on them (tokio-postgres sends those
//! of concurrent callers on one connection together); `transit_many_pooled`, the same with one
//! statement at a time on a connection, as a caller of a pool sends them. Observation:
//! `observe` through the agent against a bare SELECT plus one bare loopback HTTP round trip to
//! another process (the local call a caller makes).
//! Transitions are measured in rounds, ours and the baseline in turn (a shared VM's speed drifts
//! within a run): the medians, each round's ratio, and where each process's CPU went, in µs per
//! transition: the agent's, PostgreSQL's (all its processes) and this process's (the callers').

use std::sync::Arc;

mod common;
use common::{
    compose, connect, cpu_seconds, cpu_seconds_named, free_port, line, measure, post, rss_mb,
    wait_ready,
};

const CALLERS: usize = 16;
/// The bare baseline's connections: as many as the agent's pool has (entities/backend.rs), so
/// that both have the same connections to the server; 16 callers share them.
const CONNECTIONS: usize = 8;
const CALLS: usize = 4_000;
/// Loads of ours and of the baseline in turn, the order swapped each round, so that a machine
/// whose speed drifts during the run (a shared VM's does) weighs on both alike; the medians are
/// reported, and each round's ratio.
const ROUNDS: usize = 5;
const OBJECTS: usize = 1_000;

/// One connection of the bare baseline, with its statements prepared once (as the agent's
/// are, per pooled connection).
struct Bare {
    /// Taken for each statement by the pooled baseline.
    turn: tokio::sync::Mutex<()>,
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
            turn: tokio::sync::Mutex::new(()),
            client,
            read,
            insert,
            update,
        });
    }
    (Arc::new(bare), table)
}

/// One bare transition: read, then compare-and-set, again on a lost write. `pooled`: each
/// statement alone on its connection; else pipelined with the other callers' on it.
async fn bare_transit(bare: &Bare, id: &str, n: i64, pooled: bool) {
    let client = &bare.client;
    let turn = || async { pooled.then_some(bare.turn.lock().await) };
    loop {
        let alone = turn().await;
        let row = client.query_opt(&bare.read, &[&id]).await.unwrap();
        drop(alone);
        let alone = turn().await;
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
        drop(alone);
        if changed.unwrap() == 1 {
            return;
        }
    }
}

#[tokio::main]
async fn main() {
    if std::env::var_os(ECHO).is_some() {
        return echo().await;
    }
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
        let ours = transit(&http, &base, (name, objects));
        let bare = bare_transit_load(&clients, (name, objects), false);
        plain_many = Some(rounds(&format!("transit_{name}"), agent.0.id(), &ours, bare).await);
    }
    // Against a bare client whose connections serve one statement at a time (a pool's).
    let ours = transit(&http, &base, ("many", OBJECTS));
    let pooled = bare_transit_load(&clients, ("many", OBJECTS), true);
    rounds("transit_many_pooled", agent.0.id(), &ours, pooled).await;
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

/// One load of `transit` calls through the agent on `objects` objects named `<name>-<i>`.
fn transit(
    http: &reqwest::Client,
    base: &str,
    (name, objects): (&'static str, usize),
) -> impl Fn() -> futures::future::BoxFuture<'static, common::Figures> {
    let (http, url) = (http.clone(), format!("{base}/transit"));
    move || {
        let (http, url) = (http.clone(), url.clone());
        Box::pin(measure(CALLERS, CALLS, move |n| {
            let (http, url) = (http.clone(), url.clone());
            let body = format!(
                r#"{{"query": {{"id": "{name}-{}"}}, "input": {{"available": {n}}}}}"#,
                n % objects
            );
            async move { post(&http, &url, body).await }
        }))
    }
}

/// One load of the bare baseline's transitions on the same objects (in its own table).
fn bare_transit_load(
    clients: &Arc<Vec<Bare>>,
    (name, objects): (&'static str, usize),
    pooled: bool,
) -> impl Fn() -> futures::future::BoxFuture<'static, common::Figures> {
    let clients = clients.clone();
    move || {
        let clients = clients.clone();
        Box::pin(measure(CALLERS, CALLS, move |n| {
            let clients = clients.clone();
            async move {
                let id = format!("{name}-{}", n % objects);
                bare_transit(&clients[n % CONNECTIONS], &id, n as i64, pooled).await;
            }
        }))
    }
}

/// [`ROUNDS`] rounds of `ours` and `bare` in turn; prints the medians' lines (`<name>_p50_us`,
/// `<name>_per_s`), each round's throughput ratio, and where the CPU went (per call, over all
/// rounds). Returns ours: the median p50 and rate.
async fn rounds<F, G>(name: &str, agent: u32, ours: &F, bare: G) -> common::Figures
where
    F: Fn() -> futures::future::BoxFuture<'static, common::Figures>,
    G: Fn() -> futures::future::BoxFuture<'static, common::Figures>,
{
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    let (mut mine_cpu, mut their_cpu) = (Cpu::default(), Cpu::default());
    for round in 0..ROUNDS {
        for ours_now in [round % 2 == 0, round % 2 == 1] {
            let before = Cpu::now(agent);
            let figures = if ours_now { ours().await } else { bare().await };
            let spent = Cpu::now(agent) - before;
            if ours_now {
                mine.push(figures);
                mine_cpu = mine_cpu + spent;
            } else {
                theirs.push(figures);
                their_cpu = their_cpu + spent;
            }
        }
    }
    let median = |figures: &[common::Figures], of: fn(&common::Figures) -> f64| {
        let mut values: Vec<f64> = figures.iter().map(of).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let ours = common::Figures {
        p50: median(&mine, |f| f.p50),
        p99: median(&mine, |f| f.p99),
        rate: median(&mine, |f| f.rate),
    };
    line(
        &format!("{name}_p50_us"),
        ours.p50,
        Some(median(&theirs, |f| f.p50)),
    );
    line(
        &format!("{name}_per_s"),
        ours.rate,
        Some(median(&theirs, |f| f.rate)),
    );
    let ratios: Vec<String> = mine
        .iter()
        .zip(&theirs)
        .map(|(m, t)| format!("{:.2}", m.rate / t.rate))
        .collect();
    println!("BENCH {name}_per_s ratio by round: {}", ratios.join(" "));
    let calls = (ROUNDS * CALLS) as f64;
    (mine_cpu / calls).lines(name, &(their_cpu / calls));
    ours
}

/// CPU seconds so far of the agent, of PostgreSQL's processes and of this process.
#[derive(Clone, Copy, Default)]
struct Cpu {
    agent: f64,
    server: f64,
    callers: f64,
}

impl Cpu {
    fn now(agent: u32) -> Self {
        Self {
            agent: cpu_seconds(agent),
            server: cpu_seconds_named("postgres"),
            callers: cpu_seconds(std::process::id()),
        }
    }

    /// `BENCH <name>_cpu_<part>_us_per_call ours baseline` for each part (µs per call).
    fn lines(&self, name: &str, baseline: &Cpu) {
        let us = |s: f64| s * 1e6;
        line(
            &format!("{name}_cpu_agent_us_per_call"),
            us(self.agent),
            None,
        );
        let parts = [("server", self.server, baseline.server)];
        let parts = parts
            .into_iter()
            .chain([("callers", self.callers, baseline.callers)]);
        for (part, ours, bare) in parts {
            let name = format!("{name}_cpu_{part}_us_per_call");
            line(&name, us(ours), Some(us(bare)));
        }
    }
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            agent: self.agent - earlier.agent,
            server: self.server - earlier.server,
            callers: self.callers - earlier.callers,
        }
    }
}

impl std::ops::Add for Cpu {
    type Output = Cpu;
    fn add(self, other: Cpu) -> Cpu {
        Cpu {
            agent: self.agent + other.agent,
            server: self.server + other.server,
            callers: self.callers + other.callers,
        }
    }
}

impl std::ops::Div<f64> for Cpu {
    type Output = Cpu;
    fn div(self, calls: f64) -> Cpu {
        Cpu {
            agent: self.agent / calls,
            server: self.server / calls,
            callers: self.callers / calls,
        }
    }
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
    let (echo, _echo) = echo_server();
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
    let (select, round_trip) = (select.p50, round_trip.p50);
    println!("BENCH observe_baseline: a SELECT {select:.1} us, a local call {round_trip:.1} us");
}

/// A loopback HTTP server answering every POST with `{}`, in a process of its own (as a
/// caller's agent is: a local call wakes another process, and so does its answer): this bench's
/// executable again, with [`ECHO`] set. Its address, and the process (killed when dropped).
fn echo_server() -> (String, common::Process) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(ECHO, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufReader::new(stdout).read_line(&mut url).unwrap();
    (url.trim().to_owned(), common::Process(child))
}

/// Set in the environment of the echo server's process.
const ECHO: &str = "TOA_BENCH_ECHO";

/// The echo server's process: prints its address, then serves until killed.
async fn echo() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "{}" }));
    axum::serve(listener, app).await.unwrap();
}
