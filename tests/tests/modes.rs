//! Which backend runs: in-process for a local run without atomicity, nothing in a pod without it,
//! and never an in-process fallback when a configured Redis cannot be reached.

use std::time::Duration;
use toa_agent::{Atom, AtomConfig, AtomError, Metrics, Mode, Scope};
use toa_context::{Atomicity, Credentials};
use toa_tests::free_port;

fn atom(mode: Mode, atomicity: Option<Atomicity>) -> Atom {
    let config = AtomConfig {
        scope: Scope::new("test", "modes"),
        mode,
        atomicity,
        credentials: Credentials::default(),
        roots: Default::default(),
        instance: "modes".into(),
        group: None,
    };
    Atom::start(config, Metrics::new()).unwrap()
}

#[tokio::test]
async fn a_pod_without_atomicity_has_no_slots_and_refuses_lock_and_meter() {
    let atom = atom(Mode::Pod, None);
    assert_eq!(atom.slots(4), None);
    let error = atom.lock("k", |_| async {}).await.unwrap_err();
    assert!(
        matches!(error, AtomError::RequiresAtomicity("lock")),
        "{error}"
    );
    assert_eq!(
        error.to_string(),
        "lock requires atomicity: add `atomicity: { redis: redis://host }` to the context"
    );
    let error = atom.meter("k", &[1]).await.unwrap_err();
    assert!(
        matches!(error, AtomError::RequiresAtomicity("meter")),
        "{error}"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let _listening = atom.onassigned(move |a| tx.send(a).unwrap());
    assert_eq!(rx.try_recv().unwrap(), None, "called at once, with none");
}

#[tokio::test]
async fn a_local_run_without_atomicity_coordinates_in_process() {
    let atom = atom(Mode::Local, None);
    assert_eq!(atom.slots(4), Some(vec![0, 1, 2, 3]));
    assert_eq!(
        atom.lock(["a", "b"], |signal| async move { signal.token() })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        atom.meter(["x", "y"], &[5000, 0]).await.unwrap(),
        vec![5000, 0]
    );
}

#[tokio::test]
async fn an_unreachable_redis_never_falls_back_to_in_process() {
    let address = format!("redis://127.0.0.1:{}", free_port());
    let atomicity = Atomicity::new(
        &[address],
        Some(Duration::from_millis(100)),
        Some(Duration::from_millis(500)),
    )
    .unwrap();
    let atom = atom(Mode::Local, Some(atomicity));
    // Slots: none, and still none after several intervals.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(atom.slots(4), None);
    // Lock: waits (it does not fail, and it does not take an in-process lock).
    let waiting =
        tokio::time::timeout(Duration::from_millis(500), atom.lock("k", |_| async {})).await;
    assert!(waiting.is_err(), "the lock waits for Redis");
    // Meter: an error that says Redis is unavailable.
    let error = atom.meter("k", &[1]).await.unwrap_err();
    assert!(matches!(error, AtomError::Unavailable(_)), "{error}");
    assert!(
        error.to_string().starts_with("Redis is unavailable"),
        "{error}"
    );
}

#[tokio::test]
async fn bad_keys_and_deltas_are_refused_with_what_was_expected() {
    let atom = atom(Mode::Local, None);
    let error = atom.meter(["a", "b"], &[1]).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "meter: expected one delta per key, got 2 keys and 1 deltas"
    );
    let error = atom.lock("", |_| async {}).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid key \"\": expected a non-empty string"
    );
    let error = atom.meter(Vec::<String>::new(), &[]).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid key \"\": expected at least one key"
    );
}
