//! Leader election: two operator replicas on one Lease, only the leader reconciling, and the
//! follower taking over once the killed leader's Lease expires.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::SignedDuration;
use kube::Api;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toa_operator::lease::{DURATION, RENEW};

use crate::support::{
    apply, components_of, composition, holder, lease_spec, wait_condition, wait_pods, Suite,
    PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, wait};

/// Two replicas on the same Lease: the second, started while the suite's operator leads, does
/// not reconcile (its reconcile counter stays 0 while its controller sees every Composition and
/// the leader reconciles a change); the leader killed (SIGKILL: the Lease is not given up), the
/// second takes the Lease once it expires and reconciles a Composition applied after the kill.
/// Then the suite's operator starts again and, the second stopped (giving the Lease up), leads
/// again, as the later scenarios expect.
pub async fn two_replicas_one_leader(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-replicas", "replicas");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    // Held all along: no other scenario runs now, and none may restart the operator meanwhile.
    let mut first = suite.operator.lock().await;
    let (lease_namespace, lease_name) = first.lease();
    let leases = Api::<Lease>::namespaced(suite.admin.clone(), &lease_namespace);
    let leader = first.identity();
    let held_by = |identity: String, what: &str, timeout: Duration| {
        let leases = leases.clone();
        let lease_name = lease_name.clone();
        let what = format!("{what}: the Lease {lease_namespace}/{lease_name} names {identity}");
        async move {
            eventually(&what, timeout, || {
                let (leases, lease_name, identity) =
                    (leases.clone(), lease_name.clone(), identity.clone());
                async move {
                    let spec = lease_spec(&leases, &lease_name).await?;
                    if holder(&spec) == identity {
                        Ok(spec)
                    } else {
                        Err(format!("{spec:?}"))
                    }
                }
            })
            .await
        }
    };
    held_by(leader.clone(), "the suite's operator leads", PATIENCE).await;
    let spec = |replicas: i32| composition(namespace, name, json!({ "replicas": replicas }));
    apply(&suite, &spec(1)).await;
    wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;

    // (a) A second replica, same ServiceAccount and Lease, identity of its own.
    let mut second = first.replica("toa-e2e-second");
    second.start().await;
    let follower = second.identity();
    // Its controller sees the Compositions (every scenario's) and calls reconcile for each,
    // which returns before counting: the leader gate, not a missing watch, keeps the count 0.
    let seen = format!("{namespace}/{name}");
    eventually(
        "the second replica's controller went through the Composition",
        PATIENCE,
        || {
            let log = second.log();
            let seen = seen.clone();
            async move {
                let skipped = log.lines().any(|line| {
                    line.contains("not the leader: skipped")
                        && line.contains(name)
                        && line.contains(namespace)
                });
                if skipped {
                    Ok(())
                } else {
                    Err(format!(
                        "no \"not the leader: skipped\" line for {seen} in its log"
                    ))
                }
            }
        },
    )
    .await;
    // Work for the leader while both run: a spec change.
    let leader_before = first.reconciles().await;
    let changed = apply(&suite, &spec(2)).await;
    let window = 3 * RENEW;
    wait::always(
        "the first replica holds the Lease and the second neither leads nor reconciles",
        window,
        || {
            let (leases, lease_name, leader) = (leases.clone(), lease_name.clone(), leader.clone());
            let second = &second;
            async move {
                let spec = lease_spec(&leases, &lease_name).await?;
                let reconciles = second.reconciles().await;
                let leading = second.metric("toa_operator_leader").await;
                if holder(&spec) != leader || reconciles != 0 || leading != 0.0 {
                    Err(format!(
                        "holder {:?}, the second's reconciles {reconciles}, its leader gauge {leading}",
                        spec.holder_identity
                    ))
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    second.check_running();
    let rolled = wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    assert_eq!(rolled.metadata.generation, changed.metadata.generation);
    wait_pods(&suite, namespace, name, 2).await;
    let leader_reconciles = first.reconciles().await - leader_before;
    assert!(
        leader_reconciles > 0,
        "the leader reconciled the change meanwhile"
    );
    assert_eq!(second.reconciles().await, 0, "the follower reconciled");

    // (b) The leader killed: it neither finishes nor gives the Lease up.
    first.kill();
    let killed = Instant::now();
    let last = lease_spec(&leases, &lease_name).await.unwrap();
    assert_eq!(holder(&last), leader, "still names the killed leader");
    let after = "after";
    // A component of its own: `replicas` declares the recorder in this namespace.
    let spec = json!({ "components": components_of("c001") });
    apply(&suite, &composition(namespace, after, spec)).await;
    // The follower's clock starts when it sees the last renewal (at most RENEW after it), and it
    // looks every RENEW: DURATION + 2 RENEW at worst (a look a hair short of DURATION waits one
    // more), plus a margin.
    let bound = DURATION + 2 * RENEW + Duration::from_secs(5);
    let taken = held_by(follower.clone(), "the second replica takes over", bound).await;
    let takeover = killed.elapsed();
    eprintln!(
        "e2e: two replicas: the second took the Lease {:.1} s after the leader was killed (bound {:.0} s)",
        takeover.as_secs_f64(),
        bound.as_secs_f64()
    );
    // Not before the Lease expired: DURATION after the dead leader's last renewal.
    let (Some(renewed), Some(acquired)) = (&last.renew_time, &taken.acquire_time) else {
        panic!("renewTime {last:?}, acquireTime {taken:?}");
    };
    let waited = acquired.0.duration_since(renewed.0);
    assert!(
        waited >= SignedDuration::try_from(DURATION).unwrap(),
        "taken over {waited:?} after the last renewal, before the Lease expired"
    );
    assert_eq!(
        taken.lease_transitions,
        last.lease_transitions.map(|t| t + 1),
        "one more transition"
    );
    wait_condition(&suite, namespace, after, "Ready", "True", None, PATIENCE).await;
    wait_pods(&suite, namespace, after, 1).await;
    assert!(second.reconciles().await > 0, "the new leader reconciles");
    assert_eq!(second.metric("toa_operator_leader").await, 1.0);
    let log = second.log();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("forbidden") || line.contains("Forbidden"))
        .take(5)
        .collect();
    assert!(
        forbidden.is_empty(),
        "the second replica was refused requests its RBAC should grant:\n{}",
        forbidden.join("\n")
    );

    // Back to one replica, the suite's: it starts as a follower, and leads as soon as the
    // second, stopped, gives the Lease up (at its next look, within RENEW).
    first.start().await;
    let restarted = first.identity();
    second.stop().await;
    let stopped = Instant::now();
    held_by(restarted, "the suite's operator leads again", 2 * RENEW).await;
    eventually("the suite's operator reports leading", PATIENCE, || {
        let first = &first;
        async move {
            let leading = first.metric("toa_operator_leader").await;
            if leading == 1.0 {
                Ok(())
            } else {
                Err(format!("leader gauge {leading}"))
            }
        }
    })
    .await;
    eprintln!(
        "e2e: two replicas: the suite's operator led again {:.1} s after the second stopped",
        stopped.elapsed().as_secs_f64()
    );
}
