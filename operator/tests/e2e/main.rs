//! End to end: the operator against a real API server (kube-apiserver and kube-controller-manager
//! v1.20 from `scripts/control-plane`) and a real node (kubelet v1.20, containerd, runc and a CNI
//! bridge from `scripts/node`), running images built from this workspace's binaries
//! (`scripts/images`): nothing is simulated. What a v1.20 node cannot show is unit-tested and
//! named in docs/testing.md (the native sidecar style needs ≥ 1.29; Pod Security admission, ≥ 1.23,
//! is replaced by a check of the pods against the restricted profile's rules).
//!
//! One test, `end_to_end`, starts one control plane and one node for every scenario: nextest runs
//! each test in a process of its own, and a control plane takes seconds to start and two cores to
//! run, so one process owns it, from start to stop. The scenarios run concurrently, each in a
//! namespace of its own, on the same operator; then, alone, two operator replicas (the leader
//! killed) and the operator's own image; the operator restart and the deletion run last. A failed
//! scenario does not stop the others: all run, then the test fails naming each failure.
//!
//! Setup: the chart rendered by `charts/render.py` is applied server-side (CRD, ServiceAccount,
//! RBAC, Service); the operator runs as a process with the chart Deployment's arguments under the
//! chart's ServiceAccount (its token from the Secret v1.20's token controller creates), so a
//! permission the chart lacks fails the suite (and any `forbidden` in its log fails it too); the
//! API server listens on loopback, which pods cannot reach, so only the image scenario runs the
//! chart's own Deployment (host network, a kubeconfig Secret). Pods run the agent image and
//! `localhost/toa/python:e2e`, whose component `e2e.recorder` tells the suite's harness
//! ([`harness`], on the node's bridge) what happens in its container and does what the harness
//! asks of it.
//!
//! The control plane is v1.20: no CEL, so a Composition with two Redis addresses is accepted by
//! the API server and refused by the operator's reconcile-time check, which is what the
//! `invalid_spec` scenario asserts (on a server with CEL the create itself is refused).

mod cluster;
mod harness;
mod node;
mod operator;
mod services;
mod wait;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toa_operator::desired::DECLARATIONS;
use toa_operator::lease::{DURATION, RENEW};
use toa_operator::Composition;

use cluster::ControlPlane;
use harness::Harness;
use node::{Node, PodView};
use operator::Operator;
use wait::eventually;

const COMPONENT: &str = "e2e.recorder";
/// The image every e2e Composition runs (scripts/images).
const IMAGE: &str = "localhost/toa/python:e2e";
/// How long anything may take to happen once asked for.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long pods being replaced may take to be gone: a pod's stop may use its grace period
/// (95 s by default), and the kubelet's cleanup after the containers died has taken over a minute
/// on this node before the API object went.
const STOP_PATIENCE: Duration = Duration::from_secs(150);

/// The suite's shared parts.
struct Suite {
    admin: Client,
    node: Node,
    harness: Harness,
    chart: cluster::Chart,
    /// The operator's kubeconfig (the chart's ServiceAccount).
    operator_kubeconfig: std::path::PathBuf,
    operator: tokio::sync::Mutex<Operator>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end() {
    let started = Instant::now();
    let root = std::env::temp_dir().join(format!("toa-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let agent = cluster::workspace_binary("toa-agent", "toa-agent");
    let terminals = cluster::workspace_binary("toa-example-terminals", "toa-example-terminals");

    let plane = ControlPlane::start(&root.join("control-plane"));
    let admin = cluster::client(&plane.kubeconfig).await;
    let node = Node::start(&root.join("n"), &plane.kubeconfig);
    let harness = Harness::start(node::BRIDGE_IP.parse().unwrap()).await;
    node.import_images(
        &agent,
        std::path::Path::new(env!("CARGO_BIN_EXE_toa-operator")),
        &terminals,
        &harness.url,
    );
    let chart = cluster::install_chart(&admin, "toa-system").await;
    let mut operator = Operator::under_chart(&admin, &plane, &chart, &root).await;
    operator.start().await;
    eprintln!(
        "e2e: control plane, node, images, chart and operator up in {:.1} s (state in {})",
        started.elapsed().as_secs_f64(),
        root.display()
    );
    let suite = Arc::new(Suite {
        admin,
        node,
        harness,
        chart,
        operator_kubeconfig: root.join("operator.kubeconfig"),
        operator: tokio::sync::Mutex::new(operator),
    });

    type Scenario = fn(Arc<Suite>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    let concurrent: Vec<(&str, Scenario)> = vec![
        ("ready", |s| Box::pin(ready(s))),
        ("invalid_spec", |s| Box::pin(invalid_spec(s))),
        ("halt_quiet_then_unhalt", |s| {
            Box::pin(halt_quiet_then_unhalt(s))
        }),
        ("halt_busy_called_off", |s| {
            Box::pin(halt_busy_called_off(s))
        }),
        ("halt_of_a_composition_called_by_another", |s| {
            Box::pin(halt_of_a_composition_called_by_another(s))
        }),
        ("spec_change_rolls_out", |s| {
            Box::pin(spec_change_rolls_out(s))
        }),
        ("unanswering_pod_during_halt", |s| {
            Box::pin(unanswering_pod_during_halt(s))
        }),
        ("atomicity_splits_slots", |s| {
            Box::pin(atomicity_splits_slots(s))
        }),
        ("failing_pods_are_degraded", |s| {
            Box::pin(failing_pods_are_degraded(s))
        }),
        ("slow_preflight_is_not_killed", |s| {
            Box::pin(slow_preflight_is_not_killed(s))
        }),
        ("a_crashed_program_is_served_again", |s| {
            Box::pin(a_crashed_program_is_served_again(s))
        }),
    ];
    // Second, alone: a second replica, and the leader killed, which leaves no reconciling
    // operator for seconds; it ends with the suite's operator the leader again.
    let replicas: Vec<(&str, Scenario)> = vec![("two_replicas_one_leader", |s| {
        Box::pin(two_replicas_one_leader(s))
    })];
    // Alone too: the operator's own image replaces the suite's operator for a while.
    let image: Vec<(&str, Scenario)> = vec![("the_operator_image_runs", |s| {
        Box::pin(the_operator_image_runs(s))
    })];
    // Last: the operator restart, which must not stop another scenario's operator, and the
    // deletion, which relies on the garbage collector only: it learns of the CRD at its first
    // resync, 30 s after the controller manager started, so the later, the shorter the wait.
    let alone: Vec<(&str, Scenario)> = vec![
        ("operator_restart_during_halt", |s| {
            Box::pin(operator_restart_during_halt(s))
        }),
        ("deletion_cleans_up", |s| Box::pin(deletion_cleans_up(s))),
    ];
    let mut failures = Vec::new();
    // TOA_E2E_ONLY=ready,halt_quiet_then_unhalt runs only those (while working on them).
    let only = std::env::var("TOA_E2E_ONLY").ok();
    let chosen = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    for batch in [concurrent, replicas, image, alone] {
        let batch: Vec<(&str, Scenario)> = batch.into_iter().filter(|(n, _)| chosen(n)).collect();
        let runs = batch.into_iter().map(|(name, scenario)| {
            let suite = suite.clone();
            async move {
                let start = Instant::now();
                let result = tokio::spawn(scenario(suite)).await;
                let took = start.elapsed().as_secs_f64();
                match result {
                    Ok(()) => {
                        eprintln!("e2e: {name} passed in {took:.1} s");
                        None
                    }
                    Err(error) => {
                        let message = match error.try_into_panic() {
                            Ok(payload) => payload
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default(),
                            Err(error) => error.to_string(),
                        };
                        eprintln!("e2e: {name} FAILED in {took:.1} s: {message}");
                        Some(format!("{name}: {message}"))
                    }
                }
            }
        });
        failures.extend(futures::future::join_all(runs).await.into_iter().flatten());
    }

    let mut operator = suite.operator.lock().await;
    operator.check_running();
    // No hot loop: once everything has settled, a composition is looked at again only on its
    // resync (5 min) or while something is pending (every 5 s).
    let before = operator.reconciles().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = operator.reconciles().await - before;
    eprintln!("e2e: reconciles in 6 s of idling: {idle}");
    if idle > 20 {
        failures.push(format!(
            "{idle} reconciles in 6 s with nothing changing: a hot loop"
        ));
    }
    if let Some(pid) = operator.pid() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss = status.lines().find(|line| line.starts_with("VmRSS:"));
        eprintln!("e2e: the operator's memory at the end: {rss:?}");
    }
    let log = operator.log();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("forbidden") || line.contains("Forbidden"))
        .take(5)
        .collect();
    if !forbidden.is_empty() {
        failures.push(format!(
            "the operator was refused requests its RBAC should grant:\n{}",
            forbidden.join("\n")
        ));
    }
    operator.stop().await;
    drop(operator);
    eprintln!(
        "e2e: all scenarios done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        let tail = suite.operator.lock().await.tail(80);
        panic!(
            "{} scenario(s) failed:\n{}\n\nthe operator's log, last lines:\n{tail}\n(the pods' logs \
             under {}, the kubelet's in {}; TOA_E2E_KEEP=1 keeps them)",
            failures.len(),
            failures.join("\n"),
            suite.node.dir().join("log/pods").display(),
            suite.node.dir().join("kubelet.log").display(),
        );
    }
    // The node goes before the control plane it reports to.
    drop(suite);
    drop(plane);
    if std::env::var_os("TOA_E2E_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn manifest() -> serde_json::Value {
    manifest_of("recorder")
}

/// The recorder's manifest under another name (component `e2e.<name>`).
fn manifest_of(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "namespace": "e2e",
        // Every e2e component's directory in the image holds the recorder.
        "program": ["python3", "recorder.py"],
        "lifecycle": ["preflight", "ready", "pause", "resume", "dispose"],
        "operations": { "echo": { "input": { "type": "object" } } }
    })
}

/// A Composition of the recorder, with `spec` merged over the defaults.
fn composition(namespace: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut base = json!({
        "application": "e2e",
        "image": IMAGE,
        "replicas": 1,
        "components": [{ "name": COMPONENT, "manifest": manifest() }],
    });
    for (key, value) in spec.as_object().unwrap() {
        base[key] = value.clone();
    }
    json!({
        "apiVersion": "toa.io/v1alpha1",
        "kind": "Composition",
        "metadata": { "name": name, "namespace": namespace },
        "spec": base,
    })
}

/// A two-replica Composition of the recorder with halt windows of `quiet` and `grace` seconds,
/// by whether it is `halted`.
fn halting(
    namespace: &'static str,
    name: &'static str,
    quiet: u32,
    grace: u32,
) -> impl Fn(bool) -> serde_json::Value {
    move |halted| {
        let halt = json!({ "quietWindow": quiet, "grace": grace });
        composition(
            namespace,
            name,
            json!({ "replicas": 2, "halted": halted, "halt": halt }),
        )
    }
}

/// Applies `spec(false)` and waits for its two pods.
async fn running_two(
    suite: &Suite,
    namespace: &str,
    name: &str,
    spec: &impl Fn(bool) -> serde_json::Value,
) -> Vec<PodView> {
    apply(suite, &spec(false)).await;
    ready_pods(suite, namespace, name, 2).await
}

/// Applies a Composition as a user would (server-side apply, field manager `e2e`).
async fn apply(suite: &Suite, object: &serde_json::Value) -> Composition {
    let namespace = object["metadata"]["namespace"].as_str().unwrap();
    let name = object["metadata"]["name"].as_str().unwrap();
    compositions(suite, namespace)
        .patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|error| panic!("applying Composition {namespace}/{name}: {error}"))
}

fn compositions(suite: &Suite, namespace: &str) -> Api<Composition> {
    Api::namespaced(suite.admin.clone(), namespace)
}

fn condition(composition: &Composition, type_: &str) -> Option<Condition> {
    composition
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

fn describe(composition: &Composition) -> String {
    let conditions: Vec<String> = composition
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .map(|c| {
            format!(
                "{}={} ({}: {}; gen {:?})",
                c.type_, c.status, c.reason, c.message, c.observed_generation
            )
        })
        .collect();
    format!(
        "generation {:?}, annotations {:?}, conditions [{}]",
        composition.metadata.generation,
        composition.annotations(),
        conditions.join(", ")
    )
}

/// Waits until the Composition's condition `type_` has `status` (and `reason`, when given) for
/// its current generation; returns the Composition.
async fn wait_condition(
    suite: &Suite,
    namespace: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    timeout: Duration,
) -> Composition {
    let api = compositions(suite, namespace);
    eventually(
        &format!("{namespace}/{name} has {type_}={status} ({reason:?})"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let composition = api.get(name).await.map_err(|e| e.to_string())?;
                let found = condition(&composition, type_).is_some_and(|c| {
                    c.status == status
                        && reason.is_none_or(|r| c.reason == r)
                        && c.observed_generation == composition.metadata.generation
                });
                if found {
                    Ok(composition)
                } else {
                    Err(describe(&composition))
                }
            }
        },
    )
    .await
}

/// Waits until the composition has exactly `count` pods, every one Ready and none being deleted;
/// returns them by name.
async fn wait_pods(suite: &Suite, namespace: &str, name: &str, count: usize) -> Vec<PodView> {
    eventually(
        &format!("{namespace}/{name} runs {count} ready pods"),
        STOP_PATIENCE,
        || async move {
            let list = node::pods(&suite.admin, namespace, name).await?;
            let ready: Vec<PodView> = list
                .iter()
                .filter(|pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                })
                .filter_map(PodView::of)
                .collect();
            if list.len() != count || ready.len() != count {
                return Err(format!(
                    "{} pods, {} ready: {:?}",
                    list.len(),
                    ready.len(),
                    list.iter().map(|p| p.name_any()).collect::<Vec<_>>()
                ));
            }
            let mut ready = ready;
            ready.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(ready)
        },
    )
    .await
}

/// `Ready=True`, then the composition's `count` running pods.
async fn ready_pods(suite: &Suite, namespace: &str, name: &str, count: usize) -> Vec<PodView> {
    wait_condition(suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    wait_pods(suite, namespace, name, count).await
}

/// Waits until no pod of the composition is left: the kubelet reported every container stopped
/// and the pod was removed.
async fn wait_no_pods(suite: &Suite, namespace: &str, name: &str) {
    eventually(
        &format!("{namespace}/{name} has no pods"),
        STOP_PATIENCE,
        || async move {
            let list = node::pods(&suite.admin, namespace, name).await?;
            if list.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "pods {:?}",
                    list.iter().map(|p| p.name_any()).collect::<Vec<_>>()
                ))
            }
        },
    )
    .await
}

/// The run commands the recorder ran in `pod`.
fn lifecycle(suite: &Suite, pod: &PodView) -> Vec<String> {
    suite.harness.lifecycle(&pod.name, COMPONENT)
}

async fn control_token(suite: &Suite, namespace: &str, name: &str) -> String {
    let secret = Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .get(&format!("{name}-control"))
        .await
        .expect("the control Secret");
    String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap()
}

/// The agent's own report, from its control endpoint on the pod's IP.
async fn agent_status(pod: &PodView, token: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("http://{}:7091/control/status", pod.ip))
        .bearer_auth(token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|error| panic!("status of {}: {error}", pod.name))
        .json()
        .await
        .unwrap()
}

async fn deployment(suite: &Suite, namespace: &str, name: &str) -> Option<Deployment> {
    Api::<Deployment>::namespaced(suite.admin.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

/// How many `event`s the pod's recorder told.
fn count(suite: &Suite, pod: &PodView, event: &str) -> usize {
    suite
        .harness
        .events(&pod.name)
        .iter()
        .filter(|e| e.event == event)
        .count()
}

/// The preStop drain ran `dispose` in the real container before the kubelet stopped it.
fn assert_disposed_before_stopped(suite: &Suite, pod: &PodView) {
    let names = suite.harness.names(&pod.name);
    let dispose = names.iter().position(|n| n == "dispose");
    let stopped = names.iter().position(|n| n == "sigterm");
    assert!(
        matches!((dispose, stopped), (Some(d), Some(s)) if d < s),
        "{}: dispose, then SIGTERM: {names:?}",
        pod.name
    );
}

fn uids(pods: &[PodView]) -> BTreeSet<String> {
    pods.iter().map(|p| p.uid.clone()).collect()
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// A valid Composition → its Deployment → pods → `Ready=True`.
async fn ready(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-ready", "shop");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let start = Instant::now();
    apply(
        &suite,
        &composition(namespace, name, json!({ "replicas": 2 })),
    )
    .await;
    let created = eventually("the Deployment exists", PATIENCE, || {
        let suite = suite.clone();
        async move {
            deployment(&suite, namespace, name)
                .await
                .ok_or("no Deployment yet".to_owned())
        }
    })
    .await;
    eprintln!(
        "e2e: ready: Deployment created {:.2} s after apply",
        start.elapsed().as_secs_f64()
    );
    let owner = created
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Composition" && o.name == name && o.controller == Some(true)),
        "the Deployment is owned by the Composition: {owner:?}"
    );
    let composition = wait_condition(
        &suite,
        namespace,
        name,
        "Ready",
        "True",
        Some("RolledOut"),
        PATIENCE,
    )
    .await;
    eprintln!(
        "e2e: ready: Ready=True {:.2} s after apply",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(
        composition.status.as_ref().unwrap().observed_generation,
        composition.metadata.generation
    );
    for (type_, status) in [
        ("Progressing", "False"),
        ("Halted", "False"),
        ("Degraded", "False"),
    ] {
        let found = condition(&composition, type_);
        assert_eq!(
            found.as_ref().map(|c| c.status.as_str()),
            Some(status),
            "{type_}: {}",
            describe(&composition)
        );
    }
    let pods = wait_pods(&suite, namespace, name, 2).await;
    let token = control_token(&suite, namespace, name).await;
    let http = reqwest::Client::new();
    for pod in &pods {
        // Every container started once and stayed up: the agent read its token (its control
        // endpoint answers with it), nothing crash-looped.
        assert_eq!(
            pod.restarts(),
            [("agent".to_owned(), 0), ("component-0".to_owned(), 0)].into(),
            "{}",
            pod.name
        );
        let status = agent_status(pod, &token).await;
        assert_eq!(status["phase"], "running", "{}: {status}", pod.name);
        assert_eq!(status["instance"], pod.name.as_str(), "{status}");
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready"],
            "{}",
            pod.name
        );
        // The agent's ports were bound before the component's container started: the program
        // tried each and found it taken.
        let binds: Vec<(u64, bool)> = suite
            .harness
            .events(&pod.name)
            .iter()
            .filter(|e| e.event == "bind")
            .map(|e| {
                (
                    e.details["port"].as_u64().unwrap(),
                    e.details["taken"] == true,
                )
            })
            .collect();
        assert_eq!(
            binds,
            [(7090, true), (7091, true), (7092, true)],
            "{}",
            pod.name
        );
        // Prometheus's view: the pod IP, the probe port, no token.
        let metrics = http
            .get(format!("http://{}:7092/metrics", pod.ip))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("/metrics of {}: {e}", pod.name));
        let text = metrics.text().await.unwrap();
        assert!(text.contains("toa_"), "{}: {text}", pod.name);
        // The namespace is labelled restricted; v1.20 has no Pod Security admission to enforce
        // it, so the pod as the API server stored it is checked against the profile's rules.
        let spec = pod.pod.spec.clone().unwrap();
        assert_eq!(
            toa_operator::restricted::violations(&spec),
            Vec::<String>::new(),
            "{}",
            pod.name
        );
    }
    let manifests = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace)
        .get(&format!("{name}-components"))
        .await
        .expect("the ConfigMap of manifests");
    assert!(manifests
        .data
        .unwrap()
        .contains_key(&format!("{COMPONENT}.yaml")));
}

/// Two Redis addresses: `Ready=False`, `InvalidSpec`, the exact message, nothing deployed; and a
/// running composition changed to that keeps its Deployment and pods as they were.
async fn invalid_spec(suite: Arc<Suite>) {
    const MESSAGE: &str = "Atomicity takes an odd number of addresses, 2 given.";
    let namespace = "e2e-invalid";
    cluster::namespace(&suite.admin, namespace).await;
    let two =
        json!({ "atomicity": { "redis": ["redis://127.0.0.1:6379", "redis://127.0.0.1:6380"] } });

    // New: v1.20 has no CEL, so the API server takes it and the operator refuses it.
    apply(
        &suite,
        &composition(namespace, "even", json!({ "context": two })),
    )
    .await;
    let refused = wait_condition(
        &suite,
        namespace,
        "even",
        "Ready",
        "False",
        Some("InvalidSpec"),
        PATIENCE,
    )
    .await;
    assert_eq!(condition(&refused, "Ready").unwrap().message, MESSAGE);
    let degraded = condition(&refused, "Degraded").unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "InvalidSpec")
    );
    assert!(
        deployment(&suite, namespace, "even").await.is_none(),
        "nothing deployed"
    );
    assert!(Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace)
        .get_opt("even-components")
        .await
        .unwrap()
        .is_none());
    assert!(Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .get_opt("even-control")
        .await
        .unwrap()
        .is_none());

    // Running, then refused: what runs stays.
    apply(&suite, &composition(namespace, "kept", json!({}))).await;
    wait_condition(&suite, namespace, "kept", "Ready", "True", None, PATIENCE).await;
    let before = deployment(&suite, namespace, "kept").await.unwrap();
    let pods = wait_pods(&suite, namespace, "kept", 1).await;
    apply(
        &suite,
        &composition(
            namespace,
            "kept",
            json!({ "context": two, "image": "e2e.local/recorder:2" }),
        ),
    )
    .await;
    let refused = wait_condition(
        &suite,
        namespace,
        "kept",
        "Ready",
        "False",
        Some("InvalidSpec"),
        PATIENCE,
    )
    .await;
    assert_eq!(condition(&refused, "Ready").unwrap().message, MESSAGE);
    let after = deployment(&suite, namespace, "kept").await.unwrap();
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "the Deployment is untouched"
    );
    assert_eq!(after.spec, before.spec);
    assert_eq!(
        uids(&wait_pods(&suite, namespace, "kept", 1).await),
        uids(&pods)
    );
}

/// A quiet composition halts: agents paused → scaled to zero → `Halted=True`, and `dispose` ran;
/// then `halted: false` brings it back, `preflight` running anew in new pods.
async fn halt_quiet_then_unhalt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-halt-quiet", "quiet");
    cluster::namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 2, 30);
    let pods = running_two(&suite, namespace, name, &spec).await;

    let start = Instant::now();
    apply(&suite, &spec(true)).await;
    let halted = wait_condition(
        &suite,
        namespace,
        name,
        "Halted",
        "True",
        Some("Halted"),
        PATIENCE,
    )
    .await;
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
    wait_no_pods(&suite, namespace, name).await;
    for pod in &pods {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "dispose"],
            "{}: paused, then disposed on the way down",
            pod.name
        );
        assert_disposed_before_stopped(&suite, pod);
    }

    apply(&suite, &spec(false)).await;
    let back = wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    assert_eq!(condition(&back, "Halted").unwrap().status, "False");
    let again = wait_pods(&suite, namespace, name, 2).await;
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
async fn halt_busy_called_off(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-halt-busy", "busy");
    cluster::namespace(&suite.admin, namespace).await;
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
    // Stop asking for the halt before it is tried again (grace after the call-off).
    apply(&suite, &spec(false)).await;
    suite.harness.ask(&busy.name, json!({ "do": "stop" }));
    let answered = count(&suite, &busy, "called");
    assert!(
        answered > 5,
        "the calls went through during the halt: {answered}"
    );

    let token = control_token(&suite, namespace, name).await;
    let after = ready_pods(&suite, namespace, name, 2).await;
    assert_eq!(uids(&after), uids(&pods), "the same pods");
    for (pod, before) in after.iter().zip(&pods) {
        // The same containers, never restarted: the same processes.
        assert_eq!(
            pod.containers, before.containers,
            "{}: the same containers",
            pod.name
        );
        let status = agent_status(pod, &token).await;
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
async fn halt_of_a_composition_called_by_another(suite: Arc<Suite>) {
    let namespace = "e2e-calls";
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-calls-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    cluster::namespace(&suite.admin, namespace).await;
    let of = |name: &str, component: &str, halted: bool| {
        composition(
            namespace,
            name,
            json!({
                "application": "e2e-calls",
                "components": [{ "name": format!("e2e.{component}"), "manifest": manifest_of(component) }],
                "context": { "amqp": rabbit.url() },
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
    eventually("the caller calls the callee", PATIENCE, || async {
        if count(&suite, &caller, "called") > 0 {
            Ok(())
        } else {
            Err(format!("{:?}", suite.harness.names(&caller.name)))
        }
    })
    .await;
    apply(&suite, &of("callee", "callee", true)).await;
    let called_off = wait_condition(
        &suite,
        namespace,
        "callee",
        "Halted",
        "False",
        Some("HaltCalledOff"),
        PATIENCE,
    )
    .await;
    let message = condition(&called_off, "Halted").unwrap().message;
    assert!(
        message.contains(&callee.name) && message.contains("since the pause"),
        "names the callee, busy with calls it received: {message}"
    );

    // The caller stops: the callee is quiet, and the halt asked again stops it.
    suite.harness.ask(&caller.name, json!({ "do": "stop" }));
    apply(&suite, &of("callee", "callee", false)).await;
    wait_condition(&suite, namespace, "callee", "Ready", "True", None, PATIENCE).await;
    let start = Instant::now();
    apply(&suite, &of("callee", "callee", true)).await;
    wait_condition(
        &suite,
        namespace,
        "callee",
        "Halted",
        "True",
        Some("Halted"),
        PATIENCE,
    )
    .await;
    eprintln!(
        "e2e: halt_called: Halted=True {:.1} s after the caller stopped",
        start.elapsed().as_secs_f64()
    );
}

/// A spec change rolls out: new pods replace the old ones, `Ready=True` for the new generation;
/// each old pod's preStop drain runs `dispose` in its real container before the kubelet stops it.
async fn spec_change_rolls_out(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-rollout", "roll");
    cluster::namespace(&suite.admin, namespace).await;
    let spec = |memory: &str| {
        let resources = json!({ "limits": { "memory": memory } });
        composition(
            namespace,
            name,
            json!({ "replicas": 2, "resources": resources }),
        )
    };
    apply(&suite, &spec("200Mi")).await;
    let old = ready_pods(&suite, namespace, name, 2).await;
    let generation = deployment(&suite, namespace, name)
        .await
        .unwrap()
        .metadata
        .generation;

    let changed = apply(&suite, &spec("210Mi")).await;
    let rolled = wait_condition(
        &suite,
        namespace,
        name,
        "Ready",
        "True",
        Some("RolledOut"),
        PATIENCE,
    )
    .await;
    assert_eq!(rolled.metadata.generation, changed.metadata.generation);
    let new = wait_pods(&suite, namespace, name, 2).await;
    assert!(uids(&new).is_disjoint(&uids(&old)), "every pod replaced");
    let deployment = deployment(&suite, namespace, name).await.unwrap();
    assert!(deployment.metadata.generation > generation);
    for pod in &new {
        let limits = pod.pod.spec.as_ref().unwrap().containers[1]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap();
        assert_eq!(limits["memory"].0, "210Mi", "{}", pod.name);
    }
    for pod in &old {
        eventually(
            &format!("old pod {} stopped after dispose", pod.name),
            PATIENCE,
            || async {
                let names = suite.harness.names(&pod.name);
                if names.iter().any(|n| n == "sigterm") {
                    Ok(())
                } else {
                    Err(format!("{names:?}"))
                }
            },
        )
        .await;
        assert_eq!(
            lifecycle(&suite, pod).last().map(String::as_str),
            Some("dispose"),
            "{}",
            pod.name
        );
        assert_disposed_before_stopped(&suite, pod);
    }
}

/// Atomicity over a Redis and a broker the pods reach (the suite's own, on the node's bridge), 2
/// replicas: the pods' agents coordinate through Redis (not in-process, where each would own
/// every slot), so they split the 16 slots and a lock one pod holds keeps the other waiting; the
/// membership keys of the Composition's application are on the server; the component's shared
/// queue is on the broker.
async fn atomicity_splits_slots(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-atomicity", "atom");
    let application = "e2e-atom";
    let redis = services::Redis::start(node::BRIDGE_IP);
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    cluster::namespace(&suite.admin, namespace).await;
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

    // Through Redis: the slots' keys of this application, both pods among the members.
    let prefix = format!("toa:{application}:{COMPONENT}:slots:");
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

    // The broker: the component's shared queue, under the application's name.
    let queue = format!("toa.{application}.{COMPONENT}");
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
    // Stop the pods before their Redis and broker go.
    let mut stopped = composition(namespace, name, json!({ "application": application }));
    stopped["spec"]["replicas"] = json!(0);
    stopped["spec"]["context"] = json!({
        "atomicity": { "redis": [redis.url()], "interval": 300 },
        "amqp": rabbit.url(),
    });
    apply(&suite, &stopped).await;
    wait_no_pods(&suite, namespace, name).await;
}

/// Deleting the Composition deletes what it owns (the garbage collector, by owner references).
async fn deletion_cleans_up(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-delete", "gone");
    cluster::namespace(&suite.admin, namespace).await;
    // A second Composition in the namespace, of another component, shares toa-declarations and
    // stays.
    let stays = "stays";
    let keeper = json!({ "name": "e2e.keeper", "manifest": manifest_of("keeper") });
    let spec = json!({ "replicas": 0, "components": [keeper] });
    apply(&suite, &composition(namespace, stays, spec)).await;
    wait_condition(&suite, namespace, stays, "Ready", "True", None, PATIENCE).await;
    apply(&suite, &composition(namespace, name, json!({}))).await;
    let pods = ready_pods(&suite, namespace, name, 1).await;
    let declarations = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace);
    let managers = || async {
        let shared = declarations
            .get(DECLARATIONS)
            .await
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = shared
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|entry| entry.manager.clone())
            .collect();
        Ok::<_, String>((names, shared.data.unwrap_or_default()))
    };
    let (before, keys) = managers().await.unwrap();
    assert!(
        before.contains(&format!("toa-operator.{name}"))
            && before.contains(&format!("toa-operator.{stays}"))
            && keys.contains_key("e2e.recorder.yaml")
            && keys.contains_key("e2e.keeper.yaml"),
        "each Composition applies its part of {DECLARATIONS}: {before:?}, {:?}",
        keys.keys()
    );
    compositions(&suite, namespace)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("everything the composition owned is gone", PATIENCE, || {
        let suite = suite.clone();
        async move {
            let deployment = deployment(&suite, namespace, name).await.is_some();
            let config_map = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace)
                .get_opt(&format!("{name}-components"))
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            let secret = Api::<Secret>::namespaced(suite.admin.clone(), namespace)
                .get_opt(&format!("{name}-control"))
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            if deployment || config_map || secret {
                Err(format!(
                    "left: Deployment {deployment}, ConfigMap {config_map}, Secret {secret}"
                ))
            } else {
                Ok(())
            }
        }
    })
    .await;
    wait_no_pods(&suite, namespace, name).await;
    assert_disposed_before_stopped(&suite, &pods[0]);
    // The survivor's next reconcile takes back the deleted one's part of the shared map (poked
    // with an annotation, which reconciles: the garbage collector may not have removed the
    // deleted owner's reference by the first poke).
    let mut poke = 0;
    eventually("the deleted Composition's declarations are taken back", PATIENCE, || {
        poke += 1;
        let suite = suite.clone();
        async move {
            let patch = json!({ "metadata": { "annotations": { "e2e.toa.io/poke": poke.to_string() } } });
            compositions(&suite, namespace)
                .patch(stays, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| e.to_string())?;
            let (now, data) = managers().await?;
            let keys: Vec<&String> = data.keys().collect();
            if now.contains(&format!("toa-operator.{name}")) || keys != ["e2e.keeper.yaml"] {
                Err(format!("managers {now:?}, keys {keys:?}"))
            } else {
                Ok(())
            }
        }
    })
    .await;
}

/// A pod whose agent does not answer (SIGSTOP) during a halt: `Degraded=True` names it and the
/// composition is not stopped, since that pod cannot prove it is idle; once it answers again the
/// halt completes.
async fn unanswering_pod_during_halt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-unanswering", "frozen");
    cluster::namespace(&suite.admin, namespace).await;
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
    wait_condition(
        &suite,
        namespace,
        name,
        "Halted",
        "True",
        Some("Halted"),
        PATIENCE,
    )
    .await;
    let composition = compositions(&suite, namespace).get(name).await.unwrap();
    assert_eq!(condition(&composition, "Degraded").unwrap().status, "False");
    wait_no_pods(&suite, namespace, name).await;
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
async fn operator_restart_during_halt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-restart", "restart");
    cluster::namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 4, 60);
    let pods = running_two(&suite, namespace, name, &spec).await;
    let token = control_token(&suite, namespace, name).await;

    apply(&suite, &spec(true)).await;
    // Every agent paused for the recorded halt: the halt is under way.
    let record = eventually(
        "the halt is recorded and every pod paused",
        PATIENCE,
        || {
            let suite = suite.clone();
            let (pods, token) = (pods.clone(), token.clone());
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
                    let status = agent_status(pod, &token).await;
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

    wait_condition(
        &suite,
        namespace,
        name,
        "Halted",
        "True",
        Some("Halted"),
        PATIENCE,
    )
    .await;
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
    for pod in &pods {
        assert_eq!(
            lifecycle(&suite, pod),
            ["preflight", "ready", "pause", "dispose"],
            "{}",
            pod.name
        );
    }
}

/// The Lease's holder and spec, read as admin.
async fn lease_spec(leases: &Api<Lease>, name: &str) -> Result<LeaseSpec, String> {
    leases
        .get(name)
        .await
        .map_err(|e| format!("Lease {name}: {e}"))?
        .spec
        .ok_or_else(|| format!("Lease {name} has no spec"))
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or_default()
}

/// Two replicas on the same Lease: the second, started while the suite's operator leads, does
/// not reconcile (its reconcile counter stays 0 while its controller sees every Composition and
/// the leader reconciles a change); the leader killed (SIGKILL: the Lease is not given up), the
/// second takes the Lease once it expires and reconciles a Composition applied after the kill.
/// Then the suite's operator starts again and, the second stopped (giving the Lease up), leads
/// again, as the later scenarios expect.
async fn two_replicas_one_leader(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-replicas", "replicas");
    cluster::namespace(&suite.admin, namespace).await;
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
    apply(&suite, &composition(namespace, after, json!({}))).await;
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
/// `Degraded=True` within 30 s names the pod, the container and the kubelet's reason, read from
/// the pods' statuses; `kubectl get compositions` shows it.
async fn failing_pods_are_degraded(suite: Arc<Suite>) {
    let namespace = "e2e-failing";
    cluster::namespace(&suite.admin, namespace).await;
    // The image has no `node`: the container cannot start.
    let mut nodeless = manifest();
    nodeless["program"] = json!(["node", "server.js"]);
    let component = json!([{ "name": COMPONENT, "manifest": nodeless }]);
    // Nothing listens at this broker address (the node's bridge, port 1): the agent exits.
    let unreachable = json!({ "amqp": format!("amqp://{}:1", node::BRIDGE_IP) });
    // What each says, from the kubelet: the runtime's error; the end of the agent's log (its
    // termination message, `FallbackToLogsOnError`).
    let broker = format!("the broker at amqp://{}:1 is unreachable", node::BRIDGE_IP);
    let cases = [
        (
            "nodeless",
            json!({ "components": component }),
            "component-0",
            "executable file not found",
        ),
        (
            "agentless",
            json!({ "context": unreachable }),
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
            Duration::from_secs(30),
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
        assert_eq!(columns.get("Ready").map(String::as_str), Some("False"));
    }
}

/// A `preflight` of 40 s (past the ~30 s after which a liveness check on the control port, which
/// opened only after the lifecycle, killed the agent; under the 60 s run-command limit): the
/// agent is not restarted and the pod becomes Ready.
async fn slow_preflight_is_not_killed(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-slow", "slow");
    let slow = "e2e.slow";
    cluster::namespace(&suite.admin, namespace).await;
    let components = json!([{ "name": slow, "manifest": manifest_of("slow") }]);
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
        [("agent".to_owned(), 0), ("component-0".to_owned(), 0)].into()
    );
    assert_eq!(
        suite.harness.lifecycle(&pods[0].name, slow),
        ["preflight", "ready"]
    );
}

/// The component's program dies (a crash, asked through the harness): the kubelet restarts its
/// container, whose `postStart` hook tells the agent, and the agent (not restarted: it keeps its
/// ports) runs the lifecycle for the new program: the pod serves again, Ready.
async fn a_crashed_program_is_served_again(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-crash", "crash");
    cluster::namespace(&suite.admin, namespace).await;
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
            if ready && restarts["component-0"] >= 1 && lifecycle.len() >= 4 {
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
    let token = control_token(&suite, namespace, name).await;
    let status = agent_status(&again, &token).await;
    assert_eq!(status["phase"], "running", "{status}");
}

/// The chart's own Deployment, running the operator's image (built as its Dockerfile says): it
/// starts as uid 65532, takes the Lease and reconciles a Composition. Pods cannot reach the API
/// server on loopback, so this one pod runs on the host's network with a kubeconfig Secret (the
/// chart's ServiceAccount token), test-only; the suite's operator is stopped meanwhile.
async fn the_operator_image_runs(suite: Arc<Suite>) {
    let mut operator = suite.operator.lock().await;
    let lease = operator.lease();
    operator.stop().await;
    let run = tokio::spawn(operator_image(suite.clone(), lease)).await;
    // Whatever happened: the Deployment goes (its operator gives the Lease up on the way out),
    // and the suite's operator comes back for the scenarios after this one.
    let deployments = Api::<Deployment>::namespaced(suite.admin.clone(), &suite.chart.namespace);
    let _ = deployments
        .delete(&suite.chart.deployment.name_any(), &DeleteParams::default())
        .await;
    eventually(
        "the operator's pod is gone",
        Duration::from_secs(90),
        || async {
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
                suite.admin.clone(),
                &suite.chart.namespace,
            )
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
            if pods.items.is_empty() {
                Ok(())
            } else {
                Err(format!("{} pods left", pods.items.len()))
            }
        },
    )
    .await;
    operator.start().await;
    if let Err(error) = run {
        std::panic::resume_unwind(error.into_panic());
    }
}

async fn operator_image(suite: Arc<Suite>, (lease_namespace, lease_name): (String, String)) {
    let (namespace, name) = ("e2e-image", "imaged");
    cluster::namespace(&suite.admin, namespace).await;
    let chart_namespace = suite.chart.namespace.clone();
    let secrets = Api::<Secret>::namespaced(suite.admin.clone(), &chart_namespace);
    let kubeconfig = std::fs::read_to_string(&suite.operator_kubeconfig).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "e2e-operator-kubeconfig" },
        "stringData": { "config": kubeconfig },
    }))
    .unwrap();
    secrets
        .patch(
            "e2e-operator-kubeconfig",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
    let mut deployment = suite.chart.deployment.clone();
    deployment.metadata.managed_fields = None;
    let spec = deployment.spec.as_mut().unwrap();
    spec.replicas = Some(1);
    let pod = spec.template.spec.as_mut().unwrap();
    pod.host_network = Some(true);
    pod.volumes = Some(vec![serde_json::from_value(json!({
        "name": "kubeconfig",
        "secret": { "secretName": "e2e-operator-kubeconfig", "defaultMode": 0o440 },
    }))
    .unwrap()]);
    let container = &mut pod.containers[0];
    container.volume_mounts = Some(vec![serde_json::from_value(
        json!({ "name": "kubeconfig", "mountPath": "/var/run/e2e", "readOnly": true }),
    )
    .unwrap()]);
    container.env.get_or_insert_with(Vec::new).push(
        serde_json::from_value(json!({ "name": "KUBECONFIG", "value": "/var/run/e2e/config" }))
            .unwrap(),
    );
    let deployments = Api::<Deployment>::namespaced(suite.admin.clone(), &chart_namespace);
    let deployment_name = deployment.name_any();
    deployments
        .patch(
            &deployment_name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&deployment),
        )
        .await
        .unwrap();
    let leases = Api::<Lease>::namespaced(suite.admin.clone(), &lease_namespace);
    let holder_pod = eventually(
        "the operator's image takes the Lease",
        Duration::from_secs(90),
        || async {
            let spec = lease_spec(&leases, &lease_name).await?;
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
                suite.admin.clone(),
                &chart_namespace,
            )
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
            let running: Vec<String> = pods.items.iter().map(|p| p.name_any()).collect();
            if running.iter().any(|p| p == holder(&spec)) {
                return Ok(holder(&spec).to_owned());
            }
            let mut log = String::new();
            if let Some(pod) = running.first() {
                let params = kube::api::LogParams {
                    tail_lines: Some(10),
                    ..Default::default()
                };
                log = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
                    suite.admin.clone(),
                    &chart_namespace,
                )
                .logs(pod, &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            }
            Err(format!(
                "holder {:?}, pods {running:?}; the pod's log:\n{log}",
                spec.holder_identity
            ))
        },
    )
    .await;
    apply(&suite, &composition(namespace, name, json!({}))).await;
    wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    // Ready by its own probe (every 10 s), never restarted.
    eventually("the operator's pod is ready", PATIENCE, || async {
        let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
            suite.admin.clone(),
            &chart_namespace,
        )
        .get(&holder_pod)
        .await
        .map_err(|e| e.to_string())?;
        let container = pod
            .status
            .unwrap_or_default()
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .next()
            .ok_or("no container status")?;
        assert_eq!(container.restart_count, 0, "{container:?}");
        if container.ready {
            Ok(())
        } else {
            Err(format!("{container:?}"))
        }
    })
    .await;
    let log =
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(suite.admin.clone(), &chart_namespace)
            .logs(&holder_pod, &Default::default())
            .await
            .unwrap();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the image's operator was refused requests: {log}"
    );
}
