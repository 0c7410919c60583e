//! The operator's key and its reach: a rotation of the key during a halt, and a namespaced
//! install that runs only its namespaces' Compositions under Roles.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster;
use crate::operator::Operator;
use crate::support::{
    agent_status, apply, composition, control_tokens, deployment, halting, running_two,
    wait_condition, wait_halted, Suite, PATIENCE,
};
use crate::wait::{always, eventually};

/// The operator's key Secret of the suite's chart: its namespace and name (`--key-secret`).
fn key_secret(suite: &Suite) -> (Api<Secret>, String) {
    let name = suite
        .chart
        .args
        .iter()
        .find_map(|arg| arg.strip_prefix("--key-secret="))
        .expect("the chart passes --key-secret")
        .to_owned();
    let api = Api::namespaced(suite.admin.clone(), &suite.chart.namespace);
    (api, name)
}

fn entry(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    Some(secret.data.as_ref()?.get(key)?.0.clone())
}

/// A halt under way when the operator's key rotates completes: the operator applies the new
/// tokens (the old one as `previous`) to the Composition's Secret within seconds, signs with the
/// new one and again with the previous one where an agent has not read its Secret yet; the pods
/// are not restarted; the Composition comes back, and once `previous` is removed from the key the
/// Secret holds the new token only.
pub async fn rotation_during_a_halt(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-rotation", "rotated");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let spec = halting(namespace, name, 5, 60);
    let pods = running_two(&suite, namespace, name, &spec).await;
    let before = control_tokens(&suite, namespace, name).await;
    assert_eq!(before.len(), 1, "no rotation under way");
    let template = deployment(&suite, namespace, name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;

    apply(&suite, &spec(true)).await;
    wait_condition(
        &suite,
        namespace,
        name,
        "Halted",
        "False",
        Some("Pausing"),
        PATIENCE,
    )
    .await;
    // The rotation, as docs/composition.md says it: `current` becomes `previous`, a new `current`.
    let (keys, key_name) = key_secret(&suite);
    let old = entry(&keys.get(&key_name).await.unwrap(), "current").expect("a current key");
    let new = "ab".repeat(32).into_bytes();
    let patch = json!({ "data": {
        "current": ByteString(new.clone()), "previous": ByteString(old.clone()) } });
    keys.patch(&key_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    // The operator's reread (10 s) and one reconcile of every Composition.
    let rotated = eventually(
        "the control Secret holds the new and the previous token",
        Duration::from_secs(40),
        || {
            let suite = suite.clone();
            let before = before.clone();
            async move {
                let tokens = control_tokens(&suite, namespace, name).await;
                match tokens.as_slice() {
                    [current, previous] if *previous == before[0] && *current != before[0] => {
                        Ok(tokens)
                    }
                    _ => Err(format!(
                        "{} tokens, the first unchanged: {}",
                        tokens.len(),
                        tokens[0] == before[0]
                    )),
                }
            }
        },
    )
    .await;
    let halted = wait_halted(&suite, namespace, name).await;
    assert_eq!(
        halted
            .status
            .unwrap()
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .reason,
        "Halted"
    );
    let after = deployment(&suite, namespace, name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    assert_eq!(after, template, "the rotation does not change the pods");
    for pod in &pods {
        assert!(
            crate::support::lifecycle(&suite, pod).contains(&"pause".to_owned()),
            "{}: paused",
            pod.name
        );
    }

    // Back, and the old key retired: the Secret holds the new token only.
    apply(&suite, &spec(false)).await;
    wait_condition(&suite, namespace, name, "Ready", "True", None, PATIENCE).await;
    let retire = json!({ "data": { "previous": null } });
    keys.patch(&key_name, &PatchParams::default(), &Patch::Merge(&retire))
        .await
        .unwrap();
    eventually(
        "the control Secret holds the new token only",
        Duration::from_secs(40),
        || {
            let suite = suite.clone();
            let current = rotated[0].clone();
            async move {
                let tokens = control_tokens(&suite, namespace, name).await;
                (tokens == [current])
                    .then_some(())
                    .ok_or(format!("{} tokens", tokens.len()))
            }
        },
    )
    .await;
    // The new pods' agents take the new token (they mounted the Secret after the rotation).
    let pods = crate::support::ready_pods(&suite, namespace, name, 2).await;
    for pod in &pods {
        let status = agent_status(pod, &rotated[..1]).await;
        assert_eq!(status["phase"], "running", "{}: {status}", pod.name);
    }
}

/// A namespaced install (`watchNamespaces`): Roles in the watched namespace and none
/// cluster-wide, the operator under them runs that namespace's Composition and never touches
/// another namespace's; nothing it does is forbidden. The suite's operator, which watches every
/// namespace, is stopped meanwhile.
pub async fn a_namespaced_install_runs_only_its_namespaces(suite: Arc<Suite>) {
    let mut operator = suite.operator.lock().await;
    operator.stop().await;
    let run = tokio::spawn(namespaced(suite.clone())).await;
    operator.start().await;
    if let Err(error) = run {
        std::panic::resume_unwind(error.into_panic());
    }
}

async fn namespaced(suite: Arc<Suite>) {
    let (watched, other) = ("e2e-watched", "e2e-unwatched");
    cluster::restricted_namespace(&suite.admin, watched).await;
    cluster::restricted_namespace(&suite.admin, other).await;
    let set = format!("watchNamespaces=[\"{watched}\"]");
    cluster::restricted_namespace(&suite.admin, "e2e-operator-ns").await;
    let chart = crate::chart::install_release(
        &suite.admin,
        &suite.admin_kubeconfig,
        "e2e-operator-ns",
        "scoped",
        // The CRD is release `toa`'s.
        &[&set, "crd.install=false"],
    )
    .await;
    let root = suite.root.join("namespaced");
    std::fs::create_dir_all(&root).unwrap();
    let mut scoped = Operator::under_chart(&suite.admin, suite.api_port, &chart, &root).await;
    scoped.start().await;

    apply(&suite, &composition(watched, "inside", json!({}))).await;
    apply(&suite, &composition(other, "outside", json!({}))).await;
    wait_condition(&suite, watched, "inside", "Ready", "True", None, PATIENCE).await;
    // The other namespace's Composition: no Deployment, no status, for as long as it runs.
    always(
        "the unwatched Composition is left alone",
        Duration::from_secs(5),
        || {
            let suite = suite.clone();
            async move {
                let untouched = deployment(&suite, other, "outside").await.is_none();
                let status = crate::support::compositions(&suite, other)
                    .get("outside")
                    .await
                    .map_err(|e| e.to_string())?
                    .status;
                if untouched && status.is_none() {
                    Ok(())
                } else {
                    Err("the namespaced operator touched another namespace".to_owned())
                }
            }
        },
    )
    .await;
    scoped.stop().await;
    let log = scoped.log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "a request was forbidden:\n{log}"
    );
    // What the chart granted: Roles in the watched namespace, nothing cluster-wide.
    let roles = Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(suite.admin.clone(), watched)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        roles
            .items
            .iter()
            .any(|r| r.name_any().starts_with("scoped")),
        "a Role there"
    );
    let cluster_roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(suite.admin.clone())
        .list(&Default::default())
        .await
        .unwrap();
    // The only ClusterRoles it makes are the ones for people (aggregatedRoles), aggregated into
    // `edit` and `view`, which no binding of the chart names: none grants the operator anything.
    assert!(
        !cluster_roles.items.iter().any(|r| {
            let name = r.name_any();
            name.starts_with("scoped")
                && !name.ends_with("-composition-edit")
                && !name.ends_with("-composition-view")
        }),
        "no ClusterRole for a namespaced install's operator"
    );
    // The suite's operator, back after this, would run both: they go.
    for (namespace, name) in [(watched, "inside"), (other, "outside")] {
        let _ = crate::support::compositions(&suite, namespace)
            .delete(name, &Default::default())
            .await;
    }
}
