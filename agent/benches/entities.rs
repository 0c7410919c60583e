//! Entities through the agent against PostgreSQL, against bare tokio-postgres from the same
//! process, on the tests' server (scripts/services: 127.0.0.1:5432, role and database toa).
//!
//!   cargo bench -p toa-agent --bench entities
//!
//! `TOA_BENCH_AGENT=<path>` runs another build of the agent (an earlier commit's, say).
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>` (`-` where a line has no baseline); latencies
//! in µs, rates per second, RSS in MB.
//!
//! - Ours: a caller → the agent's local API (HTTP) → the inherited `transit` (read,
//!   compare-and-set) → PostgreSQL, and back; the program is not asked (the inherited operations
//!   are the agent's).
//! - The baseline: the same read and compare-and-set update, sent by this process straight to
//!   the server over as many connections as the agent's pool (8), its statements prepared once as
//!   the agent's are, two callers pinned to each connection and their statements pipelined on it
//!   (tokio-postgres sends those of concurrent callers on one connection together).
//!   `transit_many_pooled`: the same with one statement at a time on a connection, as the agent
//!   and any caller of a pool send them.
//! - Transitions are measured in rounds, each load in turn (a shared VM's speed drifts within a
//!   run): the medians, the lowest and highest round's ratio, and where each process's CPU went,
//!   in µs per transition: the agent's, PostgreSQL's (all its processes, those that ended
//!   meanwhile included) and this process's (the callers').
//! - `transit_hot_bare_retries_per_success`: the bare client's lost writes on the hot object,
//!   each read and made again, per transition stored (the agent loses none to itself: it takes
//!   turns on an object for its own calls).
//! - `transit_program`: seed 003's `reserve` on the same objects, its function run by the
//!   component's program (the Python SDK's), against the inherited `transit` through the agent.
//! - Observation: `observe` through the agent, one caller, against a bare SELECT plus one bare
//!   loopback HTTP round trip to another process (the local call a caller makes), each timed
//!   alone and summed, and timed as one (the call, then the SELECT), and against a
//!   bare reader: a process of its own serving the same request over HTTP with one prepared
//!   SELECT (what any sidecar that reads for its caller does at the least). In rounds too.

use std::sync::Arc;

mod common;
use common::{
    compose, connect, cpu_seconds, cpu_seconds_named, free_port, line, measure, post, posts,
    rss_mb, wait_ready,
};

const CALLERS: usize = 16;
/// The argument that makes this executable the observation baseline's echo server.
const ECHO: &str = "--echo";
/// The argument that makes this executable the bare reader (of the table named next).
const READER: &str = "--reader";
/// Observations per round, one caller.
const OBSERVATIONS: usize = 500;
/// The bare baseline's connections: as many as the agent's pool has (entities/backend.rs), so
/// that both have the same connections to the server; 16 callers share them.
const CONNECTIONS: usize = 8;
const CALLS: usize = 4_000;
/// Rounds of ours and of the baselines in turn, so that a machine whose speed drifts during the
/// run (a shared VM's does) weighs on each alike; the medians are reported, and the lowest and
/// highest round's ratio. Even, so that each load of two comes first as often.
const ROUNDS: usize = 6;
const OBJECTS: usize = 1_000;
/// The objects of the two loads: one, and many.
const HOT: (&str, usize) = ("hot", 1);
const MANY: (&str, usize) = ("many", OBJECTS);

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
    let turn = || async {
        match pooled {
            true => Some(bare.turn.lock().await),
            false => None,
        }
    };
    let state = tokio_postgres::types::Json(serde_json::json!({ "available": n }));
    let attempt = format!("{n}");
    loop {
        let alone = turn().await;
        let row = client.query_opt(&bare.read, &[&id]).await.unwrap();
        drop(alone);
        let alone = turn().await;
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
        BARE_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The bare baseline's writes lost to another of its callers, each made again (read anew).
static BARE_LOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == ECHO) {
        return echo().await;
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|a| a == READER) {
        return reader(&args[position + 1]).await;
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
    let id = agent.0.id();
    let (ours, bare) = (
        transit(&http, &base, HOT),
        bare_transit_load(&clients, HOT, false),
    );
    let [ours, bare] = <[Measured; 2]>::try_from(rounds(id, &[&ours, &bare]).await)
        .ok()
        .unwrap();
    report("transit_hot", &ours, &bare);
    // The agent takes turns on an object for its own calls, so it loses no write to itself;
    // its retries across processes are the engine's figures (docs/benchmarks.md).
    let lost = BARE_LOST.load(std::sync::atomic::Ordering::Relaxed);
    line(
        "transit_hot_bare_retries_per_success",
        lost as f64 / (ROUNDS * CALLS) as f64,
        None,
    );
    let ours = transit(&http, &base, MANY);
    let bare = bare_transit_load(&clients, MANY, false);
    let pooled = bare_transit_load(&clients, MANY, true);
    let measured = rounds(id, &[&ours, &bare, &pooled]).await;
    let [ours, bare, pooled] = <[Measured; 3]>::try_from(measured).ok().unwrap();
    let plain_many = report("transit_many", &ours, &bare);
    report("transit_many_pooled", &ours, &pooled);
    keyed(&http, &base, plain_many).await;
    programmed(&http, &base, plain_many).await;
    observation(&http, &base, &clients, (id, &table)).await;
    line("agent_rss_mb", rss_mb(agent.0.id()), None);
    clients[0]
        .client
        .batch_execute(&format!(
            "DROP TABLE {table}; DROP SCHEMA IF EXISTS \"toa_{application}\" CASCADE"
        ))
        .await
        .unwrap();
}

/// One load of calls, made anew each time it is called: its figures.
type Load = Box<dyn Fn() -> futures::future::BoxFuture<'static, common::Figures>>;

/// One load of `transit` calls through the agent on `objects` objects named `<name>-<i>`.
fn transit(http: &reqwest::Client, base: &str, (name, objects): (&'static str, usize)) -> Load {
    let (http, url) = (http.clone(), format!("{base}/transit"));
    Box::new(move || {
        Box::pin(posts(
            http.clone(),
            url.clone(),
            (CALLERS, CALLS),
            move |n| {
                format!(
                    r#"{{"query": {{"id": "{name}-{}"}}, "input": {{"available": {n}}}}}"#,
                    n % objects
                )
            },
        ))
    })
}

/// One load of the bare baseline's transitions on the same objects (in its own table).
fn bare_transit_load(
    clients: &Arc<Vec<Bare>>,
    (name, objects): (&'static str, usize),
    pooled: bool,
) -> Load {
    let clients = clients.clone();
    Box::new(move || {
        let clients = clients.clone();
        Box::pin(measure(CALLERS, CALLS, move |n| {
            let clients = clients.clone();
            async move {
                let id = format!("{name}-{}", n % objects);
                bare_transit(&clients[n % CONNECTIONS], &id, n as i64, pooled).await;
            }
        }))
    })
}

/// What [`ROUNDS`] rounds of one load gave: each round's figures, and the CPU spent in all.
#[derive(Default)]
struct Measured {
    rounds: Vec<common::Figures>,
    cpu: Cpu,
}

impl Measured {
    fn median(&self, of: fn(&common::Figures) -> f64) -> f64 {
        common::median(self.rounds.iter().map(of).collect())
    }
}

/// [`ROUNDS`] rounds of `loads`, each round starting with the next load in turn (so that the
/// machine's drift, and what one load leaves the server to do, falls on each alike).
async fn rounds(agent: u32, loads: &[&Load]) -> Vec<Measured> {
    let mut measured: Vec<Measured> = loads.iter().map(|_| Measured::default()).collect();
    for round in 0..ROUNDS {
        for turn in 0..loads.len() {
            let which = (round + turn) % loads.len();
            let before = Cpu::now(agent);
            let figures = loads[which]().await;
            measured[which].cpu = measured[which].cpu + (Cpu::now(agent) - before);
            measured[which].rounds.push(figures);
        }
    }
    measured
}

/// Prints ours against `baseline` (`<name>_p50_us`, `<name>_per_s`, the lowest and highest
/// round's throughput ratio, the CPU per call); ours' medians.
fn report(name: &str, ours: &Measured, baseline: &Measured) -> common::Figures {
    let figures = common::Figures {
        p50: ours.median(|f| f.p50),
        p99: ours.median(|f| f.p99),
        rate: ours.median(|f| f.rate),
    };
    line(
        &format!("{name}_p50_us"),
        figures.p50,
        Some(baseline.median(|f| f.p50)),
    );
    line(
        &format!("{name}_per_s"),
        figures.rate,
        Some(baseline.median(|f| f.rate)),
    );
    let rates = |m: &Measured| m.rounds.iter().map(|f| f.rate).collect::<Vec<_>>();
    let mut pairs: Vec<(f64, f64)> = rates(ours).into_iter().zip(rates(baseline)).collect();
    pairs.sort_by(|(o, b), (p, c)| (o / b).total_cmp(&(p / c)));
    let (lowest, highest) = (pairs[0], pairs[pairs.len() - 1]);
    line(
        &format!("{name}_per_s_lowest_round"),
        lowest.0,
        Some(lowest.1),
    );
    line(
        &format!("{name}_per_s_highest_round"),
        highest.0,
        Some(highest.1),
    );
    let calls = (ROUNDS * CALLS) as f64;
    (ours.cpu / calls).lines(name, &(baseline.cpu / calls));
    figures
}

/// CPU seconds so far of the agent, of PostgreSQL's processes and of this process.
#[derive(Clone, Copy, Default)]
struct Cpu([f64; 3]);

impl Cpu {
    const PARTS: [&str; 3] = ["agent", "server", "callers"];

    fn now(agent: u32) -> Self {
        Self([
            cpu_seconds(agent),
            cpu_seconds_named("postgres"),
            cpu_seconds(std::process::id()),
        ])
    }

    /// `BENCH <name>_cpu_<part>_us_per_call <ours> <baseline>` for each part, in µs per call;
    /// for the agent, `<name>_cpu_agent_idle_us_per_call`: what it spent during the baseline's
    /// load, which should be about nothing (else the windows are not what they seem).
    fn lines(&self, name: &str, baseline: &Cpu) {
        for (i, part) in Self::PARTS.iter().enumerate() {
            let (ours, bare) = (self.0[i] * 1e6, baseline.0[i] * 1e6);
            if *part == "agent" {
                line(&format!("{name}_cpu_agent_us_per_call"), ours, None);
                line(&format!("{name}_cpu_agent_idle_us_per_call"), bare, None);
            } else {
                line(&format!("{name}_cpu_{part}_us_per_call"), ours, Some(bare));
            }
        }
    }

    fn zip(self, other: Cpu, f: fn(f64, f64) -> f64) -> Cpu {
        Cpu(std::array::from_fn(|i| f(self.0[i], other.0[i])))
    }
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        self.zip(earlier, |a, b| a - b)
    }
}

impl std::ops::Add for Cpu {
    type Output = Cpu;
    fn add(self, other: Cpu) -> Cpu {
        self.zip(other, |a, b| a + b)
    }
}

impl std::ops::Div<f64> for Cpu {
    type Output = Cpu;
    fn div(self, calls: f64) -> Cpu {
        Cpu(self.0.map(|part| part / calls))
    }
}

/// The same transitions on many objects, each with a caller's idempotency key: the store keeps
/// its record in the write's transaction (four statements instead of one). Against the plain
/// ones (`plain`), to show what the record costs.
async fn keyed(http: &reqwest::Client, base: &str, plain: common::Figures) {
    let run = std::process::id();
    let url = format!("{base}/transit");
    let ours = posts(http.clone(), url, (CALLERS, CALLS), move |n| {
        format!(
            r#"{{"query": {{"id": "many-{}"}}, "input": {{"available": {n}}}, "key": "k-{run}-{n}"}}"#,
            n % OBJECTS
        )
    })
    .await;
    line("transit_keyed_p50_us", ours.p50, Some(plain.p50));
    line("transit_keyed_per_s", ours.rate, Some(plain.rate));
}

/// Seed 003's `reserve` on the same objects: a transition whose function the program runs (the
/// Python SDK's), each attempt a request to it, against the agent's own inherited `transit`
/// (`plain`). Every object is stocked first, so that no reserve runs out.
async fn programmed(http: &reqwest::Client, base: &str, plain: common::Figures) {
    use futures::StreamExt;
    let transit = format!("{base}/transit");
    let stocked = futures::stream::iter(0..OBJECTS).for_each_concurrent(CALLERS, |n| {
        let body =
            format!(r#"{{"query": {{"id": "many-{n}"}}, "input": {{"available": 1000000}}}}"#);
        post(http, &transit, body)
    });
    stocked.await;
    let url = format!("{base}/reserve");
    let ours = posts(http.clone(), url, (CALLERS, CALLS), |n| {
        format!(
            r#"{{"query": {{"id": "many-{}"}}, "input": {{"quantity": 1}}}}"#,
            n % OBJECTS
        )
    })
    .await;
    line("transit_program_p50_us", ours.p50, Some(plain.p50));
    line("transit_program_per_s", ours.rate, Some(plain.rate));
}

/// `observe` through the agent (`agent`, its pid), one caller, in rounds against a bare SELECT
/// plus a bare loopback HTTP round trip, and against the bare reader of `table`.
async fn observation(
    http: &reqwest::Client,
    base: &str,
    clients: &Arc<Vec<Bare>>,
    (agent, table): (u32, &str),
) {
    let (echo, _echo) = echo_server();
    let (read, reader) = common::helper(&[READER, table]);
    assert!(read.starts_with("http://"), "the bare reader did not start");
    let reader_pid = reader.id();
    let _reader = common::Process(reader);
    let ours = observe(http, format!("{base}/observe"));
    let bare_reader = observe(http, read);
    let both = select_then_call(http, &echo, clients.clone());
    let clients = clients.clone();
    let select: Load = Box::new(move || {
        let clients = clients.clone();
        Box::pin(measure(1, OBSERVATIONS, move |n| {
            let clients = clients.clone();
            async move {
                let id = format!("many-{}", n % OBJECTS);
                let bare = &clients[0];
                bare.client.query_opt(&bare.read, &[&id]).await.unwrap();
            }
        }))
    });
    let (http, echo) = (http.clone(), echo.clone());
    let round_trip: Load = Box::new(move || {
        let (http, echo) = (http.clone(), echo.clone());
        Box::pin(measure(1, OBSERVATIONS, move |_| {
            let (http, echo) = (http.clone(), echo.clone());
            async move { post(&http, &echo, "{}".to_owned()).await }
        }))
    });
    // Where each side's time goes besides its work: its CPU and how often its threads are
    // switched out. Counted over all four loads' rounds: each process is idle in the others'
    // (a few wake-ups a second, against thousands in its own).
    let counts = |pid: u32| (cpu_seconds(pid), common::context_switches(pid));
    let before = [counts(agent), counts(reader_pid)];
    let loads = [&ours, &bare_reader, &select, &round_trip, &both];
    let measured = rounds(agent, &loads).await;
    let after = [counts(agent), counts(reader_pid)];
    let [ours, bare_reader, select, round_trip, both] =
        <[Measured; 5]>::try_from(measured).ok().unwrap();
    // The goal's baseline, each round's own: its SELECT's p50 plus its round trip's.
    let sums: Vec<f64> = (select.rounds.iter().zip(&round_trip.rounds))
        .map(|(select, round_trip)| select.p50 + round_trip.p50)
        .collect();
    let p50 = |f: &common::Figures| f.p50;
    line(
        "observe_p50_us",
        ours.median(p50),
        Some(common::median(sums.clone())),
    );
    let mut ratios: Vec<f64> = (ours.rounds.iter().zip(&sums))
        .map(|(ours, sum)| ours.p50 / sum)
        .collect();
    ratios.sort_by(f64::total_cmp);
    line("observe_p50_lowest_round_ratio", ratios[0], None);
    line(
        "observe_p50_highest_round_ratio",
        ratios[ratios.len() - 1],
        None,
    );
    line(
        "observe_p50_us_vs_bare_reader",
        ours.median(p50),
        Some(bare_reader.median(p50)),
    );
    line(
        "observe_p50_us_vs_select_then_call",
        ours.median(p50),
        Some(both.median(p50)),
    );
    line("observe_baseline_select_p50_us", select.median(p50), None);
    line(
        "observe_baseline_local_call_p50_us",
        round_trip.median(p50),
        None,
    );
    let calls = (ROUNDS * OBSERVATIONS) as f64;
    let [agent, reader] = [0, 1].map(|i| {
        let ((cpu, switches), (cpu_before, switches_before)) = (after[i], before[i]);
        (
            (cpu - cpu_before) * 1e6 / calls,
            // Signed: a thread that ended meanwhile takes its count with it.
            (switches as i64 - switches_before as i64) as f64 / calls,
        )
    });
    line(
        "observe_cpu_agent_us_per_call_vs_bare_reader",
        agent.0,
        Some(reader.0),
    );
    // PostgreSQL's own, each side's rounds: the same read of the same kind of row.
    line(
        "observe_cpu_server_us_per_call_vs_bare_reader",
        ours.cpu.0[1] * 1e6 / calls,
        Some(bare_reader.cpu.0[1] * 1e6 / calls),
    );
    line(
        "observe_context_switches_agent_per_call_vs_bare_reader",
        agent.1,
        Some(reader.1),
    );
}

/// The issue's baseline timed as one: a caller's local call (to the echo server, another
/// process) and then its own prepared SELECT, one after the other, each op both.
fn select_then_call(http: &reqwest::Client, echo: &str, clients: Arc<Vec<Bare>>) -> Load {
    let (http, echo) = (http.clone(), echo.to_owned());
    Box::new(move || {
        let (http, echo, clients) = (http.clone(), echo.clone(), clients.clone());
        Box::pin(measure(1, OBSERVATIONS, move |n| {
            let (http, echo, clients) = (http.clone(), echo.clone(), clients.clone());
            async move {
                post(&http, &echo, "{}".to_owned()).await;
                let id = format!("many-{}", n % OBJECTS);
                let bare = &clients[0];
                bare.client.query_opt(&bare.read, &[&id]).await.unwrap();
            }
        }))
    })
}

/// One caller's load of `observe` requests on the many objects to `url` (the agent's, or the
/// bare reader's).
fn observe(http: &reqwest::Client, url: String) -> Load {
    let http = http.clone();
    Box::new(move || {
        let (http, url) = (http.clone(), url.clone());
        Box::pin(measure(1, OBSERVATIONS, move |n| {
            let (http, url) = (http.clone(), url.clone());
            let body = format!(r#"{{"query": {{"id": "many-{}"}}}}"#, n % OBJECTS);
            async move { post(&http, &url, body).await }
        }))
    })
}

/// The bare reader's process: one connection with the bare table's read prepared, and an HTTP
/// server answering `{"query": {"id": …}}` with the object (its state, `id` and `VERSION`) or
/// `null`; prints its address, then serves until killed or its parent is gone.
async fn reader(table: &str) {
    use axum::extract::{Json, State};
    common::exit_with_parent();
    let client = connect().await;
    let read = client
        .prepare(&format!("SELECT version, state FROM {table} WHERE id = $1"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("http://{}/", listener.local_addr().unwrap());
    let state = Arc::new((client, read));
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::post(
                |State(state): State<Arc<(tokio_postgres::Client, tokio_postgres::Statement)>>,
                 Json(request): Json<serde_json::Value>| async move {
                    let id = request["query"]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let row = state.0.query_opt(&state.1, &[&id]).await.unwrap();
                    Json(row.map(|row| {
                        let tokio_postgres::types::Json(mut object): tokio_postgres::types::Json<
                            serde_json::Value,
                        > = row.get(1);
                        object["id"] = id.into();
                        object["VERSION"] = row.get::<_, i64>(0).into();
                        object
                    }))
                },
            ),
        )
        .with_state(state);
    axum::serve(listener, app).await.unwrap();
}

/// A loopback HTTP server answering every POST with `{}`, in a process of its own (as a
/// caller's agent is: a local call wakes another process, and so does its answer): this bench's
/// executable again, with [`ECHO`]. Its address, and the process (killed when dropped).
fn echo_server() -> (String, common::Process) {
    let (url, child) = common::helper(&[ECHO]);
    assert!(url.starts_with("http://"), "the echo server did not start");
    (url, common::Process(child))
}

/// The echo server's process: prints its address, then serves until killed or its parent
/// is gone (its standard input closed).
async fn echo() {
    common::exit_with_parent();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "{}" }));
    axum::serve(listener, app).await.unwrap();
}
