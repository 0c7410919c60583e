//! Atomicity over a Redis and a broker of the suite's own: the pods' agents split the slots and
//! a lock, and the application's keys and queue are on the servers.

use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::node::PodView;
use crate::support::{
    apply, asked_status, broker_credentials, composition, count, ready_pods, wait_no_pods, Suite,
    COMPONENT, PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, harness, node, services, tenancy};

/// Atomicity over a Redis and a broker the pods reach (the suite's own, on the node's bridge), 2
/// replicas: the pods' agents coordinate through Redis (not in-process, where each would own
/// every slot), so they split the 16 slots and a lock one pod holds keeps the other waiting; the
/// membership keys of the Composition's application are on the server; the component's shared
/// queue is on the broker.
pub async fn atomicity_splits_slots(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-atomicity", "atom");
    let application = "e2e-atom";
    let redis = services::Redis::start(node::BRIDGE_IP);
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let credentials = broker_credentials(&suite, namespace).await;
    let start = Instant::now();
    apply(
        &suite,
        &composition(
            namespace,
            name,
            json!({
                "application": application,
                "replicas": 2,
                "context": {
                    "atomicity": { "redis": [redis.url()], "interval": 300 },
                    "amqp": rabbit.url(),
                },
                "credentials": credentials,
            }),
        ),
    )
    .await;
    let pods = ready_pods(&suite, namespace, name, 2).await;

    // Each agent's share, asked through the recorder in its pod, until both own some and
    // together own all, once.
    let shares = eventually("the two pods' agents split the 16 slots", PATIENCE, || {
        let pods = pods.clone();
        let suite = suite.clone();
        async move {
            let mut shares = Vec::new();
            for pod in &pods {
                let before = count(&suite, pod, "slots");
                suite
                    .harness
                    .ask(&pod.name, json!({ "do": "slots", "total": 16 }));
                let answer = eventually("a share", Duration::from_secs(10), || async {
                    let told: Vec<_> = suite
                        .harness
                        .events(&pod.name)
                        .into_iter()
                        .filter(|e| e.event == "slots")
                        .collect();
                    if told.len() > before {
                        Ok(told.last().unwrap().details["slots"].clone())
                    } else {
                        Err("no answer".to_owned())
                    }
                })
                .await;
                let slots: Vec<u64> = serde_json::from_value(answer.clone())
                    .map_err(|_| format!("{}: {answer}", pod.name))?;
                shares.push(slots.into_iter().collect::<BTreeSet<u64>>());
            }
            let all: BTreeSet<u64> = shares.iter().flatten().copied().collect();
            let total: usize = shares.iter().map(BTreeSet::len).sum();
            if shares.iter().all(|s| !s.is_empty()) && total == 16 && all == (0..16).collect() {
                Ok(shares)
            } else {
                Err(format!("{shares:?}"))
            }
        }
    })
    .await;
    eprintln!(
        "e2e: atomicity: slots split {:?} {:.1} s after apply",
        shares,
        start.elapsed().as_secs_f64()
    );
    // The recorder's slots came with its token (the file its container alone mounts); the same
    // route asked without it, as any other process in the pod would, is refused.
    let tokenless = json!({ "do": "tokenless" });
    let status = asked_status(&suite, &pods[0].name, tokenless, "tokenless").await;
    assert_eq!(status, json!(401), "a component's route without its token");

    // Through Redis: the slots' keys of this application, both pods among the members.
    // In a pod the application's names carry its Kubernetes namespace.
    let prefix = format!("toa:{namespace}/{application}:{COMPONENT}:slots:");
    eventually(
        "the Redis holds the slots' keys, both pods members",
        PATIENCE,
        || {
            let (prefix, pods, redis) = (prefix.clone(), pods.clone(), &redis);
            async move {
                let keys = redis.cli(&["--scan", "--pattern", "*"])?;
                let keys: BTreeSet<&str> = keys.lines().collect();
                for key in ["members", "view", "epoch", "changed"] {
                    if !keys.contains(format!("{prefix}{key}").as_str()) {
                        return Err(format!("no {prefix}{key} among {keys:?}"));
                    }
                }
                let members = redis.cli(&["zrange", &format!("{prefix}members"), "0", "-1"])?;
                // A member is `<instance>#<random>`, the instance being the pod's name.
                let named: BTreeSet<&str> = members
                    .lines()
                    .filter_map(|member| member.split_once('#').map(|(pod, _)| pod))
                    .collect();
                let expected: BTreeSet<&str> = pods.iter().map(|p| p.name.as_str()).collect();
                if named == expected {
                    Ok(())
                } else {
                    Err(format!("members {members:?}, pods {expected:?}"))
                }
            }
        },
    )
    .await;

    // A lock: the first pod holds it for 3 s; the second, asking meanwhile, gets it only after.
    let (first, second) = (&pods[0], &pods[1]);
    suite.harness.ask(
        &first.name,
        json!({ "do": "lock", "key": "till", "hold": 3 }),
    );
    let locked = |pod: &PodView| {
        suite
            .harness
            .events(&pod.name)
            .into_iter()
            .find(|e| e.event == "locked")
    };
    eventually("the first pod holds the lock", PATIENCE, || async {
        locked(first).ok_or_else(|| format!("{:?}", suite.harness.names(&first.name)))
    })
    .await;
    suite.harness.ask(
        &second.name,
        json!({ "do": "lock", "key": "till", "hold": 0 }),
    );
    let second_locked = eventually("the second pod gets the lock", PATIENCE, || async {
        locked(second).ok_or_else(|| format!("{:?}", suite.harness.names(&second.name)))
    })
    .await;
    let released = suite
        .harness
        .events(&first.name)
        .into_iter()
        .find(|e| e.event == "unlocked")
        .expect("the first pod released the lock before the second got it");
    let at = |e: &harness::Event| e.details["at"].as_f64().unwrap();
    let token = |e: &harness::Event| e.details["token"].as_u64().unwrap();
    assert!(
        at(&released) <= at(&second_locked),
        "the second pod held the lock at {} while the first held it until {}",
        at(&second_locked),
        at(&released)
    );
    assert!(token(&second_locked) > token(&locked(first).unwrap()));

    // The broker: the component's shared queue, under the namespace's and application's name.
    let queue = format!("toa.{namespace}/{application}.{COMPONENT}");
    eventually(
        &format!("the broker has the queue {queue}"),
        PATIENCE,
        || {
            let (queue, rabbit) = (queue.clone(), &rabbit);
            async move {
                let queues = rabbit.queues()?;
                if queues.contains(&queue) {
                    Ok(())
                } else {
                    Err(format!("{queues:?}, not {queue}"))
                }
            }
        },
    )
    .await;
    let servers = (&redis, &rabbit);
    tenancy::apart(&suite, (namespace, application), servers, &pods).await;
    // Stop the pods before their Redis and broker go.
    let mut stopped = composition(namespace, name, json!({ "application": application }));
    stopped["spec"]["replicas"] = json!(0);
    stopped["spec"]["context"] = json!({
        "atomicity": { "redis": [redis.url()], "interval": 300 },
        "amqp": rabbit.url(),
    });
    stopped["spec"]["credentials"] = credentials;
    apply(&suite, &stopped).await;
    wait_no_pods(&suite, namespace, name).await;
}
