//! A spec change rolls out: new pods replace the old ones, each old one drained first.

use serde_json::json;
use std::sync::Arc;

use crate::cluster;
use crate::support::{
    apply, assert_disposed_before_stopped, composition, deployment, lifecycle, ready_pods, uids,
    wait_condition, wait_pods, Suite, PATIENCE,
};
use crate::wait::eventually;

/// A spec change rolls out: new pods replace the old ones, `Ready=True` for the new generation;
/// each old pod's preStop drain runs `dispose` in its real container before the kubelet stops it.
pub async fn spec_change_rolls_out(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-rollout", "roll");
    cluster::restricted_namespace(&suite.admin, namespace).await;
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
        // The component's container; the agent is the init container (a native sidecar).
        let limits = pod.pod.spec.as_ref().unwrap().containers[0]
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
