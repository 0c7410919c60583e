use super::*;
use serde_json::json;

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": "shop-7d9-abcde" },
        "status": status,
    }))
    .unwrap()
}

fn running(name: &str, ready: bool, restarts: i32) -> serde_json::Value {
    json!({
        "name": name, "ready": ready, "restartCount": restarts, "image": "i", "imageID": "",
        "state": { "running": { "startedAt": "2026-11-30T10:00:00Z" } },
    })
}

#[test]
fn a_healthy_pod_has_its_ip_and_no_trouble() {
    let seen = seen(&pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "containerStatuses": [running("agent", true, 0), running("component-0", true, 0)],
    })));
    assert_eq!(seen.name, "shop-7d9-abcde");
    assert_eq!(seen.ip, Some("10.244.0.7".parse().unwrap()));
    assert!(seen.troubles.is_empty(), "{:?}", seen.troubles);
    assert!(!seen.terminating);
}

#[test]
fn a_starting_pod_is_no_trouble_and_has_no_ip() {
    let seen = seen(&pod(json!({
        "phase": "Pending",
        "containerStatuses": [
            { "name": "agent", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
              "state": { "waiting": { "reason": "ContainerCreating" } } },
            running("component-0", false, 0),
        ],
    })));
    assert_eq!(seen.ip, None);
    assert!(seen.troubles.is_empty(), "{:?}", seen.troubles);
}

#[test]
fn a_crash_loop_names_the_container_the_reason_and_the_last_exit() {
    let seen = seen(&pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "containerStatuses": [
            { "name": "agent", "ready": false, "restartCount": 3, "image": "i", "imageID": "",
              "state": { "waiting": { "reason": "CrashLoopBackOff",
                                      "message": "back-off 40s restarting failed container=agent" } },
              "lastState": { "terminated": { "exitCode": 64, "reason": "Error",
                  "message": "--control-token-file /var/run/toa/control/token: Permission denied (os error 13)\n" } } },
            running("component-0", true, 0),
        ],
    })));
    assert_eq!(
        seen.troubles,
        [
            "container agent CrashLoopBackOff: back-off 40s restarting failed container=agent, \
          restarted 3 times; last ended Error (exit code 64): --control-token-file \
          /var/run/toa/control/token: Permission denied (os error 13)"
        ]
    );
}

#[test]
fn a_missing_program_is_named_with_the_end_of_the_runtimes_message() {
    let long = format!(
        "failed to create containerd task: {} exec: \"node\": executable file not found in $PATH: unknown",
        "x".repeat(300)
    );
    let seen = seen(&pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "containerStatuses": [
            running("agent", false, 0),
            { "name": "component-0", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
              "state": { "terminated": { "exitCode": 128, "reason": "StartError", "message": long } } },
        ],
    })));
    assert_eq!(seen.troubles.len(), 1, "{:?}", seen.troubles);
    let trouble = &seen.troubles[0];
    assert!(
        trouble.starts_with("container component-0 ended StartError (exit code 128): …"),
        "{trouble}"
    );
    assert!(
        trouble.ends_with("exec: \"node\": executable file not found in $PATH: unknown"),
        "{trouble}"
    );
    assert!(trouble.len() < 260, "{trouble}");
}

#[test]
fn running_but_not_ready_after_a_restart_is_trouble_before_it_is_not() {
    let after = seen(&pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "containerStatuses": [running("agent", false, 1), running("component-0", true, 1)],
    })));
    assert_eq!(
        after.troubles,
        ["container agent not ready, restarted once"]
    );
}

#[test]
fn waiting_for_an_image_that_is_not_there_is_trouble() {
    let seen = seen(&pod(json!({
        "phase": "Pending",
        "containerStatuses": [
            { "name": "component-0", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
              "state": { "waiting": { "reason": "ErrImageNeverPull",
                                      "message": "Container image \"e2e.local/none:1\" is not present with pull policy of Never" } } },
        ],
    })));
    assert_eq!(
        seen.troubles,
        ["container component-0 ErrImageNeverPull: Container image \"e2e.local/none:1\" is not present with pull policy of Never"]
    );
}

#[test]
fn an_evicted_pod_is_trouble_and_a_finished_init_container_is_not() {
    let seen = seen(&pod(json!({
        "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
        "initContainerStatuses": [
            { "name": "setup", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
              "state": { "terminated": { "exitCode": 0, "reason": "Completed" } } },
        ],
    })));
    assert_eq!(
        seen.troubles,
        ["pod Failed: Evicted: The node was low on resource: memory."]
    );
}

#[test]
fn a_native_sidecar_that_crashes_is_trouble() {
    let seen = seen(&pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "initContainerStatuses": [
            { "name": "agent", "ready": false, "restartCount": 2, "image": "i", "imageID": "",
              "state": { "terminated": { "exitCode": 1, "reason": "Error" } } },
        ],
        "containerStatuses": [running("component-0", true, 0)],
    })));
    assert_eq!(
        seen.troubles,
        ["container agent ended Error (exit code 1), restarted 2 times"]
    );
}

#[test]
fn a_pod_being_deleted_is_left_out() {
    let mut terminating = pod(json!({
        "phase": "Running", "podIP": "10.244.0.7",
        "containerStatuses": [
            { "name": "component-0", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
              "state": { "terminated": { "exitCode": 137, "reason": "Error" } } },
        ],
    }));
    terminating.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-30T10:00:00Z".parse().unwrap(),
        ));
    let seen = seen(&terminating);
    assert!(seen.terminating);
    assert!(seen.troubles.is_empty(), "{:?}", seen.troubles);
}

#[test]
fn a_halt_waits_for_owned_pods_being_deleted_but_not_for_finished_or_foreign_ones() {
    let owned = |phase: &str, deleting: bool| {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "shop-7d9-abcde",
                "labels": { "toa.io/composition": "shop", "pod-template-hash": "7d9" },
                "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "shop-7d9", "uid": "u", "controller": true }],
            },
            "status": { "phase": phase },
        }))
        .unwrap();
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-11-30T10:00:00Z".parse().unwrap(),
                ));
        }
        pod
    };
    assert!(seen(&owned("Running", true)).left(), "draining still");
    // The kubelet marks a deleted pod's phase once its containers ended, then removes it.
    assert!(seen(&owned("Succeeded", true)).left(), "not removed yet");
    assert!(seen(&owned("Pending", false)).left());
    assert!(
        !seen(&owned("Failed", false)).left(),
        "evicted: stays listed"
    );
    assert!(!seen(&owned("Succeeded", false)).left());
    let foreign = pod(json!({ "phase": "Running" }));
    assert!(
        !seen(&foreign).left(),
        "labelled, but no ReplicaSet of ours"
    );
}
