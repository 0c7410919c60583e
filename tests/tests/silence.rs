//! How the agent treats a Redis server that stops answering, or only answers late. The first
//! test puts a TCP proxy of its own in front of the server, which swallows what the existing
//! connections send while new connections go through (as a dropped NAT entry or a failover
//! behind one address would).
//! (The frozen server, which a lock does not wait for, is in lock.rs.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use toa_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Forwards 127.0.0.1:`port` to `target`; connections numbered below `cut` are swallowed.
struct Proxy {
    port: u16,
    accepted: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (accepted, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (counter, limit) = (accepted.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = counter.fetch_add(1, Ordering::AcqRel);
                let limit = limit.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (from_client, to_client) = client.into_split();
                    let (from_server, to_server) = server.into_split();
                    tokio::join!(
                        pump(from_client, to_server, id, limit.clone()),
                        pump(from_server, to_client, id, limit),
                    );
                });
            }
        });
        Self {
            port,
            accepted,
            cut,
        }
    }

    /// From now on, what the connections made so far send goes nowhere; they stay open.
    fn swallow_existing(&self) {
        self.cut
            .store(self.accepted.load(Ordering::Acquire), Ordering::Release);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    id: u64,
    cut: Arc<AtomicU64>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if id < cut.load(Ordering::Acquire) {
            continue;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
}

#[tokio::test]
async fn a_silent_connection_is_replaced_once_a_new_one_answers() {
    let server = RedisServer::start();
    let port: u16 = server
        .address()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = Proxy::start(port).await;
    let address = format!("redis://127.0.0.1:{}", proxy.port);
    // TTL 1 s: a command timeout of 100 ms, a probe's patience of 5 s.
    let replica = replica_at(
        &[address],
        "test",
        "silence",
        None,
        Some(Duration::from_secs(1)),
    );
    assert_eq!(replica.meter("k", &[1000]).await.unwrap(), vec![1000]);

    proxy.swallow_existing();
    let cut_at = Instant::now();
    let first = replica.meter("k", &[1000]).await.unwrap_err().to_string();
    assert!(first.contains("did not answer in"), "{first}");
    let refused = Instant::now();
    let second = replica.meter("k", &[1000]).await.unwrap_err().to_string();
    assert!(second.contains("fail at once"), "{second}");
    assert!(
        refused.elapsed() < Duration::from_millis(100),
        "refused at once"
    );

    // The probe's PING is swallowed too; a fresh connection through the proxy answers, so the
    // agent connects anew and meter works again.
    let recovered = loop {
        match replica.meter("k", &[1000]).await {
            Ok(debts) => break debts,
            Err(error) => assert!(
                cut_at.elapsed() < Duration::from_secs(30),
                "still failing 30 s after the cut: {error}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(recovered[0] > 0, "{recovered:?}");
    assert_eq!(
        server.keys("toa:test:silence:meter:k"),
        vec!["toa:test:silence:meter:k".to_owned()]
    );
    eprintln!("meter answers again {:?} after the cut", cut_at.elapsed());
}

/// A server that only answered later than the others (so a lock stopped waiting for it) is not
/// taken for silent: after the timeout, a command to it still goes and is answered.
#[tokio::test]
async fn a_server_that_answers_late_is_not_taken_for_silent() {
    let ttl = Duration::from_millis(2000);
    let command_timeout = ttl / 10;
    let (servers, replica) = three_counted_servers("late", ttl).await;
    // The first server (the one meter uses) sleeps 50 ms: the acquisition is decided by the
    // other two and stops waiting for it.
    let mut sleeper = servers[0].connection();
    let slow = std::thread::spawn(move || {
        let busy = "local t0 = redis.call('TIME') repeat local t = redis.call('TIME') \
                    until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 50000";
        redis::cmd("EVAL")
            .arg(busy)
            .arg(0)
            .query::<()>(&mut sleeper)
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(5)).await;
    let held = replica.acquire("k").await.unwrap();
    slow.join().unwrap();
    tokio::time::sleep(command_timeout + Duration::from_millis(100)).await;
    let debts = replica.meter("after", &[1000]).await;
    assert_eq!(
        debts.unwrap(),
        vec![1000],
        "the late server is asked, not refused"
    );
    drop(held);
}
