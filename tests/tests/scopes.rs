//! Keys belong to the application and the component; a lock is released however its holder ends.

use std::sync::Arc;
use std::time::Duration;
use toa_agent::{Atom, AtomConfig, Metrics, Mode, Scope};
use toa_context::{Atomicity, Credentials};
use toa_tests::RedisServer;

fn atom(server: &RedisServer, application: &str, component: &str) -> Arc<Atom> {
    let atomicity =
        Atomicity::new(&[server.address()], None, Some(Duration::from_millis(1000))).unwrap();
    let config = AtomConfig {
        scope: Scope::new(application, component),
        mode: Mode::Pod,
        atomicity: Some(atomicity),
        credentials: Credentials::default(),
        roots: Default::default(),
        instance: "scopes".into(),
        group: None,
    };
    Arc::new(Atom::start(config, Metrics::new()).unwrap())
}

const PROMPT: Duration = Duration::from_millis(500); // well below the 1 s TTL

#[tokio::test]
async fn one_key_in_two_components_or_two_applications_never_meets() {
    let server = RedisServer::start();
    let orders = atom(&server, "shop", "store.orders");
    let wallets = atom(&server, "shop", "billing.wallets");
    let other_app = atom(&server, "bank", "store.orders");
    let held = tokio::time::timeout(Duration::from_secs(5), orders.acquire("settlement"))
        .await
        .unwrap()
        .unwrap();
    // The same key elsewhere is another key: taken at once while the first is held.
    let a = tokio::time::timeout(PROMPT, wallets.acquire("settlement"))
        .await
        .expect("another component's key")
        .unwrap();
    let b = tokio::time::timeout(PROMPT, other_app.acquire("settlement"))
        .await
        .expect("another application's key")
        .unwrap();
    // The same component in the same application waits.
    let same = atom(&server, "shop", "store.orders");
    assert!(tokio::time::timeout(PROMPT, same.acquire("settlement"))
        .await
        .is_err());
    for key in [
        "toa:shop:store.orders:lock:settlement",
        "toa:shop:billing.wallets:lock:settlement",
        "toa:bank:store.orders:lock:settlement",
    ] {
        assert_eq!(server.keys(key), vec![key.to_owned()]);
    }
    // Meters are per component too.
    assert_eq!(orders.meter("k", &[5000]).await.unwrap(), vec![5000]);
    assert_eq!(wallets.meter("k", &[0]).await.unwrap(), vec![0]);
    drop((held, a, b));
}

#[tokio::test]
async fn a_panicking_or_dropped_holder_releases_at_once() {
    let server = RedisServer::start();
    let atom = atom(&server, "shop", "panics");
    let holder = atom.clone();
    let panicked = tokio::spawn(async move {
        holder
            .lock("k", |_| async { panic!("the critical section fails") })
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let after_panic = tokio::time::timeout(PROMPT, atom.acquire("k")).await;
    let held = after_panic
        .expect("released when the holder panicked, not after the TTL")
        .unwrap();
    drop(held);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        atom.lock("k", |_| std::future::pending::<()>()),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the holder's future was dropped mid-section"
    );
    tokio::time::timeout(PROMPT, atom.acquire("k"))
        .await
        .expect("released when the future was dropped")
        .unwrap();
}
