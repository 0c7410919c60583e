//! `meter` against a real Redis server: the seed's burst, draining on the server's clock, exact
//! sums across processes, and a client clock that lies.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use toa_agent::{Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Atomicity, Credentials};
use toa_tests::*;

fn atom(server: &RedisServer, component: &str) -> Arc<Atom> {
    let atomicity =
        Atomicity::new(&[server.address()], Some(Duration::from_millis(1000)), None).unwrap();
    let config = AtomConfig {
        scope: Scope::new("test", component),
        mode: Mode::Pod,
        atomicity: Some(atomicity),
        credentials: Credentials::default(),
        roots: Default::default(),
        instance: "meter-test".into(),
        group: None,
    };
    Arc::new(Atom::start(config, Metrics::new()).unwrap())
}

/// The server's clock in milliseconds.
fn server_ms(server: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    s * 1000 + us / 1000
}

fn debt_key(component: &str, key: &str) -> String {
    format!("toa:test:{component}:meter:{key}")
}

#[tokio::test]
async fn the_eleventh_appraisal_within_a_minute_is_refused() {
    let server = RedisServer::start();
    let atom = atom(&server, "store.catalog");
    let mut debts = Vec::new();
    for _ in 0..11 {
        debts.push(atom.meter("appraise:c1", &[6000]).await.unwrap()[0]);
    }
    assert!(
        debts[..10].iter().all(|d| *d <= 60_000),
        "ten pass: {debts:?}"
    );
    assert!(
        debts[10] > 60_000,
        "the eleventh is over the window: {debts:?}"
    );
    // A refused call still paid: asking again stays refused.
    assert!(atom.meter("appraise:c1", &[6000]).await.unwrap()[0] > debts[10]);
    assert_eq!(
        server.keys(&debt_key("store.catalog", "*")),
        vec![debt_key("store.catalog", "appraise:c1")]
    );
}

#[tokio::test]
async fn debts_are_deltas_minus_server_time_and_drain_away() {
    let server = RedisServer::start();
    let atom = atom(&server, "drain");
    let t0 = server_ms(&server);
    let first = atom.meter(["a", "b"], &[1000, 400]).await.unwrap();
    let t1 = server_ms(&server);
    assert_eq!(first, vec![1000, 400]);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let t2 = server_ms(&server);
    let second = atom.meter(["a", "b"], &[500, 0]).await.unwrap();
    let t3 = server_ms(&server);
    // elapsed on the server between the two calls lies within [t2 - t1, t3 - t0]
    let (least, most) = (t2 - t1, t3 - t0);
    assert!(
        second[0] <= 1500 - least + 1 && second[0] + 1 >= 1500 - most,
        "a: {second:?}, elapsed {least}..{most}"
    );
    assert!(
        second[1] <= 400 - least + 1 && second[1] + 1 >= 400 - most,
        "b: {second:?}, elapsed {least}..{most}"
    );
    // b is read, not charged: delta 0. Its key is gone once its debt is.
    wait_until(Duration::from_secs(3), "b's debt to drain", || {
        server.keys(&debt_key("drain", "b")).is_empty()
    });
    let read = atom.meter(["a", "b"], &[0, 0]).await.unwrap();
    assert_eq!(read[1], 0);
    assert!(read[0] > 0 && read[0] < second[0]);
    wait_until(Duration::from_secs(3), "a's debt to drain", || {
        server.keys(&debt_key("drain", "a")).is_empty()
    });
    assert_eq!(atom.meter("a", &[0]).await.unwrap(), vec![0]);
}

#[test]
fn concurrent_charges_from_several_processes_sum_exactly() {
    let server = RedisServer::start();
    let env = atomicity_env(&[&server], 1000, 1000);
    const DELTA: u64 = 1_000_000;
    const CALLS: u64 = 50;
    let t0 = server_ms(&server);
    let workers: Vec<Worker> = (0..4)
        .map(|p| {
            Worker::spawn(
                &format!("meter-{p}"),
                &["meter", "sum", "k", &DELTA.to_string(), &CALLS.to_string()],
                &env,
            )
        })
        .collect();
    let mut reached = Vec::new();
    for worker in workers {
        worker.wait_for(Duration::from_secs(30), "done", |e| e["kind"] == "done");
        reached.extend(
            worker
                .finish(Duration::from_secs(5))
                .iter()
                .filter(|e| e["kind"] == "metered")
                .map(|e| e["debt"].as_u64().unwrap()),
        );
    }
    let elapsed = server_ms(&server) - t0;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(debt_key("sum", "k"))
        .query(&mut server.connection())
        .unwrap();
    let total = 4 * CALLS * DELTA;
    // Every call saw a distinct debt, and the final debt is the sum less what drained meanwhile:
    // a lost update would be off by a whole delta.
    reached.sort_unstable();
    reached.dedup();
    assert_eq!(reached.len() as u64, 4 * CALLS);
    let last = *reached.last().unwrap();
    assert!(
        last <= total && last + elapsed >= total,
        "last {last}, total {total}, elapsed {elapsed} ms"
    );
    assert!(pttl as u64 <= last && pttl as u64 + elapsed >= last);
}

#[test]
fn a_shifted_client_clock_does_not_change_the_debts() {
    // faketime really shifts this process's clock...
    let shifted = Command::new("faketime")
        .args(["-f", "+10d", "date", "+%s"])
        .output()
        .expect("faketime is installed by the test command");
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let fake: u64 = String::from_utf8_lossy(&shifted.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        fake > real + 9 * 86_400,
        "faketime shifts the clock: {fake} vs {real}"
    );

    // ...and a worker under it charges like anyone else, since debts run on the server's clock.
    let server = RedisServer::start();
    let env = atomicity_env(&[&server], 1000, 1000);
    let mut command = Command::new("faketime");
    command.args(["-f", "+10d"]).arg(worker_binary());
    let shifted = Worker::spawn_with(
        "shifted",
        command,
        &["meter", "clock", "k", "6000", "1"],
        &env,
    );
    shifted.wait_for(Duration::from_secs(20), "done", |e| e["kind"] == "done");
    let events = shifted.finish(Duration::from_secs(5));
    let charged = events.iter().find(|e| e["kind"] == "metered").unwrap()["debt"]
        .as_u64()
        .unwrap();
    assert_eq!(charged, 6000);
    let honest = Worker::spawn("honest", &["meter", "clock", "k", "0", "1"], &env);
    honest.wait_for(Duration::from_secs(20), "done", |e| e["kind"] == "done");
    let read = honest
        .finish(Duration::from_secs(5))
        .iter()
        .find(|e| e["kind"] == "metered")
        .unwrap()["debt"]
        .as_u64()
        .unwrap();
    assert!(
        read <= 6000 && read > 6000 - 3000,
        "read {read}: the debt drained by real elapsed time only"
    );
}

/// A call is charged whole or not at all: a delta over the bound is refused before anything is
/// charged (it once charged `a` and answered "Redis is unavailable"), and so is a debt the
/// server could not keep, refused by the script before it writes.
#[tokio::test]
async fn a_refused_meter_call_charges_nothing() {
    let server = RedisServer::start();
    let atom = atom(&server, "bounds");
    let refused = atom
        .meter(["a", "b"], &[60_000, u64::MAX])
        .await
        .unwrap_err();
    assert!(
        matches!(refused, toa_agent::AtomError::InvalidMeter(_)),
        "{refused}"
    );
    assert!(refused.to_string().contains("deltas[1]"), "{refused}");
    assert_eq!(atom.meter(["a"], &[0]).await.unwrap(), [0], "a was charged");

    // Within the bound per call, but a debt beyond what the server keeps: the script refuses
    // it before writing the first key.
    let year = toa_agent::atom::meter::MAX_DELTA_MS;
    let mut connection = server.connection();
    redis::cmd("SET")
        .arg(debt_key("bounds", "b"))
        .arg("")
        .arg("PX")
        .arg(9_007_199_254_740_000u64)
        .query::<()>(&mut connection)
        .unwrap();
    let refused = atom.meter(["a", "b"], &[60_000, year]).await.unwrap_err();
    assert!(
        matches!(refused, toa_agent::AtomError::InvalidMeter(_)),
        "{refused}"
    );
    assert_eq!(atom.meter(["a"], &[0]).await.unwrap(), [0], "a was charged");
}
