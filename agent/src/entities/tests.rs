//! The store's contract and transitions over it, on the in-process store: every property a
//! record afterwards can check (exactly 100 of a stock of 100 sold, nothing stored twice, nothing
//! stored that should not be). The PostgreSQL store is to pass the same (issue 20).

use super::memory::Memory;
use super::store::{Committed, Found, State, Store, StoreError, Write};
use super::transition::{
    transit, Answer, Call, Concurrency, Decision, Entity, TransitionError, Turns, ATTEMPTS,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn state(value: Value) -> State {
    value.as_object().expect("an object").clone()
}

/// seed 003's `fulfilment.stock`: `available: { type: integer, minimum: 0 }`.
fn at_least_zero(state: &State) -> Result<(), String> {
    match state.get("available").and_then(Value::as_i64) {
        Some(available) if available >= 0 => Ok(()),
        Some(available) => Err(format!(
            "available: {available} is less than the minimum of 0"
        )),
        None => Err("available: expected an integer".to_owned()),
    }
}

fn call(id: Option<&str>, version: Option<u64>, concurrency: Concurrency) -> Call<'_> {
    Call {
        id,
        version,
        concurrency,
        deadline: Instant::now() + Duration::from_secs(20),
    }
}

/// A transition on the stock entity (associated, blank `available: 0`) whose program is `decide`.
async fn on_stock<S: Store>(
    store: &S,
    call: &Call<'_>,
    decide: impl Fn(State) -> Decision,
) -> Result<Answer, TransitionError> {
    let blank = state(json!({ "available": 0 }));
    let entity = Entity {
        associated: true,
        blank: &blank,
        check: &at_least_zero,
    };
    transit(store, &entity, call, |entry| {
        let decision = decide(entry);
        async move {
            // Others run between this read and this write, as programs over HTTP do.
            tokio::task::yield_now().await;
            Ok(decision)
        }
    })
    .await
}

/// Puts `available` units of p1 in stock, as the inherited `transit` does.
async fn stock(store: &Memory, available: i64) {
    let stocked = on_stock(
        store,
        &call(Some("p1"), None, Concurrency::Retry),
        set(json!({ "available": available })),
    )
    .await;
    assert!(matches!(stocked, Ok(Answer::Stored { .. })), "{stocked:?}");
}

/// seed 003's `reserve`: `OUT_OF_STOCK`, or one fewer available.
fn reserve(mut entry: State) -> Decision {
    let available = entry["available"].as_i64().unwrap();
    if available < 1 {
        return Decision::Refused(json!({ "code": "OUT_OF_STOCK" }));
    }
    entry.insert("available".into(), json!(available - 1));
    Decision::Left {
        entry,
        returned: None,
    }
}

/// The inherited `transit`: sets the given properties.
fn set(properties: Value) -> impl Fn(State) -> Decision {
    move |mut entry| {
        entry.extend(state(properties.clone()));
        Decision::Left {
            entry,
            returned: None,
        }
    }
}

/// 400 reserves of one unit on a stock of 100 from four processes (each taking turns on the
/// object, as an agent does); the outcomes by kind and the object afterwards.
async fn four_hundred_reserves(
    concurrency: Concurrency,
) -> (Vec<Result<Answer, TransitionError>>, Found) {
    let store = Arc::new(Memory::default());
    stock(&store, 100).await;
    let processes: Arc<Vec<Turns>> = Arc::new((0..4).map(|_| Turns::default()).collect());
    let calls: Vec<_> = (0..400)
        .map(|n| {
            let (store, processes) = (store.clone(), processes.clone());
            tokio::spawn(async move {
                let _turn = processes[n % 4].take("p1").await;
                on_stock(&*store, &call(Some("p1"), None, concurrency), reserve).await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for one in calls {
        outcomes.push(one.await.unwrap());
    }
    (outcomes, store.read("p1").await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_reserves_of_a_stock_of_a_hundred_sell_exactly_a_hundred() {
    let (outcomes, after) = four_hundred_reserves(Concurrency::Retry).await;
    let sold = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Answer::Stored { .. })))
        .count();
    let out = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Answer::Refused(e)) if e["code"] == "OUT_OF_STOCK"))
        .count();
    assert_eq!(
        (sold, out),
        (100, 300),
        "{:?}",
        outcomes.iter().find(|o| o.is_err())
    );
    assert_eq!(
        after,
        Found::Live {
            state: state(json!({ "available": 0 })),
            version: 101
        }
    );
    // Every sale stored its own version: none stored twice, none lost.
    let mut versions: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(Answer::Stored { version, .. }) => Some(*version),
            _ => None,
        })
        .collect();
    versions.sort_unstable();
    assert_eq!(versions, (2..=101).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_concurrency_none_every_lost_write_is_a_conflict_and_nothing_is_stored_twice() {
    let (outcomes, after) = four_hundred_reserves(Concurrency::None).await;
    let sold = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Answer::Stored { .. })))
        .count();
    let conflicts = outcomes
        .iter()
        .filter(|o| matches!(o, Err(TransitionError::Conflict { .. })))
        .count();
    let out = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Answer::Refused(_))))
        .count();
    assert_eq!(sold + conflicts + out, 400, "{outcomes:?}");
    assert!(
        conflicts > 0,
        "four processes never lost a write to each other"
    );
    let Found::Live {
        state: left,
        version,
    } = after
    else {
        panic!("{after:?}")
    };
    assert_eq!(version, 1 + sold as u64);
    assert_eq!(left["available"], json!(100 - sold as i64));
}

#[tokio::test]
async fn a_stale_version_is_refused_before_the_program_runs_and_nothing_is_stored() {
    let store = Memory::default();
    let retry = Concurrency::Retry;
    stock(&store, 5).await;
    on_stock(&store, &call(Some("p1"), None, retry), reserve)
        .await
        .unwrap();
    let ran = std::sync::atomic::AtomicBool::new(false);
    let stale = on_stock(&store, &call(Some("p1"), Some(1), retry), |entry| {
        ran.store(true, std::sync::atomic::Ordering::SeqCst);
        reserve(entry)
    })
    .await;
    assert_eq!(
        stale,
        Err(TransitionError::PreconditionFailed {
            id: "p1".into(),
            expected: 1,
            current: 2
        })
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(store.read("p1").await.unwrap().version(), 2);
    // The version the caller saw, current: it goes through.
    let fresh = on_stock(&store, &call(Some("p1"), Some(2), retry), reserve).await;
    assert!(
        matches!(fresh, Ok(Answer::Stored { version: 3, .. })),
        "{fresh:?}"
    );
}

#[tokio::test]
async fn discard_answers_without_writing_and_a_schema_violation_stores_nothing() {
    let store = Memory::default();
    let retry = Concurrency::Retry;
    stock(&store, 1).await;
    let discarded = on_stock(&store, &call(Some("p1"), None, retry), |mut entry| {
        entry.insert("available".into(), json!(7));
        entry.insert("DISCARD".into(), json!(true));
        Decision::Left {
            entry,
            returned: Some(json!({ "again": true })),
        }
    })
    .await;
    assert_eq!(
        discarded,
        Ok(Answer::Discarded {
            reply: json!({ "again": true }),
            version: 1
        })
    );
    let invalid = on_stock(
        &store,
        &call(Some("p1"), None, retry),
        set(json!({ "available": -1 })),
    )
    .await;
    assert!(
        matches!(&invalid, Err(TransitionError::Invalid { message, .. }) if message.contains("available: -1")),
        "{invalid:?}"
    );
    assert_eq!(
        store.read("p1").await.unwrap(),
        Found::Live {
            state: state(json!({ "available": 1 })),
            version: 1
        }
    );
}

#[tokio::test]
async fn the_returned_entry_is_the_stored_one_with_its_id_and_new_version_and_control_fields_are_not_stored(
) {
    let store = Memory::default();
    let answer = on_stock(
        &store,
        &call(Some("p1"), None, Concurrency::Retry),
        |mut entry| {
            assert_eq!(
                (entry["id"].clone(), entry["VERSION"].clone()),
                (json!("p1"), json!(0))
            );
            entry.insert("available".into(), json!(3));
            entry.insert("VERSION".into(), json!(99));
            Decision::Left {
                entry,
                returned: None,
            }
        },
    )
    .await;
    assert_eq!(
        answer,
        Ok(Answer::Stored {
            reply: json!({ "available": 3, "id": "p1", "VERSION": 1 }),
            version: 1,
            attempts: 1
        })
    );
    assert_eq!(
        store.read("p1").await.unwrap(),
        Found::Live {
            state: state(json!({ "available": 3 })),
            version: 1
        }
    );
}

/// A transition on a non-associated entity (seed 003's orders: `status`, blank `pending`) that
/// leaves the entry as it is, or deletes it.
async fn on_orders(
    store: &Memory,
    id: Option<&str>,
    version: Option<u64>,
    delete: bool,
) -> Result<Answer, TransitionError> {
    let blank = state(json!({ "status": "pending" }));
    let entity = Entity {
        associated: false,
        blank: &blank,
        check: &|_: &State| Ok(()),
    };
    let run = |mut entry: State| async move {
        if delete {
            entry.insert("DELETE".into(), json!(true));
        }
        Ok(Decision::Left {
            entry,
            returned: None,
        })
    };
    transit(store, &entity, &call(id, version, Concurrency::Retry), run).await
}

/// An object of a non-associated entity must exist; without an id a transition creates one
/// under a new id.
#[tokio::test]
async fn objects_of_a_non_associated_entity_must_exist_or_are_created_without_an_id() {
    let store = Memory::default();
    let missing = on_orders(&store, Some("nope"), None, false).await;
    assert_eq!(
        missing,
        Err(TransitionError::NotFound { id: "nope".into() })
    );
    assert_eq!(store.read("nope").await.unwrap(), Found::Missing);
    let created = on_orders(&store, None, None, false).await.unwrap();
    let Answer::Stored {
        reply, version: 1, ..
    } = created
    else {
        panic!("{created:?}")
    };
    let id = reply["id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    assert_eq!(reply["status"], "pending");
}

/// A deleted object keeps its version: it is not found, and a caller who saw it before cannot
/// write it back.
#[tokio::test]
async fn a_deleted_object_stays_deleted_for_every_caller() {
    let store = Memory::default();
    let Ok(Answer::Stored { reply, .. }) = on_orders(&store, None, None, false).await else {
        panic!("not created")
    };
    let id = reply["id"].as_str().unwrap().to_owned();
    let deleted = on_orders(&store, Some(&id), None, true).await;
    assert!(
        matches!(deleted, Ok(Answer::Stored { version: 2, .. })),
        "{deleted:?}"
    );
    assert_eq!(
        store.read(&id).await.unwrap(),
        Found::Deleted { version: 2 }
    );
    let again = on_orders(&store, Some(&id), None, false).await;
    assert_eq!(again, Err(TransitionError::NotFound { id: id.clone() }));
    let stale = on_orders(&store, Some(&id), Some(1), false).await;
    assert!(stale.is_err(), "{stale:?}");
    assert_eq!(
        store.read(&id).await.unwrap(),
        Found::Deleted { version: 2 }
    );
}

/// A store on which another replica always writes first: every commit is lost.
struct Hot(Memory);

impl Store for Hot {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        self.0.read(id).await
    }

    async fn commit(&self, id: &str, read: u64, write: Write) -> Result<Committed, StoreError> {
        let theirs = Write::Put(state(json!({ "available": 1 })));
        self.0.commit(id, read, theirs).await?;
        self.0.commit(id, read, write).await
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        self.0.enumerate(after, limit).await
    }
}

#[tokio::test]
async fn a_hot_object_is_contended_within_the_deadline_and_nothing_of_the_call_is_stored() {
    let store = Hot(Memory::default());
    let deadline = Instant::now() + Duration::from_millis(300);
    let hot = Call {
        id: Some("p1"),
        version: None,
        concurrency: Concurrency::Retry,
        deadline,
    };
    let answer = on_stock(&store, &hot, set(json!({ "available": 9 }))).await;
    assert!(
        matches!(answer, Err(TransitionError::Contended { attempts, .. }) if attempts <= ATTEMPTS),
        "{answer:?}"
    );
    assert!(Instant::now() <= deadline, "ended past its deadline");
    let Found::Live { state: left, .. } = store.read("p1").await.unwrap() else {
        panic!("never written")
    };
    assert_eq!(
        left["available"],
        json!(1),
        "only the other writer's writes"
    );
}

/// The bound, measured: callers of one object from as many processes at once (no turns), each
/// adding one. 16 all get through; the runs per stored write are printed for 16 and 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_processes_on_one_object_all_get_through() {
    for callers in [16, 64] {
        let store = Arc::new(Memory::default());
        let started = Instant::now();
        let calls: Vec<_> = (0..callers)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    on_stock(
                        &*store,
                        &call(Some("p1"), None, Concurrency::Retry),
                        |mut entry| {
                            let available = entry["available"].as_i64().unwrap();
                            entry.insert("available".into(), json!(available + 1));
                            Decision::Left {
                                entry,
                                returned: None,
                            }
                        },
                    )
                    .await
                })
            })
            .collect();
        let mut runs = 0u32;
        let mut stored = 0u32;
        for one in calls {
            if let Ok(Answer::Stored { attempts, .. }) = one.await.unwrap() {
                runs += attempts;
                stored += 1;
            }
        }
        eprintln!(
            "{callers} callers: {stored} stored, {:.2} runs per stored write, {:.0} ms",
            f64::from(runs) / f64::from(stored.max(1)),
            started.elapsed().as_secs_f64() * 1000.0
        );
        let Found::Live {
            state: left,
            version,
        } = store.read("p1").await.unwrap()
        else {
            panic!("nothing stored")
        };
        assert_eq!(
            left["available"],
            json!(stored),
            "every stored write counted once"
        );
        assert_eq!(version, u64::from(stored));
        if callers == 16 {
            assert_eq!(stored, 16, "a caller of 16 gave up");
        }
    }
}

#[tokio::test]
async fn turns_are_forgotten_once_nobody_holds_them() {
    let turns = Turns::default();
    {
        let _one = turns.take("a").await;
        let _two = turns.take("b").await;
    }
    let _again = turns.take("a").await;
    drop(_again);
    // Taken and released: a later take does not wait on anything left behind.
    let later = tokio::time::timeout(Duration::from_secs(1), turns.take("a")).await;
    assert!(later.is_ok());
}

/// A deleted object of an associated entity goes back to `blank`, numbered on from its tombstone.
#[tokio::test]
async fn a_deleted_associated_object_is_blank_again_at_the_tombstones_version() {
    let store = Memory::default();
    let retry = Concurrency::Retry;
    stock(&store, 5).await;
    let deleted = on_stock(
        &store,
        &call(Some("p1"), None, retry),
        set(json!({ "DELETE": true })),
    )
    .await;
    assert!(
        matches!(deleted, Ok(Answer::Stored { version: 2, .. })),
        "{deleted:?}"
    );
    let out = on_stock(&store, &call(Some("p1"), None, retry), reserve).await;
    assert_eq!(out, Ok(Answer::Refused(json!({ "code": "OUT_OF_STOCK" }))));
    let stocked = on_stock(
        &store,
        &call(Some("p1"), Some(2), retry),
        set(json!({ "available": 3 })),
    )
    .await;
    assert!(
        matches!(stocked, Ok(Answer::Stored { version: 3, .. })),
        "{stocked:?}"
    );
}
