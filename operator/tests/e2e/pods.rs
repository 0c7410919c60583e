//! Pods in trouble and how the operator reports them or they come out of it: pods that cannot run
//! (`Degraded`), a slow `preflight` (not killed), a crashed program (served again).

use kube::ResourceExt;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::node::PodView;
use crate::support::{
    agent_status, apply, broker_credentials, components_of, composition, condition, control_tokens,
    lifecycle, ready_pods, wait_condition, wait_pods, warnings, Suite,
};
use crate::wait::eventually;
use crate::{cluster, node};

/// The columns `kubectl get compositions` prints, as the API server renders them (a Table).
async fn printed(suite: &Suite, namespace: &str, name: &str) -> BTreeMap<String, String> {
    let request = http::Request::get(format!(
        "/apis/toa.io/v1alpha1/namespaces/{namespace}/compositions/{name}"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: serde_json::Value = suite.admin.request(request).await.unwrap();
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let cells = table["rows"][0]["cells"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    columns
        .into_iter()
        .zip(cells)
        .map(|(column, cell)| {
            (
                column,
                cell.as_str().map_or(cell.to_string(), str::to_owned),
            )
        })
        .collect()
}

/// Pods that cannot run: a component image without its program, an agent that cannot start.
/// `Degraded=True` within 60 s names the pod, the container and the kubelet's reason, read from
/// the pods' statuses; `kubectl get compositions` shows it.
pub async fn failing_pods_are_degraded(suite: Arc<Suite>) {
    let namespace = "e2e-failing";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    // The image has no `node`: the container cannot start. A component of its own: the other
    // Composition of the namespace declares the recorder.
    let mut component = components_of("c000");
    component[0]["manifest"]["program"] = json!(["node", "server.js"]);
    // Nothing listens at this broker address (the node's bridge, port 1): the agent exits.
    let unreachable = json!({ "amqp": format!("amqp://{}:1", node::BRIDGE_IP) });
    let credentials = broker_credentials(&suite, namespace).await;
    // What each says, from the kubelet: the runtime's error; the end of the agent's log (its
    // termination message, `FallbackToLogsOnError`).
    let broker = format!("the broker at amqp://{}:1 is unreachable", node::BRIDGE_IP);
    let cases = [
        (
            "nodeless",
            json!({ "components": component }),
            "e2e-c000",
            "executable file not found",
        ),
        (
            "agentless",
            json!({ "context": unreachable, "credentials": credentials }),
            "agent",
            broker.as_str(),
        ),
    ];
    for (name, spec, _, _) in &cases {
        apply(&suite, &composition(namespace, name, spec.clone())).await;
    }
    let start = Instant::now();
    for (name, _, container, says) in cases {
        let degraded = wait_condition(
            &suite,
            namespace,
            name,
            "Degraded",
            "True",
            Some("PodsFailing"),
            // The agent fails only once a component attached: the native sidecar's startupProbe,
            // then the program's start, then its exit and the kubelet's report; 8–37 s measured
            // under the first batch's load, past 30 s once in a fresh clone's run.
            Duration::from_secs(60),
        )
        .await;
        let message = condition(&degraded, "Degraded").unwrap().message;
        eprintln!(
            "e2e: failing: {name} Degraded {:.1} s after apply: {message}",
            start.elapsed().as_secs_f64()
        );
        let pods = node::pods(&suite.admin, namespace, name).await.unwrap();
        assert_eq!(pods.len(), 1);
        let pod = pods[0].name_any();
        assert!(
            message.starts_with(&format!("{pod}: container {container} ")),
            "names the pod and the container: {message}"
        );
        let reasons = [
            "CrashLoopBackOff",
            "RunContainerError",
            "StartError",
            "ContainerCannotRun",
            "Error",
            "not ready",
        ];
        assert!(
            reasons.iter().any(|reason| message.contains(reason)),
            "names the kubelet's reason: {message}"
        );
        assert!(message.contains(says), "says why ({says}): {message}");
        let columns = printed(&suite, namespace, name).await;
        assert_eq!(
            columns.get("Degraded").map(String::as_str),
            Some("True"),
            "{columns:?}"
        );
        assert_eq!(
            columns.get("Ready").map(String::as_str),
            Some("0/1"),
            "{columns:?}"
        );
        let said = warnings(&suite, namespace, name, "PodsFailing").await;
        assert!(said.iter().any(|(_, note)| note.contains(&pod)), "{said:?}");
    }
}

/// A `preflight` of 40 s (past the ~30 s after which a liveness check on the control port, which
/// opened only after the lifecycle, killed the agent; under the 60 s run-command limit): the
/// agent is not restarted and the pod becomes Ready.
pub async fn slow_preflight_is_not_killed(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-slow", "slow");
    let slow = "e2e.slow";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let components = components_of("slow");
    let start = Instant::now();
    apply(
        &suite,
        &composition(namespace, name, json!({ "components": components })),
    )
    .await;
    wait_condition(
        &suite,
        namespace,
        name,
        "Ready",
        "True",
        None,
        Duration::from_secs(120),
    )
    .await;
    let took = start.elapsed();
    let pods = wait_pods(&suite, namespace, name, 1).await;
    eprintln!(
        "e2e: slow preflight: Ready {:.1} s after apply",
        took.as_secs_f64()
    );
    assert!(took >= Duration::from_secs(40), "preflight took its 40 s");
    assert_eq!(
        pods[0].restarts(),
        [("agent".to_owned(), 0), ("e2e-slow".to_owned(), 0)].into()
    );
    assert_eq!(
        suite.harness.lifecycle(&pods[0].name, slow),
        ["preflight", "ready"]
    );
}

/// The component's program dies (a crash, asked through the harness): the kubelet restarts its
/// container, whose `postStart` hook tells the agent, and the agent (not restarted: it keeps its
/// ports) runs the lifecycle for the new program: the pod serves again, Ready.
pub async fn a_crashed_program_is_served_again(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-crash", "crash");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    apply(&suite, &composition(namespace, name, json!({}))).await;
    let before = ready_pods(&suite, namespace, name, 1).await.remove(0);
    suite.harness.ask(&before.name, json!({ "do": "exit" }));
    let again = eventually(
        "the component's container restarted and the pod is Ready again",
        Duration::from_secs(120),
        || async {
            let pods = node::pods(&suite.admin, namespace, name).await?;
            let pod = pods.first().and_then(PodView::of).ok_or("no pod")?;
            let ready = pod
                .pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let restarts = pod.restarts();
            // Ready alone may be the kubelet's last probe from before the crash: the new
            // program's lifecycle is what says the pod serves again.
            let lifecycle = lifecycle(&suite, &pod);
            if ready && restarts["e2e-recorder"] >= 1 && lifecycle.len() >= 4 {
                Ok(pod)
            } else {
                Err(format!(
                    "ready {ready}, restarts {restarts:?}, lifecycle {lifecycle:?}"
                ))
            }
        },
    )
    .await;
    assert_eq!(again.uid, before.uid, "the same pod");
    assert_eq!(again.restarts()["agent"], 0, "the agent stayed");
    let lifecycle = lifecycle(&suite, &again);
    assert_eq!(
        lifecycle,
        ["preflight", "ready", "preflight", "ready"],
        "the lifecycle ran again"
    );
    let tokens = control_tokens(&suite, namespace, name).await;
    let status = agent_status(&again, &tokens).await;
    assert_eq!(status["phase"], "running", "{status}");
}
