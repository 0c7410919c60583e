//! Pure: what the operator observed → the Composition's `status`. Time is a parameter, and a
//! condition whose status did not change keeps its `lastTransitionTime`, so [`changed`] can tell
//! the controller to skip a patch that would only move timestamps.
//!
//! | type | `True` when | reasons |
//! |---|---|---|
//! | `Ready` | the Deployment has rolled out this generation and is not stopped by a halt | `RolledOut`; `False`: `InvalidSpec`, `RollingOut`, `Halted` |
//! | `Progressing` | a rollout of this generation is under way | `RollingOut`, `RolledOut`, `InvalidSpec` |
//! | `Halted` | a halt stopped the composition (0 replicas, none left) | the halt's phase ([`crate::halt::Phase::reason`]) |
//! | `Degraded` | the Deployment cannot create pods (admission refused them: Pod Security, a quota, a policy; its `ReplicaFailure` condition), a pod's container fails (crash loop, cannot start, evicted: from the pods' own statuses, see [`crate::observed::pods`]), an agent does not answer the control endpoint or a pod has no IP yet, or the spec is refused | `PodsRefused`, `PodsFailing`, `AgentsUnreachable`, `InvalidSpec`; `False`: `AsExpected` |

use crate::crd::{conditions, reasons, CompositionStatus};
use crate::halt::{Decision, Phase};
use crate::observed::pods::Seen;
use crate::observed::rollout::Rollout;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// What the status is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The Composition's `metadata.generation`.
    pub generation: Option<i64>,
    /// The refusal's reason and message when the spec, or what it would write, was refused.
    pub invalid: Option<(&'static str, &'a str)>,
    /// The Deployment as applied for this generation; `None` when there is none (yet).
    pub rollout: Option<Rollout>,
    /// Why the Deployment cannot create pods, when it cannot ([`replica_failure`]).
    pub refused: Option<&'a str>,
    /// The replicas the Deployment should have.
    pub replicas: i32,
    /// The halt's phase and unreachable pods; `None` when the spec was refused.
    pub halt: Option<&'a Decision>,
    /// The composition's pods as listed.
    pub pods: &'a [Seen],
    pub now: Timestamp,
}

/// The new status; `previous` provides the transition times of conditions that did not change
/// status, and the `Halted` condition when the spec was refused (a refused spec changes nothing).
/// Each condition has a function of its own below.
pub fn status(observed: &Observed<'_>, previous: Option<&CompositionStatus>) -> CompositionStatus {
    let Observed {
        generation, now, ..
    } = *observed;
    let condition = |type_: &str, status: bool, reason: &str, message: String| Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: Time(now),
    };
    // Without a halt decision the spec was refused (the controller decides halts only for valid
    // specs); `invalid` carries why.
    let mut conditions = match (observed.invalid, observed.halt) {
        (None, Some(decision)) => {
            let rollout = observed.rollout;
            let done = rollout.is_some_and(|rollout| rollout.done(observed.replicas));
            let progress = progress(rollout, observed.replicas);
            vec![
                ready(decision, done, progress.clone(), &condition),
                progressing(done, progress, &condition),
                condition(
                    conditions::HALTED,
                    decision.phase == Phase::Halted,
                    decision.phase.reason(),
                    halted_message(decision, previous),
                ),
                degraded(decision, observed.refused, observed.pods, &condition),
            ]
        }
        (invalid, _) => spec_refused(invalid, previous, &condition),
    };
    // A condition whose status is unchanged keeps the time it last changed.
    if let Some(previous) = previous {
        for condition in &mut conditions {
            if let Some(old) = find(&previous.conditions, &condition.type_) {
                if old.status == condition.status {
                    condition.last_transition_time = old.last_transition_time.clone();
                }
            }
        }
    }
    let mut status = CompositionStatus {
        observed_generation: generation,
        conditions,
        ..CompositionStatus::default()
    };
    counts(&mut status, observed, previous);
    status
}

/// The pods' counts, from the Deployment when there is one; else (a refused spec touches
/// nothing) as they were.
fn counts(
    status: &mut CompositionStatus,
    observed: &Observed<'_>,
    previous: Option<&CompositionStatus>,
) {
    let Some(rollout) = observed.rollout else {
        if let Some(previous) = previous {
            status.replicas = previous.replicas;
            status.ready_replicas = previous.ready_replicas;
            status.updated_replicas = previous.updated_replicas;
            status.ready.clone_from(&previous.ready);
            status.selector.clone_from(&previous.selector);
        }
        return;
    };
    status.replicas = Some(rollout.replicas);
    status.ready_replicas = Some(rollout.ready_replicas);
    status.updated_replicas = Some(rollout.updated_replicas);
    status.ready = Some(format!("{}/{}", rollout.ready_replicas, observed.replicas));
}

/// A refused spec: not ready, not progressing, degraded, all for the refusal's reason; the
/// `Halted` condition kept as it was.
fn spec_refused(
    invalid: Option<(&'static str, &str)>,
    previous: Option<&CompositionStatus>,
    condition: &impl Fn(&str, bool, &str, String) -> Condition,
) -> Vec<Condition> {
    let (reason, message) = invalid.unwrap_or((reasons::INVALID_SPEC, "the spec was not checked"));
    let message = message.to_owned();
    let not_rolled_out = if reason == reasons::INVALID_SPEC {
        "the refused spec is not rolled out; what runs is left as it was"
    } else {
        "nothing is rolled out until that is resolved; what runs is left as it was"
    };
    let mut conditions = vec![
        condition(conditions::READY, false, reason, message.clone()),
        condition(
            conditions::PROGRESSING,
            false,
            reason,
            not_rolled_out.to_owned(),
        ),
        condition(conditions::DEGRADED, true, reason, message),
    ];
    if let Some(halted) = previous.and_then(|p| find(&p.conditions, conditions::HALTED)) {
        conditions.push(halted.clone());
    }
    conditions
}

/// How far the rollout is, in words.
fn progress(rollout: Option<Rollout>, replicas: i32) -> String {
    match rollout {
        None => "waiting for the Deployment".to_owned(),
        Some(rollout) => format!(
            "{} of {replicas} pods updated, {} available, {} in all",
            rollout.updated_replicas, rollout.available_replicas, rollout.replicas
        ),
    }
}

/// `Ready`: rolled out and not stopped by a halt.
fn ready(
    decision: &Decision,
    done: bool,
    progress: String,
    condition: &impl Fn(&str, bool, &str, String) -> Condition,
) -> Condition {
    if matches!(decision.phase, Phase::ScalingDown | Phase::Halted) {
        condition(
            conditions::READY,
            false,
            reasons::HALTED,
            "stopped by a halt".to_owned(),
        )
    } else if done {
        condition(conditions::READY, true, reasons::ROLLED_OUT, progress)
    } else {
        condition(conditions::READY, false, reasons::ROLLING_OUT, progress)
    }
}

/// `Progressing`: a rollout of this generation is under way.
fn progressing(
    done: bool,
    progress: String,
    condition: &impl Fn(&str, bool, &str, String) -> Condition,
) -> Condition {
    if done {
        condition(
            conditions::PROGRESSING,
            false,
            reasons::ROLLED_OUT,
            progress,
        )
    } else {
        condition(
            conditions::PROGRESSING,
            true,
            reasons::ROLLING_OUT,
            progress,
        )
    }
}

/// `Degraded`: pods the Deployment cannot create first (`PodsRefused`), then failing containers
/// (`PodsFailing`), then agents that did not answer and pods without an IP (`AgentsUnreachable`);
/// each pod named with what is wrong.
fn degraded(
    decision: &Decision,
    refused: Option<&str>,
    pods: &[Seen],
    condition: &impl Fn(&str, bool, &str, String) -> Condition,
) -> Condition {
    let failing: Vec<String> = pods
        .iter()
        .filter(|pod| !pod.troubles.is_empty())
        .map(|pod| format!("{}: {}", pod.name, pod.troubles.join("; ")))
        .collect();
    let unreachable: Vec<String> = decision
        .unreachable
        .iter()
        .map(|(pod, why)| format!("{pod}: {why}"))
        .chain(
            pods.iter()
                .filter(|pod| pod.ip.is_none() && !pod.terminating)
                .map(|pod| format!("{}: no pod IP yet", pod.name)),
        )
        .collect();
    let unreachable_message = || {
        format!(
            "the control endpoint did not answer on {}",
            unreachable.join("; ")
        )
    };
    if let Some(refused) = refused {
        let message = std::iter::once(format!("the Deployment cannot create pods: {refused}"))
            .chain(failing)
            .collect::<Vec<_>>()
            .join(" | ");
        condition(conditions::DEGRADED, true, reasons::PODS_REFUSED, message)
    } else if !failing.is_empty() {
        let mut message = failing.join(" | ");
        if !unreachable.is_empty() {
            message = format!("{message} | {}", unreachable_message());
        }
        condition(conditions::DEGRADED, true, reasons::PODS_FAILING, message)
    } else if !unreachable.is_empty() {
        condition(
            conditions::DEGRADED,
            true,
            reasons::AGENTS_UNREACHABLE,
            unreachable_message(),
        )
    } else {
        // Never an empty message: an API server turns "" into null in a merge patch of a custom
        // resource and refuses the status (found end to end on v1.20).
        condition(
            conditions::DEGRADED,
            false,
            reasons::AS_EXPECTED,
            "every pod runs and its agent answers the control endpoint".to_owned(),
        )
    }
}

/// The `Halted` message: the phase's, except for a called-off halt, which names the pods that
/// were busy: given by the decision that called it off, then kept from the previous status
/// while the halt stays called off (later reconciles see the pods resumed, no longer busy).
fn halted_message(decision: &Decision, previous: Option<&CompositionStatus>) -> String {
    if decision.phase != Phase::CalledOff {
        return halt_message(decision.phase).to_owned();
    }
    if !decision.busy.is_empty() {
        return format!(
            "not quiet within grace; busy: {}; every pod resumes, a new halt follows later",
            decision.busy.join(", ")
        );
    }
    previous
        .and_then(|p| find(&p.conditions, conditions::HALTED))
        .filter(|old| old.reason == decision.phase.reason())
        .map_or_else(
            || halt_message(decision.phase).to_owned(),
            |old| old.message.clone(),
        )
}

fn halt_message(phase: Phase) -> &'static str {
    match phase {
        Phase::Running => "no halt asked for",
        Phase::Requested => "a halt was asked for",
        Phase::Pausing => "telling every pod to pause",
        Phase::QuietWatch => "every pod is paused; waiting for the quiet window",
        Phase::ScalingDown => "quiet for the window: scaling to zero",
        Phase::Halted => "stopped: no pod runs",
        Phase::CalledOff => "not quiet within grace: every pod resumes; a new halt follows later",
        Phase::Resuming => "the halt is over: resuming every pod",
    }
}

/// Whether writing `new` would change anything but transition times: the linkerd rule that keeps
/// the controller from patching status on every reconcile.
pub fn changed(old: Option<&CompositionStatus>, new: &CompositionStatus) -> bool {
    let Some(old) = old else { return true };
    let counts = |s: &CompositionStatus| {
        (
            s.replicas,
            s.ready_replicas,
            s.updated_replicas,
            s.ready.clone(),
            s.selector.clone(),
        )
    };
    if old.observed_generation != new.observed_generation
        || old.conditions.len() != new.conditions.len()
        || counts(old) != counts(new)
    {
        return true;
    }
    new.conditions.iter().any(|condition| {
        find(&old.conditions, &condition.type_).is_none_or(|old| {
            old.status != condition.status
                || old.reason != condition.reason
                || old.message != condition.message
                || old.observed_generation != condition.observed_generation
        })
    })
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

#[cfg(test)]
mod tests;
