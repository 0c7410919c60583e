//! Benchmark of the coordination primitives on three local Redis servers of its own.
//!
//!   cargo bench -p toa-tests --bench atom
//!
//! Prints `BENCH <name> <ours> <baseline> <ratio>` (baseline and ratio `-` where there is none).
//! Latencies in microseconds, rates per second. Baselines run in the same process on the same
//! servers: the floor (two parallel raw round trips per cycle: SET NX PX on the three servers, then
//! the release script on the three) and the crate `rslock` (unlimited retries, the same TTL, the
//! redis-rs default response timeout of 500 ms).

use futures::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::Script;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toa_agent::atom::meter::Meter;
use toa_agent::{Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Atomicity, Credentials};
use toa_tests::{atomicity_env, RedisServer, Worker};

const TTL: Duration = Duration::from_secs(2);
/// Cycles per measurement: enough for a stable p99 with one task, and a second or more of load
/// with 32.
fn cycles(tasks: usize) -> usize {
    if tasks == 1 {
        3000
    } else {
        20_000
    }
}
/// The time one contender gets in all its rounds of one comparison.
const BUDGET: Duration = Duration::from_secs(24);

fn line(name: &str, ours: f64, baseline: Option<f64>) {
    match baseline {
        Some(b) => println!("BENCH {name} {ours:.1} {b:.1} {:.2}", ours / b),
        None => println!("BENCH {name} {ours:.1} - -"),
    }
}

#[derive(Clone, Copy)]
struct Figures {
    p50: f64,
    p99: f64,
    rate: f64,
}

/// Latencies (µs) of successful cycles and the time they took.
struct Run {
    latencies: Vec<f64>,
    seconds: f64,
}

/// One measured cycle for a task index; true when it succeeded.
type Cycle = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

fn cycle<F, Fut>(f: F) -> Cycle
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    Arc::new(move |task| Box::pin(f(task)))
}

/// Runs `cycle` in `tasks` concurrent tasks (task index given) for `count` cycles or `budget`.
async fn run(tasks: usize, count: usize, budget: Duration, cycle: &Cycle) -> Run {
    let started = Instant::now();
    let per_task = count.div_ceil(tasks);
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    if started.elapsed() > budget {
                        break;
                    }
                    let t = Instant::now();
                    if cycle(task).await {
                        latencies.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for handle in handles {
        latencies.extend(handle.await.unwrap());
    }
    Run {
        latencies,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn figures(runs: Vec<Run>) -> Figures {
    let seconds: f64 = runs.iter().map(|r| r.seconds).sum();
    let mut all: Vec<f64> = runs.into_iter().flat_map(|r| r.latencies).collect();
    all.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Figures {
        p50: pick(0.5),
        p99: pick(0.99),
        rate: all.len() as f64 / seconds,
    }
}

/// Measures `ours` against `baselines` in alternating rounds (so drift in the machine's load
/// falls on all of them alike). A single task alternates in short rounds: its round trips switch
/// between a fast and a slow regime (about 15 against 75 µs for one Redis call, seen here as the
/// threads happen to park or not), which long rounds would hand to one side.
async fn compare(tasks: usize, ours: Cycle, baselines: Vec<Cycle>) -> (Figures, Vec<Figures>) {
    let rounds = if tasks == 1 { 30 } else { 3 };
    let count = cycles(tasks) / rounds;
    let budget = BUDGET / rounds as u32;
    let mut ours_runs = Vec::new();
    let mut baseline_runs: Vec<Vec<Run>> = baselines.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        ours_runs.push(run(tasks, count, budget, &ours).await);
        for (baseline, runs) in baselines.iter().zip(&mut baseline_runs) {
            runs.push(run(tasks, count, budget, baseline).await);
        }
    }
    (
        figures(ours_runs),
        baseline_runs.into_iter().map(figures).collect(),
    )
}

fn atom(servers: &[&RedisServer], component: &str, interval: Duration) -> Arc<Atom> {
    let addresses: Vec<String> = servers.iter().map(|s| s.address()).collect();
    let config = AtomConfig {
        scope: Scope::new("bench", component),
        mode: Mode::Pod,
        atomicity: Some(Atomicity::new(&addresses, Some(interval), Some(TTL)).unwrap()),
        credentials: Credentials::default(),
        roots: Default::default(),
        instance: "bench".into(),
        group: None,
    };
    Arc::new(Atom::start(config, Metrics::new()).unwrap())
}

async fn connections(servers: &[&RedisServer]) -> Vec<MultiplexedConnection> {
    let mut list = Vec::new();
    for server in servers {
        let client = redis::Client::open(server.address()).unwrap();
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_millis(500)));
        list.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap(),
        );
    }
    list
}

static FLOOR_RELEASE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| {
    Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
});

/// The three contenders, connected while every server is healthy.
struct Contenders {
    ours: Arc<Atom>,
    floor: Arc<Vec<MultiplexedConnection>>,
    rslock: Arc<rslock::LockManager>,
}

async fn contenders(servers: &[&RedisServer]) -> Contenders {
    let ours = atom(servers, "lock", Duration::from_secs(5));
    // Wait out the delayed-restart quarantine and seed the counters.
    ours.lock("warm", |_| async {}).await.unwrap();
    let mut manager = rslock::LockManager::from_clients(
        servers
            .iter()
            .map(|s| redis::Client::open(s.address()).unwrap())
            .collect(),
    );
    manager.set_retry(u32::MAX, Duration::from_millis(10));
    let manager = Arc::new(manager);
    let warm = manager.lock(b"warm", TTL).await.unwrap();
    manager.unlock(&warm).await;
    Contenders {
        ours,
        floor: Arc::new(connections(servers).await),
        rslock: manager,
    }
}

/// Our lock cycle: acquire and release a key of the task's own.
fn ours_cycle(atom: Arc<Atom>) -> Cycle {
    cycle(move |task| {
        let atom = atom.clone();
        async move {
            let held = atom.acquire(format!("k{task}")).await.unwrap();
            held.release().await;
            true
        }
    })
}

async fn run_lock_benchmarks(contenders: &Contenders, label: &str) {
    let ours_atom = contenders.ours.clone();
    let floor_connections = contenders.floor.clone();
    let manager = contenders.rslock.clone();
    for tasks in [1usize, 32] {
        let ours = ours_cycle(ours_atom.clone());
        let connections = floor_connections.clone();
        let floor = cycle(move |task| {
            let connections = connections.clone();
            async move {
                let key = format!("floor:{task}");
                let value = format!("{:x}", rand::random::<u64>());
                let sets = join_all(connections.iter().map(|c| {
                    let mut c = c.clone();
                    let (key, value) = (key.clone(), value.clone());
                    async move {
                        redis::cmd("SET")
                            .arg(&key)
                            .arg(&value)
                            .arg("NX")
                            .arg("PX")
                            .arg(TTL.as_millis() as u64)
                            .query_async::<Option<String>>(&mut c)
                            .await
                            .ok()
                            .flatten()
                            .is_some()
                    }
                }))
                .await;
                join_all(connections.iter().map(|c| {
                    let mut c = c.clone();
                    let (key, value) = (key.clone(), value.clone());
                    async move {
                        FLOOR_RELEASE
                            .key(&key)
                            .arg(&value)
                            .invoke_async::<i64>(&mut c)
                            .await
                            .is_ok()
                    }
                }))
                .await;
                sets.iter().filter(|ok| **ok).count() >= 2
            }
        });
        let manager2 = manager.clone();
        let rslock = cycle(move |task| {
            let manager = manager2.clone();
            async move {
                match manager.lock(format!("rslock:{task}").as_bytes(), TTL).await {
                    Ok(lock) => {
                        manager.unlock(&lock).await;
                        true
                    }
                    Err(_) => false,
                }
            }
        });
        let (ours, baselines) = compare(tasks, ours, vec![floor, rslock]).await;
        let (floor, rslock) = (baselines[0], baselines[1]);
        let name = |what: &str| format!("lock_{label}_{tasks}tasks_{what}");
        line(&name("p50_us_vs_floor"), ours.p50, Some(floor.p50));
        line(&name("p50_us_vs_rslock"), ours.p50, Some(rslock.p50));
        line(&name("p99_us_vs_floor"), ours.p99, Some(floor.p99));
        line(&name("p99_us_vs_rslock"), ours.p99, Some(rslock.p99));
        line(&name("cycles_per_s_vs_floor"), ours.rate, Some(floor.rate));
        line(
            &name("cycles_per_s_vs_rslock"),
            ours.rate,
            Some(rslock.rate),
        );
    }
}

/// Our single-task cycle with one server frozen against the same with every server up, in
/// alternating rounds so that the machine's drift falls on both alike. Each frozen round starts
/// at the freeze: it includes the first command timeout, before the server is found silent.
async fn frozen_against_healthy(ours: &Arc<Atom>, server: &RedisServer) {
    const ROUNDS: usize = 5;
    const CYCLES: usize = 2000;
    let ours = ours_cycle(ours.clone());
    let (mut healthy, mut frozen) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        // A thawed server runs what was queued for it, perhaps a grant whose release never went
        // (it was silent by then): such a key lasts one TTL. Healthy rounds start after that.
        tokio::time::sleep(TTL).await;
        run(1, 100, BUDGET, &ours).await; // unmeasured
        healthy.push(run(1, CYCLES, BUDGET, &ours).await);
        server.freeze();
        frozen.push(run(1, CYCLES, BUDGET, &ours).await);
        server.thaw();
    }
    let (healthy, frozen) = (figures(healthy), figures(frozen));
    line(
        "lock_frozen_1tasks_p99_us_vs_healthy_p99",
        frozen.p99,
        Some(healthy.p99),
    );
    line(
        "lock_frozen_1tasks_p50_us_vs_healthy_p50",
        frozen.p50,
        Some(healthy.p50),
    );
}

async fn handoff(servers: &[&RedisServer]) {
    // Two holders in turn on one key, each with its own Atom (its own connections and
    // subscriptions): the time from the release's start to the next holder's acquisition.
    let a = atom(servers, "handoff", Duration::from_secs(5));
    let b = atom(servers, "handoff", Duration::from_secs(5));
    a.lock("warm", |_| async {}).await.unwrap();
    let mut samples = Vec::new();
    for round in 0..300 {
        let (holder, waiter) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let held = holder.acquire("baton").await.unwrap();
        let waiter = waiter.clone();
        let next = tokio::spawn(async move {
            let held = waiter.acquire("baton").await.unwrap();
            (Instant::now(), held)
        });
        tokio::time::sleep(Duration::from_millis(2)).await; // the waiter tried and waits
        let released = Instant::now();
        held.release().await;
        let (acquired, held) = next.await.unwrap();
        samples.push((acquired - released).as_secs_f64() * 1e6);
        held.release().await;
    }
    samples.sort_by(f64::total_cmp);
    line("lock_handoff_p50_us", samples[samples.len() / 2], None);
    line(
        "lock_handoff_p99_us",
        samples[samples.len() * 99 / 100],
        None,
    );
}

async fn meter(server: &RedisServer) {
    let atom = atom(&[server], "meter", Duration::from_secs(5));
    let connection = connections(&[server]).await.remove(0);
    // Connected and the script loaded before measuring, on both sides.
    atom.meter("warm", &[1]).await.unwrap();
    Meter::script()
        .key("toa:bench:meter:meter:warm")
        .arg(1)
        .invoke_async::<Vec<u64>>(&mut connection.clone())
        .await
        .unwrap();
    for tasks in [1usize, 32] {
        let ours_atom = atom.clone();
        let ours = cycle(move |task| {
            let atom = ours_atom.clone();
            async move { atom.meter(format!("m{task}"), &[1]).await.is_ok() }
        });
        let connection = connection.clone();
        let direct = cycle(move |task| {
            let mut connection = connection.clone();
            async move {
                Meter::script()
                    .key(format!("toa:bench:meter:meter:d{task}"))
                    .arg(1)
                    .invoke_async::<Vec<u64>>(&mut connection)
                    .await
                    .is_ok()
            }
        });
        let (ours, direct) = compare(tasks, ours, vec![direct]).await;
        line(
            &format!("meter_{tasks}tasks_calls_per_s_vs_direct_script"),
            ours.rate,
            Some(direct[0].rate),
        );
        // With one task a round is ~0.1 s, where a scheduling hiccup moves the rate; the median
        // call is the steadier comparison.
        line(
            &format!("meter_{tasks}tasks_p50_us_vs_direct_script"),
            ours.p50,
            Some(direct[0].p50),
        );
    }
}

fn slot_reassignment() {
    const INTERVAL_MS: u64 = 200;
    let server = RedisServer::start();
    let env = atomicity_env(&[&server], INTERVAL_MS, 1000);
    let mut rounds = Vec::new();
    for round in 0..3 {
        let component = format!("reassign{round}");
        let spawn = |r: usize| Worker::spawn(&format!("r{r}"), &["slots", &component, "16"], &env);
        let mut workers: Vec<Worker> = (0..3).map(spawn).collect();
        let settled = |workers: &[Worker], n: u64| {
            workers.iter().all(|w| {
                w.events()
                    .iter()
                    .rev()
                    .find(|e| e["kind"] == "assigned")
                    .is_some_and(|e| e["assignment"]["n"] == n)
            })
        };
        toa_tests::wait_until(Duration::from_secs(20), "three replicas settle", || {
            settled(&workers, 3)
        });
        let (killed_at, _) = workers.remove(0).kill();
        toa_tests::wait_until(
            Duration::from_secs(20),
            "two replicas own everything",
            || settled(&workers, 2),
        );
        let taken = toa_tests::last_assigned_at(&workers);
        rounds.push((taken - killed_at) as f64 / 1e6 / INTERVAL_MS as f64);
    }
    rounds.sort_by(f64::total_cmp);
    line("slots_reassignment_after_kill_intervals", rounds[1], None);
}

#[tokio::main]
async fn main() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let refs: Vec<&RedisServer> = servers.iter().collect();
    let contenders = contenders(&refs).await;
    run_lock_benchmarks(&contenders, "healthy").await;
    handoff(&refs).await;
    meter(&servers[0]).await;
    servers[2].freeze();
    run_lock_benchmarks(&contenders, "frozen").await;
    servers[2].thaw();
    frozen_against_healthy(&contenders.ours, &servers[2]).await;
    tokio::task::spawn_blocking(slot_reassignment)
        .await
        .unwrap();
}
