//! Groups of members in one test process, each its own client of the leader as separate
//! processes are; a member's end is a [`Group`] dropped (its connection closes, and a leader's
//! server stops, as a killed process's would).

use super::*;
use std::path::PathBuf;
use tokio::time::{timeout, Instant};

fn place(test: &str) -> Place {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("toa-group-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Place::in_dir(&dir, format!("shop {test}")).unwrap()
}

const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn the_first_leads_and_a_lock_excludes_across_members() {
    let place = place("lock");
    let first = Group::join(place.clone(), "first", None).await.unwrap();
    let second = Group::join(place, "second", None).await.unwrap();
    assert!(first.leads() && !second.leads());
    let (held, token, lost) = first.acquire(vec!["k".into()]).await;
    let waiting = tokio::spawn(async move {
        let granted = second.acquire(vec!["k".into(), "other".into()]).await;
        (second, granted, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "k is held by the first: the second waits"
    );
    let released = Instant::now();
    first.release(held);
    let (_second, (_, later, _), granted_at) = timeout(BOUND, waiting).await.unwrap().unwrap();
    assert!(granted_at >= released);
    assert!(later > token, "fencing tokens grow");
    assert!(!lost.is_cancelled());
}

#[tokio::test]
async fn a_waiter_that_gives_up_is_withdrawn_and_a_dead_members_locks_are_freed() {
    let place = place("withdraw");
    let first = Group::join(place.clone(), "first", None).await.unwrap();
    let second = Group::join(place.clone(), "second", None).await.unwrap();
    let third = Group::join(place, "third", None).await.unwrap();
    let (held, _, _) = second.acquire(vec!["k".into()]).await;
    // The first gives up waiting: it must not be granted k later, behind the third's back.
    let gave_up = timeout(Duration::from_millis(100), first.acquire(vec!["k".into()])).await;
    assert!(gave_up.is_err());
    drop(second); // its process ends holding k
    let _ = timeout(BOUND, third.acquire(vec!["k".into()]))
        .await
        .unwrap();
    let _ = held;
}

#[tokio::test]
async fn a_new_leader_keeps_the_locks_its_members_hold_and_grants_others_after_the_grace() {
    let place = place("takeover");
    let leader = Group::join(place.clone(), "leader", None).await.unwrap();
    let holder = Group::join(place.clone(), "holder", None).await.unwrap();
    let (held, _, lost) = holder.acquire(vec!["k".into()]).await;
    holder
        .set("stash".into(), "1".into(), 60_000)
        .await
        .unwrap();
    drop(leader); // the leader's process is killed: the holder takes over
    let deadline = Instant::now() + BOUND;
    while !holder.leads() {
        assert!(Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let newcomer = Group::join(place, "newcomer", None).await.unwrap();
    let asked = Instant::now();
    let waiting = tokio::spawn(async move {
        let granted = newcomer.acquire(vec!["k".into()]).await;
        (newcomer, granted)
    });
    tokio::time::sleep(GRACE + Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "k was reclaimed by its holder: never granted twice"
    );
    assert!(
        !lost.is_cancelled(),
        "the holder kept it through the change"
    );
    holder.release(held);
    let (newcomer, _) = timeout(BOUND, waiting).await.unwrap().unwrap();
    assert!(asked.elapsed() > GRACE);
    // What the old leader kept for a while went with it.
    assert_eq!(newcomer.get("stash".into()).await.unwrap(), None);
}

#[tokio::test]
async fn heartbeats_make_one_view_and_a_member_gone_leaves_it_at_once() {
    let place = place("slots");
    let first = Group::join(place.clone(), "first", None).await.unwrap();
    let second = Group::join(place, "second", None).await.unwrap();
    let ttl = Duration::from_secs(60);
    first.heartbeat("p:", "a", ttl, false).await.unwrap();
    let both = second.heartbeat("p:", "b", ttl, false).await.unwrap();
    assert_eq!(both.members, ["a", "b"]);
    let again = second.heartbeat("p:", "b", ttl, false).await.unwrap();
    assert_eq!(
        (again.epoch, again.changed),
        (both.epoch, both.changed),
        "nothing changed"
    );
    let other = first.heartbeat("q:", "a", ttl, false).await.unwrap();
    assert_eq!(other.members, ["a"], "another component's view is its own");
    drop(second);
    let deadline = Instant::now() + BOUND;
    loop {
        let view = first.heartbeat("p:", "a", ttl, false).await.unwrap();
        if view.members == ["a"] {
            assert!(view.epoch > both.epoch);
            break;
        }
        assert!(Instant::now() < deadline, "b never left: {view:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn meters_and_values_are_shared() {
    let place = place("shared");
    let first = Group::join(place.clone(), "first", None).await.unwrap();
    let second = Group::join(place, "second", None).await.unwrap();
    let key = || vec!["m".to_owned()];
    assert_eq!(first.meter(key(), vec![6000]).await.unwrap(), [6000]);
    let reached = second.meter(key(), vec![6000]).await.unwrap()[0];
    assert!((11_000..=12_000).contains(&reached), "{reached}");
    assert_eq!(
        first.claim("c".into(), "a".into(), 60_000).await.unwrap(),
        None
    );
    assert_eq!(
        second
            .claim("c".into(), "b".into(), 60_000)
            .await
            .unwrap()
            .as_deref(),
        Some("a")
    );
    assert!(second.delete("c".into()).await.unwrap());
    assert_eq!(first.get("c".into()).await.unwrap(), None);
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_something_else_on_the_port_is_named() {
    let place = place("token");
    let _first = Group::join(place.clone(), "first", None).await.unwrap();
    let mut address = place.read().unwrap();
    address.token = "0".repeat(64);
    let refused = hello(&address, "intruder").await.err().unwrap();
    assert!(refused.starts_with("refused: not a member"), "{refused}");
    // A port taken by something that is not the group's leader: the second process refuses to start.
    let other = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let taken = other.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = other.accept().await {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let lone = place_with_leader_at("taken", taken);
    let error = Group::join(lone.0, "second", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("serves at {taken}, which does not answer")),
        "{error}"
    );
    assert!(error.contains("--alone"), "{error}");
    drop(lone.1);
}

/// A place whose lock another holder keeps, its address file naming `address`.
fn place_with_leader_at(test: &str, address: std::net::SocketAddr) -> (Place, File) {
    let place = place(test);
    let lock = place.try_lead().unwrap().unwrap();
    place
        .write(&place::Address {
            address,
            token: "t".into(),
            pid: 4242,
        })
        .unwrap();
    (place, lock)
}
