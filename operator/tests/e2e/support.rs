//! What the scenarios share: the suite's parts ([`Suite`]), the e2e Composition and how to apply
//! it, and the waits and reads on the cluster every scenario file uses.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;
use toa_operator::Composition;

use crate::cluster;
use crate::harness::Harness;
use crate::node::{self, Node, PodView};
use crate::operator::Operator;
use crate::wait::eventually;

pub const COMPONENT: &str = "e2e.recorder";
/// The image every e2e Composition runs (scripts/images).
pub const IMAGE: &str = "localhost/toa/python:e2e";
/// How long anything may take to happen once asked for: 90 s, since the first batch starts some
/// twenty pods at once on two cores (a TypeScript pod took 36–44 s to be Ready in passing runs
/// and missed a 60 s bound once in a fresh clone's run).
pub const PATIENCE: Duration = Duration::from_secs(90);
/// How long pods being replaced may take to be gone: a pod's stop may use its grace period
/// (95 s by default), and the kubelet's cleanup after the containers died has taken over a minute
/// on this node before the API object went.
pub const STOP_PATIENCE: Duration = Duration::from_secs(150);

/// The suite's shared parts.
pub struct Suite {
    /// The Kubernetes release of the control plane and the node (`v1.37.2`).
    pub release: &'static str,
    pub admin: Client,
    /// The admin's kubeconfig, for kubectl.
    pub admin_kubeconfig: std::path::PathBuf,
    pub node: Node,
    pub harness: Harness,
    pub chart: crate::chart::Chart,
    /// The operator's kubeconfig (the chart's ServiceAccount).
    pub operator_kubeconfig: std::path::PathBuf,
    /// Where the suite keeps its state.
    pub root: std::path::PathBuf,
    /// The API server's port on loopback.
    pub api_port: u16,
    pub operator: tokio::sync::Mutex<Operator>,
}

impl Suite {
    /// `kubectl ARGS…` of the suite's release, as the admin.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> cluster::Kubectl {
        cluster::kubectl(self.release, &self.admin_kubeconfig, args, stdin)
    }
}

pub fn manifest() -> serde_json::Value {
    manifest_of("recorder")
}

/// The recorder's manifest under another name (component `e2e.<name>`).
pub fn manifest_of(name: &str) -> serde_json::Value {
    json!({
        "name": name,
        "namespace": "e2e",
        // Every e2e component's directory in the image holds the recorder.
        "program": ["python3", "recorder.py"],
        "lifecycle": ["preflight", "ready", "pause", "resume", "dispose"],
        "operations": { "echo": { "input": { "type": "object" } } }
    })
}

/// `spec.components` of the recorder under the name `e2e.<name>`: a directory of that name
/// holds it in the image (the fixtures', and `c000` … `c127`, scripts/images). One component
/// is one Composition's in a namespace, so a second Composition of a namespace needs one.
pub fn components_of(name: &str) -> serde_json::Value {
    json!([{ "name": format!("e2e.{name}"), "manifest": manifest_of(name) }])
}

/// A Composition of the recorder, with `spec` merged over the defaults.
pub fn composition(namespace: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
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
pub fn halting(
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
pub async fn running_two(
    suite: &Suite,
    namespace: &str,
    name: &str,
    spec: &impl Fn(bool) -> serde_json::Value,
) -> Vec<PodView> {
    apply(suite, &spec(false)).await;
    ready_pods(suite, namespace, name, 2).await
}

/// Asks `pod`'s recorder to do `command` and waits (10 s at most) for the `status` it tells with
/// the event `told`.
pub async fn asked_status(
    suite: &Suite,
    pod: &str,
    command: serde_json::Value,
    told: &str,
) -> serde_json::Value {
    suite.harness.ask(pod, command);
    eventually(
        &format!("{pod} told {told}"),
        Duration::from_secs(10),
        || async {
            suite
                .harness
                .events(pod)
                .into_iter()
                .find(|e| e.event == told)
                .map(|e| e.details["status"].clone())
                .ok_or_else(|| "no answer yet".to_owned())
        },
    )
    .await
}

/// The name of the credentials Secret [`broker_credentials`] writes.
pub const BROKER_CREDENTIALS: &str = "e2e-broker";

/// Writes the Secret [`BROKER_CREDENTIALS`] into `namespace` with the suite's RabbitMQ's user
/// (`guest`, which its configuration lets in from the pods' addresses): a pod's agent takes the
/// broker's credentials from a Secret only. Returns the spec's `credentials`.
pub async fn broker_credentials(suite: &Suite, namespace: &str) -> serde_json::Value {
    let guest = json!({ "amqp-username": "guest", "amqp-password": "guest" });
    credentials(suite, namespace, guest).await
}

/// Writes the Secret [`BROKER_CREDENTIALS`] into `namespace` holding `data` (its keys as the
/// credentials Secret takes them: `amqp-username`, `redis-password`, …). Returns the spec's
/// `credentials`.
pub async fn credentials(
    suite: &Suite,
    namespace: &str,
    data: serde_json::Value,
) -> serde_json::Value {
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": BROKER_CREDENTIALS, "namespace": namespace },
        "stringData": data,
    });
    Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .patch(
            BROKER_CREDENTIALS,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap_or_else(|error| panic!("the broker's credentials in {namespace}: {error}"));
    json!({ "secretName": BROKER_CREDENTIALS })
}

/// Applies a Composition as a user would (server-side apply, field manager `e2e`).
pub async fn apply(suite: &Suite, object: &serde_json::Value) -> Composition {
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

pub fn compositions(suite: &Suite, namespace: &str) -> Api<Composition> {
    Api::namespaced(suite.admin.clone(), namespace)
}

pub fn condition(composition: &Composition, type_: &str) -> Option<Condition> {
    composition
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

pub fn describe(composition: &Composition) -> String {
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
pub async fn wait_condition(
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

/// Waits until a halt stopped the Composition (`Halted=True`, reason `Halted`); returns it.
pub async fn wait_halted(suite: &Suite, namespace: &str, name: &str) -> Composition {
    wait_condition(
        suite,
        namespace,
        name,
        "Halted",
        "True",
        Some("Halted"),
        PATIENCE,
    )
    .await
}

/// Waits until the composition has exactly `count` pods, every one Ready and none being deleted;
/// returns them by name.
pub async fn wait_pods(suite: &Suite, namespace: &str, name: &str, count: usize) -> Vec<PodView> {
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
pub async fn ready_pods(suite: &Suite, namespace: &str, name: &str, count: usize) -> Vec<PodView> {
    ready_pods_within(suite, (namespace, name), count, PATIENCE).await
}

/// [`ready_pods`], waiting up to `bound` for `Ready=True`.
pub async fn ready_pods_within(
    suite: &Suite,
    (namespace, name): (&str, &str),
    count: usize,
    bound: Duration,
) -> Vec<PodView> {
    wait_condition(suite, namespace, name, "Ready", "True", None, bound).await;
    wait_pods(suite, namespace, name, count).await
}

/// Waits until no pod of the composition is left: the kubelet reported every container stopped
/// and the pod was removed.
pub async fn wait_no_pods(suite: &Suite, namespace: &str, name: &str) {
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
pub fn lifecycle(suite: &Suite, pod: &PodView) -> Vec<String> {
    suite.harness.lifecycle(&pod.name, COMPONENT)
}

/// The composition's control tokens, as its Secret holds them: `token`, then `previous` during a
/// rotation of the operator's key.
pub async fn control_tokens(suite: &Suite, namespace: &str, name: &str) -> Vec<String> {
    let secret = Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .get(&format!("{name}-control"))
        .await
        .expect("the control Secret");
    let data = secret.data.unwrap();
    ["token", "previous"]
        .iter()
        .filter_map(|key| data.get(*key))
        .map(|bytes| String::from_utf8(bytes.0.clone()).unwrap())
        .collect()
}

/// The agent's own report, from its control endpoint on the pod's IP, asked with each of
/// `tokens` until one is taken (during a rotation an agent may not have read the new one yet).
pub async fn agent_status(pod: &PodView, tokens: &[String]) -> serde_json::Value {
    let mut refused = None;
    for token in tokens {
        let response = reqwest::Client::new()
            .get(format!("http://{}:7091/control/status", pod.ip))
            .bearer_auth(token)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .unwrap_or_else(|error| panic!("status of {}: {error}", pod.name));
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            refused = Some(response.text().await.unwrap_or_default());
            continue;
        }
        return response
            .error_for_status()
            .unwrap_or_else(|error| panic!("status of {}: {error}", pod.name))
            .json()
            .await
            .unwrap();
    }
    panic!("status of {}: every token refused: {refused:?}", pod.name)
}

pub async fn deployment(suite: &Suite, namespace: &str, name: &str) -> Option<Deployment> {
    Api::<Deployment>::namespaced(suite.admin.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

/// How many `event`s the pod's recorder told.
pub fn count(suite: &Suite, pod: &PodView, event: &str) -> usize {
    suite
        .harness
        .events(&pod.name)
        .iter()
        .filter(|e| e.event == event)
        .count()
}

/// The preStop drain ran `dispose` in the real container before the kubelet stopped it.
pub fn assert_disposed_before_stopped(suite: &Suite, pod: &PodView) {
    let names = suite.harness.names(&pod.name);
    let dispose = names.iter().position(|n| n == "dispose");
    let stopped = names.iter().position(|n| n == "sigterm");
    assert!(
        matches!((dispose, stopped), (Some(d), Some(s)) if d < s),
        "{}: dispose, then SIGTERM: {names:?}",
        pod.name
    );
}

/// The kubelet ran every hook of the namespace's stopped pods: the components' drain and the
/// agent's own, which a drained agent answers at once (one that had exited failed it, a
/// `FailedPreStopHook` warning event on every stopped pod).
pub async fn assert_no_failed_hooks(suite: &Suite, namespace: &str) {
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(suite.admin.clone(), namespace)
            .list(&Default::default())
            .await
            .unwrap();
    let failed: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedPreStopHook"))
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    assert!(failed.is_empty(), "hooks failed in {namespace}: {failed:?}");
}

pub fn uids(pods: &[PodView]) -> BTreeSet<String> {
    pods.iter().map(|p| p.uid.clone()).collect()
}

/// The Lease's holder and spec, read as admin.
pub async fn lease_spec(leases: &Api<Lease>, name: &str) -> Result<LeaseSpec, String> {
    leases
        .get(name)
        .await
        .map_err(|e| format!("Lease {name}: {e}"))?
        .spec
        .ok_or_else(|| format!("Lease {name} has no spec"))
}

pub fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or_default()
}

/// The Warning events the operator published on the Composition `name`, once one of `reason`
/// is there: their notes, by reason.
pub async fn warnings(
    suite: &Suite,
    namespace: &str,
    name: &str,
    reason: &str,
) -> Vec<(String, String)> {
    let api = Api::<k8s_openapi::api::core::v1::Event>::namespaced(suite.admin.clone(), namespace);
    eventually(&format!("a Warning {reason} on {name}"), PATIENCE, || {
        let api = api.clone();
        async move {
            let events = api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let warnings: Vec<(String, String)> = events
                .items
                .into_iter()
                .filter(|e| e.type_.as_deref() == Some("Warning"))
                .filter(|e| e.involved_object.kind.as_deref() == Some("Composition"))
                .filter(|e| e.involved_object.name.as_deref() == Some(name))
                .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect();
            if warnings.iter().any(|(r, _)| r == reason) {
                Ok(warnings)
            } else {
                Err(format!("{warnings:?}"))
            }
        }
    })
    .await
}

/// `kubectl scale --replicas=N` through the Composition's scale subresource: the generation it
/// made.
pub async fn scale_to(suite: &Suite, namespace: &str, name: &str, replicas: i32) -> i64 {
    let api = compositions(suite, namespace);
    let patch = json!({ "spec": { "replicas": replicas } });
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let scaled = api.get(name).await.unwrap();
    assert_eq!(
        scaled.spec.replicas, replicas,
        "spec.replicas through the subresource"
    );
    scaled.metadata.generation.unwrap()
}
