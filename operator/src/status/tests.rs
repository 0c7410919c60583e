use super::*;
use crate::halt::Step;
use crate::observed::pods::Seen;
use crate::observed::rollout::{replica_failure, Rollout};
use k8s_openapi::api::apps::v1::Deployment;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn running() -> Decision {
    Decision {
        phase: Phase::Running,
        step: Step::Nothing,
        unreachable: vec![],
        busy: vec![],
    }
}

fn rolled_out(generation: i64, replicas: i32) -> Rollout {
    Rollout {
        generation: Some(generation),
        observed_generation: Some(generation),
        replicas,
        updated_replicas: replicas,
        available_replicas: replicas,
        ready_replicas: replicas,
    }
}

#[test]
fn the_counts_come_from_the_deployment_and_a_refused_spec_keeps_them() {
    let mut rollout = rolled_out(2, 3);
    (rollout.ready_replicas, rollout.updated_replicas) = (2, 1);
    let decision = running();
    let new = status(&observed(Some(rollout), &decision, at(0)), None);
    assert_eq!(
        (new.replicas, new.ready_replicas, new.updated_replicas),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(new.ready.as_deref(), Some("2/3"));
    let mut refused = observed(None, &decision, at(1));
    (refused.invalid, refused.halt) = (Some((reasons::INVALID_SPEC, "no")), None);
    let kept = status(&refused, Some(&new));
    assert_eq!(
        (kept.ready.as_deref(), kept.replicas),
        (Some("2/3"), Some(3))
    );
    // A count that moved is written even when no condition did.
    let mut more = new.clone();
    (more.ready_replicas, more.ready) = (Some(3), Some("3/3".into()));
    assert!(changed(Some(&new), &more));
    assert!(!changed(Some(&new), &new.clone()));
}

fn observed<'a>(rollout: Option<Rollout>, halt: &'a Decision, now: Timestamp) -> Observed<'a> {
    Observed {
        generation: Some(2),
        invalid: None,
        rollout,
        refused: None,
        replicas: 3,
        halt: Some(halt),
        pods: &[],
        now,
    }
}

fn get<'a>(status: &'a CompositionStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

#[test]
fn a_refused_spec_is_ready_false_with_the_exact_message() {
    let message = "Atomicity takes an odd number of addresses, 2 given.";
    let status = status(
        &Observed {
            generation: Some(4),
            invalid: Some((crate::crd::reasons::INVALID_SPEC, message)),
            rollout: Some(rolled_out(1, 3)),
            refused: None,
            replicas: 3,
            halt: None,
            pods: &[],
            now: at(0),
        },
        None,
    );
    assert_eq!(status.observed_generation, Some(4));
    let ready = get(&status, conditions::READY);
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, reasons::INVALID_SPEC);
    assert_eq!(ready.message, message);
    assert_eq!(ready.observed_generation, Some(4));
    assert_eq!(get(&status, conditions::DEGRADED).status, "True");
    assert_eq!(get(&status, conditions::PROGRESSING).status, "False");
}

#[test]
fn ready_only_once_the_deployment_rolled_out_this_generation() {
    let halt = running();
    let status = status(&observed(Some(rolled_out(5, 3)), &halt, at(0)), None);
    let ready = get(&status, conditions::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "RolledOut")
    );
    assert_eq!(ready.observed_generation, Some(2));
    let progressing = get(&status, conditions::PROGRESSING);
    assert_eq!(progressing.status, "False");
    assert_eq!(get(&status, conditions::HALTED).status, "False");
    assert_eq!(get(&status, conditions::HALTED).reason, "Running");
    assert_eq!(get(&status, conditions::DEGRADED).status, "False");
}

#[test]
fn not_ready_while_any_rollout_measure_lags() {
    let halt = running();
    let lagging = [
        None,
        Some(Rollout {
            observed_generation: Some(4),
            ..rolled_out(5, 3)
        }),
        Some(Rollout {
            updated_replicas: 2,
            ..rolled_out(5, 3)
        }),
        Some(Rollout {
            available_replicas: 2,
            ..rolled_out(5, 3)
        }),
        // An old pod still terminating.
        Some(Rollout {
            replicas: 4,
            ..rolled_out(5, 3)
        }),
        Some(Rollout {
            generation: None,
            ..rolled_out(5, 3)
        }),
    ];
    for rollout in lagging {
        let status = status(&observed(rollout, &halt, at(0)), None);
        let ready = get(&status, conditions::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "RollingOut"),
            "{rollout:?}"
        );
        assert_eq!(get(&status, conditions::PROGRESSING).status, "True");
    }
}

#[test]
fn a_stopped_halt_is_halted_and_not_ready() {
    let halt = Decision {
        phase: Phase::Halted,
        ..running()
    };
    let status = status(
        &Observed {
            replicas: 0,
            ..observed(Some(rolled_out(5, 0)), &halt, at(0))
        },
        None,
    );
    let halted = get(&status, conditions::HALTED);
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "Halted")
    );
    let ready = get(&status, conditions::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Halted")
    );
}

#[test]
fn unreachable_agents_make_the_composition_degraded() {
    let halt = Decision {
        phase: Phase::Pausing,
        step: Step::Nothing,
        unreachable: vec![("shop-1".into(), "timed out after 2 s".into())],
        busy: vec![],
    };
    let status = status(&observed(Some(rolled_out(5, 3)), &halt, at(0)), None);
    let degraded = get(&status, conditions::DEGRADED);
    assert_eq!(degraded.status, "True");
    assert_eq!(degraded.reason, reasons::AGENTS_UNREACHABLE);
    assert!(
        degraded.message.contains("shop-1: timed out after 2 s"),
        "{}",
        degraded.message
    );
    assert_eq!(get(&status, conditions::HALTED).reason, "Pausing");
}

/// The `Degraded` condition for a rolled-out composition with these pods.
fn degraded_with(pods: &[Seen], halt: &Decision) -> Condition {
    let status = status(
        &Observed {
            pods,
            ..observed(Some(rolled_out(5, 3)), halt, at(0))
        },
        None,
    );
    get(&status, conditions::DEGRADED).clone()
}

fn seen(name: &str, ip: Option<&str>, troubles: &[&str]) -> Seen {
    Seen {
        name: name.into(),
        ip: ip.map(|ip| ip.parse().unwrap()),
        terminating: false,
        running: true,
        finished: false,
        owned: true,
        troubles: troubles.iter().map(|t| (*t).to_owned()).collect(),
    }
}

#[test]
fn failing_containers_make_the_composition_degraded_naming_pod_container_and_reason() {
    let pods = [
        seen("shop-0", Some("10.0.0.1"), &[]),
        seen(
            "shop-1",
            Some("10.0.0.2"),
            &["container agent CrashLoopBackOff: back-off 10s, restarted 2 times; last ended Error (exit code 64)"],
        ),
        seen("shop-2", None, &[]),
    ];
    let halt = Decision {
        unreachable: vec![("shop-1".into(), "connection refused".into())],
        ..running()
    };
    let degraded = degraded_with(&pods, &halt);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", reasons::PODS_FAILING)
    );
    assert_eq!(
        degraded.message,
        "shop-1: container agent CrashLoopBackOff: back-off 10s, restarted 2 times; last ended \
         Error (exit code 64) | the control endpoint did not answer on shop-1: connection \
         refused; shop-2: no pod IP yet"
    );
}

#[test]
fn a_pod_without_an_ip_is_not_an_agent_that_answers() {
    let pods = [
        seen("shop-0", Some("10.0.0.1"), &[]),
        seen("shop-1", None, &[]),
    ];
    let halt = running();
    let degraded = degraded_with(&pods, &halt);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", reasons::AGENTS_UNREACHABLE)
    );
    assert_eq!(
        degraded.message,
        "the control endpoint did not answer on shop-1: no pod IP yet"
    );
    // Being deleted, it is on its way out: nothing to report.
    let going = [Seen {
        terminating: true,
        ..seen("shop-1", None, &[])
    }];
    let later = super::status(
        &Observed {
            pods: &going,
            ..observed(Some(rolled_out(5, 3)), &halt, at(0))
        },
        None,
    );
    assert_eq!(get(&later, conditions::DEGRADED).status, "False");
}

#[test]
fn unchanged_conditions_keep_their_transition_time_and_need_no_patch() {
    let halt = running();
    let first = status(&observed(Some(rolled_out(5, 3)), &halt, at(0)), None);
    let second = status(
        &observed(Some(rolled_out(5, 3)), &halt, at(60)),
        Some(&first),
    );
    assert_eq!(first, second);
    assert!(!changed(Some(&first), &second));
}

#[test]
fn a_changed_condition_gets_a_new_transition_time_and_a_patch() {
    let halt = running();
    let first = status(&observed(None, &halt, at(0)), None);
    let second = status(
        &observed(Some(rolled_out(5, 3)), &halt, at(60)),
        Some(&first),
    );
    assert!(changed(Some(&first), &second));
    assert_eq!(
        get(&second, conditions::READY).last_transition_time,
        Time(at(60))
    );
    // Halted stayed False: its time is kept.
    assert_eq!(
        get(&second, conditions::HALTED).last_transition_time,
        Time(at(0))
    );
}

#[test]
fn changed_ignores_only_transition_times() {
    let halt = running();
    let base = status(&observed(Some(rolled_out(5, 3)), &halt, at(0)), None);
    assert!(changed(None, &base));
    let mut later = base.clone();
    for condition in &mut later.conditions {
        condition.last_transition_time = Time(at(99));
    }
    assert!(!changed(Some(&base), &later));
    let mut new_message = base.clone();
    new_message.conditions[0].message = "other".into();
    assert!(changed(Some(&base), &new_message));
    let mut new_generation = base.clone();
    new_generation.observed_generation = Some(3);
    assert!(changed(Some(&base), &new_generation));
    let mut fewer = base.clone();
    fewer.conditions.pop();
    assert!(changed(Some(&base), &fewer));
}

#[test]
fn a_refused_spec_keeps_the_previous_halted_condition() {
    let halt = Decision {
        phase: Phase::QuietWatch,
        ..running()
    };
    let before = status(&observed(Some(rolled_out(5, 3)), &halt, at(0)), None);
    let after = status(
        &Observed {
            invalid: Some((crate::crd::reasons::INVALID_SPEC, "bad")),
            halt: None,
            ..observed(Some(rolled_out(5, 3)), &halt, at(10))
        },
        Some(&before),
    );
    assert_eq!(
        get(&after, conditions::HALTED),
        get(&before, conditions::HALTED)
    );
}

#[test]
fn every_condition_has_a_message() {
    // An API server turns an empty message into null in a merge patch of the status and refuses
    // it; the end-to-end suite found it on Degraded=False (v1.20).
    let halts = [
        running(),
        Decision {
            phase: Phase::CalledOff,
            ..running()
        },
        Decision {
            phase: Phase::Halted,
            ..running()
        },
    ];
    for halt in &halts {
        for rollout in [None, Some(rolled_out(5, 3))] {
            let status = status(&observed(rollout, halt, at(0)), None);
            for condition in &status.conditions {
                assert!(!condition.message.is_empty(), "{condition:?}");
            }
        }
    }
    let refused = status(
        &Observed {
            invalid: Some((crate::crd::reasons::INVALID_SPEC, "bad")),
            halt: None,
            ..observed(None, &halts[0], at(0))
        },
        None,
    );
    assert!(refused.conditions.iter().all(|c| !c.message.is_empty()));
}

#[test]
fn a_called_off_halt_names_the_busy_pods_and_keeps_naming_them() {
    let calling_off = Decision {
        phase: Phase::CalledOff,
        busy: vec!["shop-1: 12 calls since the pause".into()],
        ..running()
    };
    let first = status(&observed(Some(rolled_out(5, 3)), &calling_off, at(0)), None);
    let halted = get(&first, conditions::HALTED);
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("False", "HaltCalledOff")
    );
    assert!(
        halted
            .message
            .contains("busy: shop-1: 12 calls since the pause"),
        "{}",
        halted.message
    );
    // Later reconciles see the pods resumed, no longer busy: the message stays.
    let resuming = Decision {
        phase: Phase::CalledOff,
        ..running()
    };
    let later = status(
        &observed(Some(rolled_out(5, 3)), &resuming, at(5)),
        Some(&first),
    );
    assert_eq!(get(&later, conditions::HALTED).message, halted.message);
    assert!(!changed(Some(&first), &later));
}

#[test]
fn pods_the_deployment_cannot_create_are_degraded_with_the_replicasets_reason() {
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shop", "generation": 2},
        "status": {"observedGeneration": 2, "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
             "message": "pods \"shop-7d9\" is forbidden: violates PodSecurity \"restricted:latest\""}
        ]}
    }))
    .unwrap();
    let refused = replica_failure(&deployment).unwrap();
    assert_eq!(
        refused,
        r#"FailedCreate: pods "shop-7d9" is forbidden: violates PodSecurity "restricted:latest""#
    );
    let halt = running();
    let status = status(
        &Observed {
            refused: Some(&refused),
            ..observed(Some(Rollout::of(&deployment)), &halt, at(0))
        },
        None,
    );
    let degraded = get(&status, conditions::DEGRADED);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", reasons::PODS_REFUSED)
    );
    assert_eq!(
        degraded.message,
        format!("the Deployment cannot create pods: {refused}")
    );
    assert_eq!(get(&status, conditions::READY).status, "False");

    // A condition that went back to False, or none at all, is nothing.
    let mut cleared = deployment.clone();
    cleared
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[1]
        .status = "False".into();
    assert_eq!(replica_failure(&cleared), None);
    assert_eq!(replica_failure(&Deployment::default()), None);
}
