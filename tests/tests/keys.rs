//! Which keys the primitives write, and on which servers: several lock keys are taken all
//! together or not at all; `meter` and the slots' heartbeats use the first address only.

use std::time::Duration;
use toa_tests::*;

const TTL: Duration = Duration::from_millis(1000);
const PROMPT: Duration = Duration::from_millis(500); // well below the TTL

#[tokio::test]
async fn several_keys_are_held_together_or_not_at_all() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let on: Vec<&RedisServer> = servers.iter().collect();
    let a = replica_on(&on, "shop", "ledger", None, Some(TTL));
    let b = replica_on(&on, "shop", "ledger", None, Some(TTL));
    let c = replica_on(&on, "shop", "ledger", None, Some(TTL));

    // New servers count once they have been up for a TTL (the delayed-restart rule).
    let both = tokio::time::timeout(Duration::from_secs(10), a.acquire(&["debit", "credit"][..]))
        .await
        .unwrap()
        .unwrap();
    for server in &servers {
        for key in ["debit", "credit"] {
            let key = format!("toa:shop:ledger:lock:{key}");
            assert_eq!(
                server.keys(&key),
                vec![key.clone()],
                "{key} on every server"
            );
        }
    }
    // Either key alone waits for the holder of both.
    assert!(tokio::time::timeout(PROMPT, b.acquire("credit"))
        .await
        .is_err());
    // B asks for credit and audit together: it waits, and meanwhile holds neither.
    let b_waits = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire(&["credit", "audit"][..]).await })
    };
    tokio::time::sleep(PROMPT).await;
    assert!(!b_waits.is_finished(), "credit is A's");
    let audit = tokio::time::timeout(PROMPT, c.acquire("audit"))
        .await
        .expect("a waiting caller holds none of its keys")
        .unwrap();
    drop(audit);
    let token_a = both.token();
    both.release().await;
    let b_holds = tokio::time::timeout(PROMPT * 2, b_waits)
        .await
        .expect("handed over when A released")
        .unwrap()
        .unwrap();
    assert!(b_holds.token() > token_a, "fencing tokens increase");
    // Now debit is free and audit is B's.
    let debit = tokio::time::timeout(PROMPT, c.acquire("debit"))
        .await
        .expect("debit was released with credit")
        .unwrap();
    assert!(tokio::time::timeout(PROMPT, c.acquire("audit"))
        .await
        .is_err());
    drop((debit, b_holds));
}

#[tokio::test]
async fn meter_and_heartbeats_use_the_first_address_only() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let on: Vec<&RedisServer> = servers.iter().collect();
    let replica = replica_on(
        &on,
        "shop",
        "appraisals",
        Some(Duration::from_millis(100)),
        None,
    );
    assert_eq!(
        replica.meter("customer:7", &[6000]).await.unwrap(),
        vec![6000]
    );
    // Async, so the replica's heartbeats run meanwhile on this test's runtime.
    tokio::time::timeout(Duration::from_secs(5), async {
        while replica.slots(4).is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replica owns its slots");
    let on_first = servers[0].keys("toa:shop:appraisals:*");
    for key in [
        "toa:shop:appraisals:meter:customer:7",
        "toa:shop:appraisals:slots:members",
    ] {
        assert!(on_first.contains(&key.to_owned()), "{key} in {on_first:?}");
    }
    for other in &servers[1..] {
        assert_eq!(other.keys("toa:shop:*"), Vec::<String>::new());
    }
}
