//! The operator's own image, run by the chart's Deployment in place of the suite's operator.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{apply, composition, holder, lease_spec, wait_condition, Suite, PATIENCE};
use crate::wait::eventually;
use crate::{chart, cluster};

/// The chart's own Deployment, running the operator's image (built as its Dockerfile says): it
/// starts as uid 65532, takes the Lease and reconciles a Composition. Pods cannot reach the API
/// server on loopback, so this one pod runs on the host's network with a kubeconfig Secret (the
/// chart's ServiceAccount token), test-only; the suite's operator is stopped meanwhile. `helm
/// test` (the chart's test pod, of the same image) fails while no operator answers there and
/// passes once this one does.
pub async fn the_operator_image_runs(suite: Arc<Suite>) {
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
            let pods = operator_pods(&suite).await?;
            if pods.is_empty() {
                Ok(())
            } else {
                Err(format!("pods left: {pods:?}"))
            }
        },
    )
    .await;
    operator.start().await;
    if let Err(error) = run {
        std::panic::resume_unwind(error.into_panic());
    }
}

/// The names of the chart Deployment's pods (not the chart's `helm test` pod).
async fn operator_pods(suite: &Suite) -> Result<Vec<String>, String> {
    let selector = suite
        .chart
        .deployment
        .spec
        .as_ref()
        .unwrap()
        .selector
        .clone();
    let labels = selector.match_labels.unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
        suite.admin.clone(),
        &suite.chart.namespace,
    )
    .list(&kube::api::ListParams::default().labels(&selector.join(",")))
    .await
    .map_err(|e| e.to_string())?;
    Ok(pods.items.iter().map(|p| p.name_any()).collect())
}

async fn operator_image(suite: Arc<Suite>, (lease_namespace, lease_name): (String, String)) {
    let (namespace, name) = ("e2e-image", "imaged");
    let chart_namespace = suite.chart.namespace.clone();
    let (passed, said) = chart::helm_test(&suite.admin_kubeconfig, &chart_namespace);
    assert!(
        !passed && said.contains("did not answer 200 within"),
        "helm test with no operator answering: {said}"
    );
    cluster::restricted_namespace(&suite.admin, namespace).await;
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
            let running = operator_pods(&suite).await?;
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
    let (passed, said) = chart::helm_test(&suite.admin_kubeconfig, &chart_namespace);
    assert!(
        passed && said.contains("answered 200"),
        "helm test with the operator running: {said}"
    );
}
