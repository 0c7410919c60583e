//! Leader election on a `coordination.k8s.io/v1` Lease, so two or more operator replicas are safe:
//! only the holder reconciles (kube-runtime 5 has no leader-election helper).
//!
//! Every [`RENEW`] the loop reads the Lease and makes one move ([`decide`]): create it, renew it
//! when this replica holds it, take it over when its holder has not renewed it for the lease's
//! duration, or follow. Writes carry the `resourceVersion` read, so of two replicas racing for the
//! same Lease one gets 409 Conflict and stays a follower. Expiry is judged by this replica's own
//! clock (how long the Lease has been seen unchanged), as client-go does, so clock skew between
//! nodes does not matter. A leader that cannot renew for the lease's duration steps down before
//! another replica can take over, on a timer of its own: a renewal is stamped when sent, every
//! request has a timeout, and a hung one cannot keep it leading. On shutdown the leader gives the
//! Lease up, so the next one need not wait.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a Lease holds without renewal.
pub const DURATION: Duration = Duration::from_secs(15);
/// How often the loop looks at the Lease.
pub const RENEW: Duration = Duration::from_secs(5);

/// Which Lease, and who this replica is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub name: String,
    pub namespace: String,
    /// This replica's name in `holderIdentity` (its pod name).
    pub identity: String,
}

/// The loop's one move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    Create,
    Renew,
    TakeOver,
    Follow,
}

/// The move for a Lease whose spec is `spec` (`None`: no Lease), seen unchanged for
/// `unchanged_for` by this replica.
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, unchanged_for: Duration) -> Move {
    let Some(spec) = spec else {
        return Move::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == identity {
        return Move::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DURATION, Duration::from_secs);
    if holder.is_empty() || unchanged_for >= duration {
        Move::TakeOver
    } else {
        Move::Follow
    }
}

/// The spec this replica writes when it creates, renews or takes over the Lease.
pub fn held(previous: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> LeaseSpec {
    let ours = previous.and_then(|p| p.holder_identity.as_deref()) == Some(identity);
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(i32::try_from(DURATION.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if ours {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..LeaseSpec::default()
    }
}

/// How long this replica leads after its last renewal was sent: it steps down before another
/// replica may take over (that one's clock starts when it saw the Lease change, no earlier than
/// the renewal was sent), with [`RENEW`] to spare.
pub const LEAD_FOR: Duration = DURATION.saturating_sub(RENEW);

/// How long one look at the Lease (read and write) may take.
pub const REQUEST_TIMEOUT: Duration = RENEW;

/// Runs the election until `shutdown` completes, telling `leader` whether this replica holds
/// the Lease. Returns only on shutdown, after giving up a held Lease.
///
/// A renewal is stamped when it is sent, not when it returns; every request has a timeout; and
/// stepping down is a timer of its own, which needs no I/O: a hung request to the API server
/// cannot keep this replica leading past [`LEAD_FOR`].
pub async fn run(
    api: Api<Lease>,
    config: Config,
    leader: watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    // What the Lease looked like when last seen change, and when (this replica's clock).
    let mut seen: Option<(Option<String>, Option<MicroTime>, Instant)> = None;
    // When the last renewal that succeeded was sent.
    let mut renewed: Option<Instant> = None;
    let mut ticks = tokio::time::interval(RENEW);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let step_down = step_down_at(renewed);
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            () = step_down => renewed = None,
            _ = ticks.tick() => renewed = look(&api, &config, &mut seen, renewed).await,
        }
        let holding = renewed.is_some_and(|at| at.elapsed() < LEAD_FOR);
        leader.send_if_modified(|was| {
            let changed = *was != holding;
            if changed {
                tracing::info!(lease = %config.name, leader = holding, "leadership changed");
            }
            *was = holding;
            changed
        });
    }
    if *leader.borrow() {
        leader.send_replace(false);
        let released = tokio::time::timeout(REQUEST_TIMEOUT, release(&api, &config)).await;
        if !matches!(released, Ok(Ok(()))) {
            tracing::warn!(lease = %config.name, ?released, "cannot give up the lease");
        }
    }
}

/// Completes when a leader renewed at `renewed` must step down; never without a renewal.
async fn step_down_at(renewed: Option<Instant>) {
    match renewed {
        Some(at) => tokio::time::sleep_until(at + LEAD_FOR).await,
        None => std::future::pending().await,
    }
}

/// One look at the Lease, within [`REQUEST_TIMEOUT`] and never past the step-down time: when
/// the renewal that holds it now was sent, or `None`.
async fn look(
    api: &Api<Lease>,
    config: &Config,
    seen: &mut Option<(Option<String>, Option<MicroTime>, Instant)>,
    renewed: Option<Instant>,
) -> Option<Instant> {
    let sent = Instant::now();
    let looked = tokio::select! {
        biased;
        () = step_down_at(renewed) => return None,
        looked = tokio::time::timeout(REQUEST_TIMEOUT, tick(api, config, seen)) => looked,
    };
    match looked {
        Ok(Ok(true)) => Some(sent),
        Ok(Ok(false)) => None,
        Ok(Err(error)) => {
            tracing::warn!(lease = %config.name, %error, "lease request failed");
            renewed
        }
        Err(_) => {
            tracing::warn!(lease = %config.name, "the lease request got no answer within {REQUEST_TIMEOUT:?}");
            renewed
        }
    }
}

/// One look at the Lease; `Ok(true)` when this replica holds it afterwards.
async fn tick(
    api: &Api<Lease>,
    config: &Config,
    seen: &mut Option<(Option<String>, Option<MicroTime>, Instant)>,
) -> Result<bool, kube::Error> {
    let lease = api.get_opt(&config.name).await?;
    // A Lease without a spec is one nobody holds.
    let spec = lease
        .as_ref()
        .map(|lease| lease.spec.clone().unwrap_or_default());
    let key = spec
        .as_ref()
        .map(|s| (s.holder_identity.clone(), s.renew_time.clone()));
    let unchanged_for = match (&*seen, &key) {
        (Some((holder, renew, at)), Some((h, r))) if holder == h && renew == r => at.elapsed(),
        _ => {
            *seen = key.map(|(h, r)| (h, r, Instant::now()));
            Duration::ZERO
        }
    };
    let now = Timestamp::now();
    let write = match decide(spec.as_ref(), &config.identity, unchanged_for) {
        Move::Follow => return Ok(false),
        Move::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    namespace: Some(config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(held(None, &config.identity, now)),
            };
            api.create(&PostParams::default(), &lease).await
        }
        Move::Renew | Move::TakeOver => {
            let Some(mut lease) = lease else {
                return Ok(false);
            };
            lease.spec = Some(held(spec.as_ref(), &config.identity, now));
            // Carries the resourceVersion read: a concurrent writer makes this a 409.
            api.replace(&config.name, &PostParams::default(), &lease)
                .await
        }
    };
    match write {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

async fn release(api: &Api<Lease>, config: &Config) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(&config.identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    api.replace(&config.name, &PostParams::default(), &lease)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(2),
            acquire_time: Some(MicroTime(Timestamp::from_second(1).unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn no_lease_is_created() {
        assert_eq!(decide(None, "a", Duration::ZERO), Move::Create);
    }

    #[test]
    fn the_holder_renews() {
        let lease = spec(Some("a"));
        assert_eq!(
            decide(Some(&lease), "a", Duration::from_secs(60)),
            Move::Renew
        );
    }

    #[test]
    fn another_holders_live_lease_is_followed_until_it_expires() {
        let lease = spec(Some("b"));
        assert_eq!(
            decide(Some(&lease), "a", Duration::from_secs(14)),
            Move::Follow
        );
        assert_eq!(
            decide(Some(&lease), "a", Duration::from_secs(15)),
            Move::TakeOver
        );
    }

    #[test]
    fn a_given_up_lease_is_taken_at_once() {
        let lease = spec(None);
        assert_eq!(decide(Some(&lease), "a", Duration::ZERO), Move::TakeOver);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let now = Timestamp::from_second(100).unwrap();
        let taken = held(Some(&spec(Some("b"))), "a", now);
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(3));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.renew_time, Some(MicroTime(now)));

        let renewed = held(Some(&spec(Some("a"))), "a", now);
        assert_eq!(renewed.lease_transitions, Some(2));
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(Timestamp::from_second(1).unwrap()))
        );
        assert_eq!(renewed.lease_duration_seconds, Some(15));

        let created = held(None, "a", now);
        assert_eq!(created.lease_transitions, Some(0));
    }

    /// A leader whose next renewal hangs (the API server, or a proxy before it, stops answering)
    /// steps down before the Lease's duration ends, without the request ever returning: another
    /// replica may take over at the duration, counted from when it saw the renewal.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_does_not_keep_a_replica_leading() {
        use http::{Request, Response, StatusCode};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<Lease> = Api::namespaced(kube::Client::new(service, "default"), "ops");
        let config = Config {
            name: "toa-operator".into(),
            namespace: "ops".into(),
            identity: "a".into(),
        };
        let (leader, mut leading) = watch::channel(false);
        let started = Instant::now();
        tokio::spawn(run(api, config, leader, std::future::pending()));
        let answer = |status: StatusCode, body: serde_json::Value| {
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        // No Lease yet: created, and this replica leads.
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), "GET");
        send.send_response(answer(
            StatusCode::NOT_FOUND,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "code": 404, "reason": "NotFound"}),
        ));
        let (request, send) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), "POST");
        let body = request.into_body().collect_bytes().await.unwrap();
        let mut lease: serde_json::Value = serde_json::from_slice(&body).unwrap();
        lease["metadata"]["resourceVersion"] = "1".into();
        send.send_response(answer(StatusCode::CREATED, lease));
        leading.wait_for(|leading| *leading).await.unwrap();
        // The next look hangs: its request is taken and never answered.
        let (request, _never) = handle.next_request().await.unwrap();
        assert_eq!(request.method(), "GET");
        let stepped_down =
            tokio::time::timeout(DURATION * 4, leading.wait_for(|leading| !*leading)).await;
        assert!(
            stepped_down.is_ok(),
            "still leading after {:?}",
            started.elapsed()
        );
        let led = started.elapsed();
        assert!(
            led < DURATION,
            "led for {led:?} after its last renewal was sent; another may take over at {DURATION:?}"
        );
        assert!(led >= LEAD_FOR, "stepped down early, after {led:?}");
    }
}
