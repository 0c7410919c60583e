//! Slots across replica processes, checked from the assignments each replica logged.

use rand::Rng;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use toa_tests::*;

const INTERVAL_MS: u64 = 100;
const TOTAL: u32 = 16;

fn replica(name: &str, server: &RedisServer, component: &str) -> Worker {
    let env = atomicity_env(&[server], INTERVAL_MS, 1000);
    let worker = Worker::spawn(name, &["slots", component, &TOTAL.to_string()], &env);
    worker.wait_for(Duration::from_secs(10), "ready", |e| e["kind"] == "ready");
    worker
}

fn last_assignment(worker: &Worker) -> Option<Value> {
    worker
        .events()
        .into_iter()
        .rev()
        .find(|e| e["kind"] == "assigned")
        .map(|e| e["assignment"].clone())
        .filter(|a| !a.is_null())
}

/// Waits until every replica's latest assignment is from one epoch with n = replicas, and returns
/// the slots each owns.
fn wait_stable(workers: &[Worker], limit: Duration) -> Vec<Vec<u32>> {
    let n = workers.len() as u64;
    wait_until(limit, "a stable assignment", || {
        let assignments: Vec<Option<Value>> = workers.iter().map(last_assignment).collect();
        assignments
            .iter()
            .all(|a| a.as_ref().is_some_and(|a| a["n"] == n))
            && assignments
                .iter()
                .all(|a| a.as_ref().unwrap()["epoch"] == assignments[0].as_ref().unwrap()["epoch"])
    });
    let mut is: Vec<u64> = workers
        .iter()
        .map(|w| last_assignment(w).unwrap()["i"].as_u64().unwrap())
        .collect();
    let slots = workers
        .iter()
        .map(|w| {
            let i = last_assignment(w).unwrap()["i"].as_u64().unwrap() as u32;
            (i..TOTAL).step_by(n as usize).collect()
        })
        .collect();
    is.sort_unstable();
    assert_eq!(
        is,
        (0..n).collect::<Vec<_>>(),
        "each replica has its own number"
    );
    slots
}

fn assert_partition(slots: &[Vec<u32>]) {
    let mut all: Vec<u32> = slots.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..TOTAL).collect::<Vec<_>>(),
        "every slot has exactly one owner: {slots:?}"
    );
}

/// A replica that joins owns nothing for about two intervals (the view settles first): its
/// first assignment comes no earlier than 1.5 intervals after it started.
fn assert_owns_nothing_at_first(worker: &Worker) {
    let events = worker.events();
    let began = events
        .iter()
        .find(|e| e["kind"] == "ready")
        .and_then(|e| e["began"].as_u64())
        .unwrap();
    let first = events
        .iter()
        .find(|e| e["kind"] == "assigned" && !e["assignment"].is_null())
        .and_then(|e| e["at"].as_u64())
        .unwrap();
    let after_ms = (first - began) as f64 / 1e6;
    assert!(
        after_ms >= 1.5 * INTERVAL_MS as f64,
        "owned slots {after_ms} ms after it started; expected about two intervals of nothing"
    );
}

#[test]
fn one_two_three_and_five_replicas_split_every_slot() {
    let server = RedisServer::start();
    for count in [1, 2, 3, 5] {
        let component = format!("split{count}");
        let workers: Vec<Worker> = (0..count)
            .map(|r| replica(&format!("r{r}"), &server, &component))
            .collect();
        let slots = wait_stable(&workers, Duration::from_secs(10));
        assert_partition(&slots);
        for worker in &workers {
            assert_owns_nothing_at_first(worker);
        }
        if count == 1 {
            assert_eq!(slots[0], (0..TOTAL).collect::<Vec<_>>());
        }
        // The membership lives in the real server.
        let keys = server.keys(&format!("toa:test:{component}:slots:*"));
        assert!(
            keys.contains(&format!("toa:test:{component}:slots:members")),
            "{keys:?}"
        );
        for worker in workers {
            worker.finish(Duration::from_secs(5));
        }
    }
}

#[test]
fn slots_of_four_on_replica_four_of_five_is_empty_not_none() {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..5)
        .map(|r| replica(&format!("r{r}"), &server, "four"))
        .collect();
    wait_stable(&workers, Duration::from_secs(10));
    let last = workers
        .iter()
        .position(|w| last_assignment(w).unwrap()["i"] == 4)
        .unwrap();
    // Asked through the API in the replica's process: slots(16) is [4, 9, 14], slots(4) is
    // empty (it owns nothing of 0..4) but not none (it is assigned).
    workers[last].send("slots");
    let answer = workers[last].wait_for(Duration::from_secs(5), "slots", |e| e["kind"] == "slots");
    assert_eq!(answer["slots"], serde_json::json!([4, 9, 14]));
    workers[last].send("slots 4");
    let answer = workers[last].wait_for(Duration::from_secs(5), "slots(4)", |e| {
        e["kind"] == "slots" && e["total"] == 4
    });
    assert_eq!(answer["slots"], serde_json::json!([]));
    // A replica that owns some of 0..4 answers them.
    let first = workers
        .iter()
        .position(|w| last_assignment(w).unwrap()["i"] == 0)
        .unwrap();
    workers[first].send("slots 4");
    let answer = workers[first].wait_for(Duration::from_secs(5), "slots(4)", |e| {
        e["kind"] == "slots" && e["total"] == 4
    });
    assert_eq!(answer["slots"], serde_json::json!([0]));
    for worker in workers.drain(..) {
        worker.finish(Duration::from_secs(5));
    }
}

/// Ownership intervals (slot → [(from, to, who)]) from every replica's log.
fn ownership(logs: &[(String, Vec<Value>, u64)]) -> BTreeMap<u32, Vec<(u64, u64, String)>> {
    let mut owned: BTreeMap<u32, Vec<(u64, u64, String)>> = BTreeMap::new();
    for (who, events, end) in logs {
        let assigned: Vec<&Value> = events.iter().filter(|e| e["kind"] == "assigned").collect();
        for (index, event) in assigned.iter().enumerate() {
            let slots = &event["slots"];
            if slots.is_null() {
                continue;
            }
            let from = event["at"].as_u64().unwrap();
            let to = assigned
                .get(index + 1)
                .map_or(*end, |next| next["at"].as_u64().unwrap());
            for slot in slots.as_array().unwrap() {
                owned
                    .entry(slot.as_u64().unwrap() as u32)
                    .or_default()
                    .push((from, to, who.clone()));
            }
        }
    }
    owned
}

#[test]
fn ownership_never_overlaps_over_fifty_joins_and_leaves() {
    let server = RedisServer::start();
    let mut rng = rand::rng();
    let mut live: Vec<Worker> = Vec::new();
    let mut logs: Vec<(String, Vec<Value>, u64)> = Vec::new();
    let mut changes = 0;
    let mut next = 0;
    while changes < 50 {
        let join = live.is_empty() || (live.len() < 5 && rng.random_bool(0.5));
        if join {
            live.push(replica(&format!("r{next}"), &server, "churn"));
            next += 1;
        } else {
            let worker = live.remove(rng.random_range(0..live.len()));
            let name = worker.name.clone();
            if rng.random_bool(0.5) {
                let (killed_at, events) = worker.kill();
                logs.push((name, events, killed_at));
            } else {
                let events = worker.finish(Duration::from_secs(5));
                let end = events.iter().find(|e| e["kind"] == "stopped").unwrap()["at"]
                    .as_u64()
                    .unwrap();
                logs.push((name, events, end));
            }
        }
        changes += 1;
        std::thread::sleep(Duration::from_millis(
            rng.random_range(20..(4 * INTERVAL_MS)),
        ));
    }
    // Let the last members settle, so the check also covers a stable period.
    if !live.is_empty() {
        wait_stable(&live, Duration::from_secs(10));
    }
    for worker in live {
        let name = worker.name.clone();
        let events = worker.finish(Duration::from_secs(5));
        let end = events.iter().find(|e| e["kind"] == "stopped").unwrap()["at"]
            .as_u64()
            .unwrap();
        logs.push((name, events, end));
    }
    let owned = ownership(&logs);
    assert_eq!(
        owned.len(),
        TOTAL as usize,
        "every slot was owned at some point"
    );
    let mut intervals = 0;
    for (slot, mut list) in owned {
        list.sort();
        intervals += list.len();
        for pair in list.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "slot {slot} had two owners: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    eprintln!("{changes} joins and leaves, {intervals} ownership intervals, none overlapping");
}

#[test]
fn none_while_redis_is_stopped_and_back_after() {
    let mut server = RedisServer::start();
    let workers: Vec<Worker> = (0..2)
        .map(|r| replica(&format!("r{r}"), &server, "outage"))
        .collect();
    wait_stable(&workers, Duration::from_secs(10));
    let before: Vec<usize> = workers.iter().map(|w| w.events().len()).collect();
    server.kill();
    for (worker, seen) in workers.iter().zip(&before) {
        wait_until(Duration::from_secs(5), "none while Redis is down", || {
            worker.events()[*seen..]
                .iter()
                .any(|e| e["kind"] == "assigned" && e["assignment"].is_null())
        });
    }
    server.restart();
    let slots = wait_stable(&workers, Duration::from_secs(10));
    assert_partition(&slots);
}

#[test]
fn a_panicking_listener_hands_the_replicas_slots_to_the_others() {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..3)
        .map(|r| replica(&format!("r{r}"), &server, "panic"))
        .collect();
    wait_stable(&workers, Duration::from_secs(10));
    let asked_at = monotonic_ns();
    workers[0].send("panic");
    let dropped = workers[0].wait_for(Duration::from_secs(5), "it owns nothing", |e| {
        e["kind"] == "assigned" && e["assignment"].is_null() && e["at"].as_u64() > Some(asked_at)
    });
    // The listener panicked when it was added; the replica dropped its slots at that moment.
    let panicked_at = dropped["at"].as_u64().unwrap();
    let failed = workers.remove(0);
    let slots = wait_stable(&workers, Duration::from_secs(5));
    assert_partition(&slots);
    let taken_at = last_assigned_at(&workers);
    let intervals = (taken_at - panicked_at) as f64 / 1e6 / INTERVAL_MS as f64;
    eprintln!("the others own every slot {intervals:.2} intervals after the panic");
    assert!(intervals <= 3.0, "took {intervals:.2} intervals");
    // The failed replica stays out: it answers none from then on.
    let mut failed = failed;
    failed.send("slots");
    let answer = failed.wait_for(Duration::from_secs(5), "slots", |e| e["kind"] == "slots");
    assert!(answer["slots"].is_null());
}

#[tokio::test]
async fn a_listener_whose_handle_is_dropped_hears_no_more() {
    let server = RedisServer::start();
    let interval = Some(Duration::from_millis(INTERVAL_MS));
    let first = replica_on(&[&server], "test", "handles", interval, None);
    type Heard = std::sync::Arc<std::sync::Mutex<Vec<Option<toa_agent::Assignment>>>>;
    let (kept_heard, dropped_heard) = (Heard::default(), Heard::default());
    let record = |heard: &Heard| {
        let heard = heard.clone();
        move |assignment: Option<toa_agent::Assignment>| heard.lock().unwrap().push(assignment)
    };
    let _kept = first.onassigned(record(&kept_heard));
    let dropped = first.onassigned(record(&dropped_heard));
    let hears = |heard: &Heard, n: u32| {
        let heard = heard.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), async {
                while !heard.lock().unwrap().iter().flatten().any(|a| a.n == n) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("no assignment with n = {n}"));
        }
    };
    hears(&dropped_heard, 1).await;
    drop(dropped);
    let before = dropped_heard.lock().unwrap().len();
    let _second = replica_on(&[&server], "test", "handles", interval, None);
    hears(&kept_heard, 2).await;
    assert_eq!(
        dropped_heard.lock().unwrap().len(),
        before,
        "the dropped listener was called after its handle went"
    );
}
