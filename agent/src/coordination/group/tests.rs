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
    let (held, token, lost) = first.acquire(vec!["k".into()]).await.unwrap();
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
    let (_second, granted, granted_at) = timeout(BOUND, waiting).await.unwrap().unwrap();
    let (_, later, _) = granted.unwrap();
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
    let (held, _, _) = second.acquire(vec!["k".into()]).await.unwrap();
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
    let (held, _, lost) = holder.acquire(vec!["k".into()]).await.unwrap();
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
async fn a_wrong_token_is_refused_both_ways_and_never_sent() {
    let place = place("token");
    let _first = Group::join(place.clone(), "first", None).await.unwrap();
    let mut address = place.read().unwrap();
    // A member with another token: the leader's proof does not pass, the member sends none.
    let token = std::mem::replace(&mut address.token, "0".repeat(64));
    let refused = hello(&address, "intruder").await.err().unwrap();
    assert!(
        refused.contains("cannot prove it holds the group's token"),
        "{refused}"
    );
    // One that answers the challenge without the token: refused by the leader.
    let (mut read, mut write) = handshake_start(&address, wire::PROTOCOL).await;
    let challenge: Challenge = serde_json::from_str(&next(&mut read).await).unwrap();
    assert!(wire::proven(
        &challenge.proof,
        &token,
        Side::Leader,
        "n",
        &challenge.nonce
    ));
    send(
        &mut write,
        &Proof {
            proof: "00".repeat(32),
        },
    )
    .await
    .unwrap();
    assert!(next(&mut read)
        .await
        .contains("not a member: a wrong token"));
    // Another build's protocol, and a hello too long to be one, are refused naming why.
    let (mut read, _write) = handshake_start(&address, 99).await;
    let told = next(&mut read).await;
    assert!(told.contains("protocol 1, this member 99"), "{told}");
    let mut stream = UnixStream::connect(&address.socket).await.unwrap();
    stream.write_all(&[b'x'; 8192]).await.unwrap();
    let told = next(&mut BufReader::new(stream)).await;
    assert!(told.contains("longer than 4096 bytes"), "{told}");
}

#[tokio::test]
async fn a_member_never_sends_the_token_to_what_took_a_dead_leaders_port() {
    let (place, _lock) = place_with_leader_at("stolen");
    let other = tokio::net::UnixListener::bind(&place.socket).unwrap();
    let impostor = tokio::spawn(async move {
        let (stream, _) = other.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let hello = next(&mut read).await;
        let challenge = Challenge {
            pid: 1,
            nonce: "n".into(),
            proof: "00".repeat(32),
        };
        send(&mut write, &challenge).await.unwrap();
        (hello, wire::read_line(&mut read).await)
    });
    let error = Group::join(place, "member", None).await.unwrap_err();
    assert!(error.to_string().contains("cannot prove"), "{error}");
    let (hello, after) = timeout(BOUND, impostor).await.unwrap().unwrap();
    assert!(!hello.contains(TOKEN), "{hello}");
    assert!(
        matches!(after, Ok(None)),
        "nothing more was sent: {after:?}"
    );
}

#[tokio::test]
async fn a_silent_member_is_taken_for_gone_and_a_pinging_one_is_not() {
    let place = place("silent");
    let first = Group::join(place.clone(), "first", None).await.unwrap();
    let alive = Group::join(place.clone(), "alive", None).await.unwrap();
    let (_, _, kept) = alive.acquire(vec!["kept".into()]).await.unwrap();
    // A frozen process: joined, holds k, then sends nothing (not even pings).
    let asked = Instant::now();
    let ((mut read, mut write), _) = hello(&place.read().unwrap(), "frozen").await.unwrap();
    let lock = Request {
        id: 7,
        op: Op::Lock {
            keys: vec!["k".into()],
            reclaim: false,
        },
    };
    send(&mut write, &lock).await.unwrap();
    assert!(next(&mut read).await.starts_with(r#"{"ok":{"id":7"#));
    let waiting = tokio::spawn(async move { first.acquire(vec!["k".into()]).await.map(|_| first) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "k is held by the frozen member until it is silent too long"
    );
    let first = timeout(BOUND, waiting).await.unwrap().unwrap().unwrap();
    assert!(asked.elapsed() >= server::SILENT);
    // The member that pings kept its lock all along.
    assert!(!kept.is_cancelled());
    let blocked = timeout(
        Duration::from_millis(300),
        first.acquire(vec!["kept".into()]),
    )
    .await;
    assert!(
        blocked.is_err(),
        "kept is still held by the member that pings"
    );
}

#[tokio::test]
async fn a_call_pending_when_the_leader_changes_is_not_sent_again() {
    let place = place("resend");
    let leader = Group::join(place.clone(), "leader", None).await.unwrap();
    let callee = Group::join(place.clone(), "callee", None).await.unwrap();
    let caller = Group::join(place, "caller", None).await.unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let counted = runs.clone();
    let runner: Runner = Arc::new(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(futures::future::pending()) // runs until the test ends
    });
    callee.offer(vec!["c".into()], runner);
    let calling = tokio::spawn(async move {
        loop {
            let answer = caller.call("c", None, Value::Null, BOUND).await;
            // Until the callee's offer reached the leader.
            if !matches!(&answer, Ok(a) if *a == serde_json::json!(CallAnswer::Nobody)) {
                return (caller, answer);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let deadline = Instant::now() + BOUND;
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "never handed to the callee");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(leader);
    let (_caller, answer) = timeout(BOUND, calling).await.unwrap().unwrap();
    assert_eq!(answer.unwrap(), serde_json::json!(CallAnswer::Gone));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "handed out once only");
}

const TOKEN: &str = "the-group-token-no-listener-may-learn";

/// A raw connection that sent a hello speaking `protocol`, nonce `n`.
async fn handshake_start(address: &place::Address, protocol: u32) -> Connection {
    let stream = UnixStream::connect(&address.socket).await.unwrap();
    let (read, mut write) = stream.into_split();
    let hello = Hello {
        protocol,
        instance: "raw".into(),
        nonce: "n".into(),
    };
    send(&mut write, &hello).await.unwrap();
    (BufReader::new(read), write)
}

/// The next line, within the bound.
async fn next<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> String {
    timeout(BOUND, wire::read_line(read))
        .await
        .unwrap()
        .unwrap()
        .expect("a line")
}

#[tokio::test]
async fn something_else_on_the_port_is_named() {
    // A socket served by something that is not the group's leader: the second process
    // refuses to start.
    let lone = place_with_leader_at("taken");
    let other = tokio::net::UnixListener::bind(&lone.0.socket).unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = other.accept().await {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let taken = lone.0.socket.display().to_string();
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

/// A place whose lock another holder keeps, its address file naming the place's socket (which
/// nothing serves yet).
fn place_with_leader_at(test: &str) -> (Place, File) {
    let place = place(test);
    let lock = place.try_lead().unwrap().unwrap();
    place
        .write(&place::Address {
            socket: place.socket.clone(),
            token: TOKEN.into(),
            pid: 4242,
        })
        .unwrap();
    (place, lock)
}

/// Waits (bounded) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_call_skips_the_leader_only_while_the_leader_alone_serves_its_component() {
    let place = place("only-here");
    let runner: Runner = Arc::new(|_, _| Box::pin(async { Value::Null }));
    let leader = Group::join(place.clone(), "leader", None).await.unwrap();
    assert!(!leader.only_here("c"), "nobody offers c yet");
    leader.offer(vec!["c".into()], runner.clone());
    until("the leader's own offer counted", || leader.only_here("c")).await;
    assert!(!leader.only_here("d"), "the leader does not serve d");
    let member = Group::join(place, "member", None).await.unwrap();
    member.offer(vec!["c".into()], runner);
    until("the member's offer counted", || !leader.only_here("c")).await;
    assert!(!member.only_here("c"), "a member does not lead");
    drop(member);
    until("the member gone", || leader.only_here("c")).await;
}
