//! The halt: a quiet composition halts and comes back; a busy one's halt is called off, whether
//! it calls or is called by another composition; a pod whose agent does not answer holds the halt
//! back; and a halt under way survives an operator restart.

use kube::ResourceExt;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toa_operator::Composition;

use crate::node::PodView;
use crate::support::{
    agent_status, apply, assert_disposed_before_stopped, assert_no_failed_hooks,
    broker_credentials, components_of, composition, compositions, condition, control_tokens, count,
    deployment, describe, halting, lifecycle, ready_pods, running_two, scale_to, uids,
    wait_condition, wait_halted, wait_no_pods, wait_pods, warnings, Suite, BROKER_CREDENTIALS,
    PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, node, services, wait};

/// A quiet composition halts: agents paused → scaled to zero → `Halted=True` once no pod is left,
/// and `dispose` ran;
/// then `halted: false` brings it back, `preflight` running anew in new pods.
pub async fn halt_quiet_then_unhalt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-halt-quiet", "quiet");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 2, 30);
    let pods = running_two(&suite, namespace, name, &spec).await;

    let start = Instant::now();
    apply(&suite, &spec(true)).await;
    let halted = wait_halted(&suite, namespace, name).await;
    eprintln!(
        "e2e: halt_quiet: Halted=True {:.1} s after halted: true",
        start.elapsed().as_secs_f64()
    );
    let ready = condition(&halted, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Halted")
    );
    assert_eq!(
        deployment(&suite, namespace, name)
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(0)
    );
    // `Halted=True` only once no pod is left, not even one still terminating (draining).
    let left = node::pods(&suite.admin, namespace, name).await.unwrap();
    assert!(
        left.is_empty(),
        "Halted=True with pods left: {:?}",
        left.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    assert_no_failed_hooks(&suite, namespace).await;
    for pod in &pods {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "dispose"],
            "{}: paused, then disposed on the way down",
            pod.name
        );
        assert_disposed_before_stopped(&suite, pod);
    }

    // `kubectl scale` while halted: the Deployment stays at zero, the scale takes effect on resume.
    let scaled = scale_to(&suite, namespace, name, 3).await;
    wait_condition(&suite, namespace, name, "Halted", "True", None, PATIENCE).await;
    let observed = compositions(&suite, namespace).get(name).await.unwrap();
    assert!(observed.status.as_ref().unwrap().observed_generation >= Some(scaled));
    let stays = deployment(&suite, namespace, name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .replicas;
    assert_eq!(stays, Some(0), "halted: zero whatever spec.replicas says");
    assert_eq!(observed.status.unwrap().ready.as_deref(), Some("0/0"));

    let mut unhalted = spec(false);
    unhalted["spec"]["replicas"] = json!(3);
    apply(&suite, &unhalted).await;
    let back = wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    assert_eq!(condition(&back, "Halted").unwrap().status, "False");
    let again = wait_pods(&suite, namespace, name, 3).await;
    let counted = eventually("3/3 ready in the status", PATIENCE, || async {
        let now = compositions(&suite, namespace)
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        let status = now.status.clone().unwrap_or_default();
        match status.ready.as_deref() {
            Some("3/3") => Ok(status),
            _ => Err(describe(&now)),
        }
    })
    .await;
    assert_eq!(
        (counted.replicas, counted.ready_replicas),
        (Some(3), Some(3))
    );
    // The scale subresource reads them back, with the pods' selector (what an autoscaler uses).
    let read = compositions(&suite, namespace)
        .get_scale(name)
        .await
        .unwrap();
    let status = read.status.unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (
            3,
            Some("app.kubernetes.io/instance=quiet,toa.io/composition=quiet")
        )
    );
    assert!(uids(&again).is_disjoint(&uids(&pods)), "new pods");
    for pod in &again {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready"],
            "{}",
            pod.name
        );
    }
    eventually("the halt record is removed", PATIENCE, || {
        let api = compositions(&suite, namespace);
        async move {
            let composition = api.get(name).await.map_err(|e| e.to_string())?;
            if composition.annotations().contains_key("toa.io/halt") {
                Err(describe(&composition))
            } else {
                Ok(())
            }
        }
    })
    .await;
}

/// A busy composition's halt is called off: the pods resume (same pods, same processes),
/// `dispose` does not run, `Halted=False` names the busy pod.
pub async fn halt_busy_called_off(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-halt-busy", "busy");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 3, 8);
    let pods = running_two(&suite, namespace, name, &spec).await;
    let busy = pods[0].clone();

    // Calls into the first pod, all along: its recorder calls its own `echo` through its agent
    // every 0.3 s, as the harness asks.
    suite.harness.ask(&busy.name, json!({ "do": "call" }));
    eventually("the busy pod calls", PATIENCE, || async {
        let called = count(&suite, &busy, "called");
        if called > 0 {
            Ok(())
        } else {
            Err(format!("{:?}", suite.harness.names(&busy.name)))
        }
    })
    .await;
    let start = Instant::now();
    apply(&suite, &spec(true)).await;
    let called_off = wait_condition(
        &suite,
        namespace,
        name,
        "Halted",
        "False",
        Some("HaltCalledOff"),
        PATIENCE,
    )
    .await;
    eprintln!(
        "e2e: halt_busy: called off {:.1} s after halted: true",
        start.elapsed().as_secs_f64()
    );
    let message = condition(&called_off, "Halted").unwrap().message;
    assert!(
        message.contains(&busy.name),
        "names the busy pod {}: {message}",
        busy.name
    );
    assert!(
        !message.contains(&pods[1].name),
        "names only the busy pod: {message}"
    );
    let said = warnings(&suite, namespace, name, "HaltCalledOff").await;
    assert!(
        said.iter()
            .any(|(r, note)| r == "HaltCalledOff" && note.contains(&busy.name)),
        "{said:?}"
    );
    // Stop asking for the halt before it is tried again (grace after the call-off).
    apply(&suite, &spec(false)).await;
    suite.harness.ask(&busy.name, json!({ "do": "stop" }));
    let answered = count(&suite, &busy, "called");
    assert!(
        answered > 5,
        "the calls went through during the halt: {answered}"
    );

    let tokens = control_tokens(&suite, namespace, name).await;
    let after = ready_pods(&suite, namespace, name, 2).await;
    assert_eq!(uids(&after), uids(&pods), "the same pods");
    for (pod, before) in after.iter().zip(&pods) {
        // The same containers, never restarted: the same processes.
        assert_eq!(
            pod.containers, before.containers,
            "{}: the same containers",
            pod.name
        );
        let status = agent_status(pod, &tokens).await;
        assert_eq!(status["phase"], "running", "{}: {status}", pod.name);
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "resume"],
            "{}",
            pod.name
        );
    }
}

/// Composition A is called only by composition B, over the broker: while B calls, A is busy
/// (the calls it *receives* count), so its halt is called off naming its pod; once B stops, A's
/// halt stops it.
pub async fn halt_of_a_composition_called_by_another(suite: Arc<Suite>) {
    let namespace = "e2e-calls";
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-calls-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    cluster::restricted_namespace(&suite.admin, namespace).await;
    broker_credentials(&suite, namespace).await;
    let of = |name: &str, component: &str, halted: bool| {
        composition(
            namespace,
            name,
            json!({
                "application": "e2e-calls",
                "components": components_of(component),
                "context": { "amqp": rabbit.url() },
                "credentials": { "secretName": BROKER_CREDENTIALS },
                "halted": halted,
                "halt": { "quietWindow": 3, "grace": 10 },
            }),
        )
    };
    apply(&suite, &of("caller", "caller", false)).await;
    apply(&suite, &of("callee", "callee", false)).await;
    let caller = ready_pods(&suite, namespace, "caller", 1).await.remove(0);
    let callee = ready_pods(&suite, namespace, "callee", 1).await.remove(0);

    suite.harness.ask(
        &caller.name,
        json!({ "do": "call", "target": "e2e.callee.echo" }),
    );
    // Three answered calls: the caller's calls flow (a first call can meet the callee's queue
    // while it is still being bound, and wait out its deadline).
    eventually("the caller calls the callee", PATIENCE, || async {
        if count(&suite, &caller, "called") >= 3 {
            Ok(())
        } else {
            Err(format!("{:?}", suite.harness.names(&caller.name)))
        }
    })
    .await;
    apply(&suite, &of("callee", "callee", true)).await;
    let called_off = decided_halt(&suite, namespace, "callee").await;
    let message = condition(&called_off, "Halted").unwrap().message;
    assert!(
        condition(&called_off, "Halted").unwrap().reason == "HaltCalledOff",
        "the callee was halted while called: {message}; the caller's last calls: {:?}",
        last_events(&suite, &caller, 12)
    );
    // Received calls, running or ended, whichever the pod's last report had: a call can be in
    // flight at the very moment of the check (a CI run saw `1 calls in flight`).
    assert!(
        message.contains(&callee.name)
            && (message.contains("since the pause") || message.contains("calls in flight")),
        "names the callee, busy with calls it received: {message}"
    );

    // The caller stops: the callee is quiet, and the halt asked again stops it.
    suite.harness.ask(&caller.name, json!({ "do": "stop" }));
    apply(&suite, &of("callee", "callee", false)).await;
    wait_condition(&suite, namespace, "callee", "Ready", "True", None, PATIENCE).await;
    let start = Instant::now();
    apply(&suite, &of("callee", "callee", true)).await;
    wait_halted(&suite, namespace, "callee").await;
    eprintln!(
        "e2e: halt_called: Halted=True {:.1} s after the caller stopped",
        start.elapsed().as_secs_f64()
    );
}

/// Waits until the Composition's halt was decided, either way: called off or halted.
async fn decided_halt(suite: &Suite, namespace: &str, name: &str) -> Composition {
    let api = compositions(suite, namespace);
    eventually(
        &format!("{namespace}/{name}'s halt is decided"),
        PATIENCE,
        || {
            let api = api.clone();
            async move {
                let composition = api.get(name).await.map_err(|e| e.to_string())?;
                let decided = condition(&composition, "Halted").is_some_and(|c| {
                    (c.reason == "HaltCalledOff" || c.status == "True")
                        && c.observed_generation == composition.metadata.generation
                });
                if decided {
                    Ok(composition)
                } else {
                    Err(describe(&composition))
                }
            }
        },
    )
    .await
}

/// The pod's recorder's last `n` reports, with their details and times.
fn last_events(suite: &Suite, pod: &PodView, n: usize) -> Vec<String> {
    let events = suite.harness.events(&pod.name);
    events
        .iter()
        .skip(events.len().saturating_sub(n))
        .map(|e| format!("{} {:?}", e.event, e.details))
        .collect()
}

/// A pod whose agent does not answer (SIGSTOP) during a halt: `Degraded=True` names it and the
/// composition is not stopped, since that pod cannot prove it is idle; once it answers again the
/// halt completes.
pub async fn unanswering_pod_during_halt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-unanswering", "frozen");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 1, 60);
    let pods = running_two(&suite, namespace, name, &spec).await;
    let frozen = &pods[0];
    // The agent container's processes frozen (cgroup freezer): it answers nothing, for less than
    // its liveness probe's 30 s.
    let agent = frozen.agent_container();
    suite.node.freeze(&agent);
    let thaw = Thaw(suite.clone(), agent);

    apply(&suite, &spec(true)).await;
    let degraded = wait_condition(
        &suite,
        namespace,
        name,
        "Degraded",
        "True",
        Some("AgentsUnreachable"),
        PATIENCE,
    )
    .await;
    let message = condition(&degraded, "Degraded").unwrap().message;
    assert!(
        message.contains(&frozen.name),
        "names {}: {message}",
        frozen.name
    );
    assert!(!message.contains(&pods[1].name), "{message}");
    // For four quiet windows, nothing is stopped while the pod cannot answer.
    wait::always(
        "the composition is not stopped while a pod does not answer",
        Duration::from_secs(4),
        || {
            let suite = suite.clone();
            async move {
                let composition = compositions(&suite, namespace)
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let replicas = deployment(&suite, namespace, name)
                    .await
                    .and_then(|d| d.spec?.replicas);
                let halted = condition(&composition, "Halted").is_some_and(|c| c.status == "True");
                if halted || replicas != Some(2) {
                    Err(format!("replicas {replicas:?}; {}", describe(&composition)))
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;

    drop(thaw);
    wait_halted(&suite, namespace, name).await;
    let composition = compositions(&suite, namespace).get(name).await.unwrap();
    assert_eq!(condition(&composition, "Degraded").unwrap().status, "False");
    wait_no_pods(&suite, namespace, name).await;
    assert_no_failed_hooks(&suite, namespace).await;
    for pod in &pods {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "dispose"],
            "{}",
            pod.name
        );
    }
}

/// Thaws a frozen container when dropped, even when the scenario fails.
struct Thaw(Arc<Suite>, String);

impl Drop for Thaw {
    fn drop(&mut self) {
        self.0.node.thaw(&self.1);
    }
}

/// The operator stops in the middle of a halt; the next one completes it.
pub async fn operator_restart_during_halt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-restart", "restart");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 4, 60);
    let pods = running_two(&suite, namespace, name, &spec).await;
    let tokens = control_tokens(&suite, namespace, name).await;

    apply(&suite, &spec(true)).await;
    // Every agent paused for the recorded halt: the halt is under way.
    let record = eventually(
        "the halt is recorded and every pod paused",
        PATIENCE,
        || {
            let suite = suite.clone();
            let (pods, tokens) = (pods.clone(), tokens.clone());
            async move {
                let composition = compositions(&suite, namespace)
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let record = composition
                    .annotations()
                    .get("toa.io/halt")
                    .cloned()
                    .ok_or_else(|| describe(&composition))?;
                for pod in &pods {
                    let status = agent_status(pod, &tokens).await;
                    if status["phase"] != "paused" {
                        return Err(format!("{}: {status}", pod.name));
                    }
                }
                Ok(record)
            }
        },
    )
    .await;
    assert!(!record.contains("stopped"), "not stopped yet: {record}");

    let mut operator = suite.operator.lock().await;
    operator.stop().await;
    operator.start().await;
    drop(operator);

    wait_halted(&suite, namespace, name).await;
    wait_no_pods(&suite, namespace, name).await;
    let composition = compositions(&suite, namespace).get(name).await.unwrap();
    let after = composition
        .annotations()
        .get("toa.io/halt")
        .cloned()
        .unwrap_or_default();
    let id = |record: &str| record.split('@').next().unwrap_or_default().to_owned();
    assert_eq!(
        id(&after),
        id(&record),
        "the same halt completed: {record} → {after}"
    );
    assert!(after.contains("stopped"), "{after}");
    assert_no_failed_hooks(&suite, namespace).await;
    for pod in &pods {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "dispose"],
            "{}",
            pod.name
        );
    }
}
