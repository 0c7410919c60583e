//! Who may drain a pod: the kubelet, from the node. Another pod that read the victim's drain key
//! (it is in the Deployment and the pod spec, which `view` reads) asks the victim's probe port to
//! drain and is refused; the victim keeps running; the kubelet's own hooks still drain it when
//! it is scaled down (`dispose` before the stop, no failed hook).

use serde_json::json;
use std::sync::Arc;

use crate::cluster;
use crate::support::{
    apply, asked_status, assert_disposed_before_stopped, assert_no_failed_hooks, components_of,
    composition, deployment, lifecycle, ready_pods, wait_no_pods, Suite,
};

pub async fn another_pods_drain_is_refused_and_the_kubelets_drains(suite: Arc<Suite>) {
    let namespace = "e2e-drain";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let victim = composition(namespace, "victim", json!({}));
    let attacker = composition(
        namespace,
        "attacker",
        json!({ "components": components_of("caller") }),
    );
    apply(&suite, &victim).await;
    apply(&suite, &attacker).await;
    let victims = ready_pods(&suite, namespace, "victim", 1).await;
    let attackers = ready_pods(&suite, namespace, "attacker", 1).await;

    // What anyone with `view` reads: the key in the Deployment's annotation.
    let key = deployment(&suite, namespace, "victim")
        .await
        .and_then(|d| d.metadata.annotations?.get("toa.io/drain-key").cloned())
        .expect("the victim's drain key");
    let url = format!("http://{}:7092/drain/{key}", victims[0].ip);
    let fetch = json!({ "do": "fetch", "url": url });
    let status = asked_status(&suite, &attackers[0].name, fetch, "fetched").await;
    assert_eq!(status, json!(403), "another pod's drain, with the key");
    assert_eq!(
        lifecycle(&suite, &victims[0]),
        ["preflight", "ready"],
        "the victim was not drained"
    );

    // The kubelet's hooks, from the node, still drain.
    apply(
        &suite,
        &composition(namespace, "victim", json!({ "replicas": 0 })),
    )
    .await;
    wait_no_pods(&suite, namespace, "victim").await;
    assert_eq!(
        lifecycle(&suite, &victims[0]),
        ["preflight", "ready", "dispose"],
        "drained by the kubelet's preStop hook"
    );
    assert_disposed_before_stopped(&suite, &victims[0]);
    assert_no_failed_hooks(&suite, namespace).await;
}
