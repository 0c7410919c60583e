//! What the API server itself refuses or admits, with the release's own kubectl where a user
//! would use it: the CRD created without a warning, the CEL rule's refusal of two Redis
//! addresses, Pod Security admission's `restricted` level over what the operator and the chart
//! make, and a Composition whose pods admission refuses, told in `Degraded`.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::PostParams;
use kube::Api;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

use crate::cluster;
use crate::support::{apply, composition, condition, wait_condition, Suite, PATIENCE};

/// The refusal's words, the same at admission, at reconcile time and in the agent.
const TWO_ADDRESSES: &str = "Atomicity takes an odd number of addresses, 2 given.";

/// `crds/composition.yaml`, created anew under another group (so that this is a create, which
/// is when the server prices CEL and says what it warns about), with `kubectl apply
/// --server-side`: accepted, nothing on standard error. The chart's copy was already applied
/// when the suite installed the chart; it must be the same file.
pub async fn the_crd_installs_without_a_warning(suite: Arc<Suite>) {
    let crd = std::fs::read_to_string(cluster::repo().join("crds/composition.yaml")).unwrap();
    let chart =
        std::fs::read_to_string(cluster::repo().join("charts/toa-operator/files/composition.yaml"))
            .unwrap();
    assert_eq!(crd, chart, "the chart's CRD is crds/composition.yaml");
    let copy = crd
        .replace(
            "name: compositions.toa.io",
            "name: compositions.copy.e2e.toa.io",
        )
        .replace("group: toa.io", "group: copy.e2e.toa.io");
    assert_ne!(copy, crd, "the CRD's name and group were found to replace");
    let applied = suite.kubectl(
        &["apply", "--server-side", "--field-manager=e2e", "-f", "-"],
        Some(&copy),
    );
    assert!(
        applied.success && applied.stderr.trim().is_empty(),
        "kubectl apply --server-side of the CRD on {}: {applied:?}",
        suite.release
    );
    assert!(
        applied
            .stdout
            .contains("compositions.copy.e2e.toa.io serverside-applied"),
        "{applied:?}"
    );
    // An apply of the chart's own CRD over the installed one: no change, no warning either.
    let again = suite.kubectl(
        &[
            "apply",
            "--server-side",
            "--field-manager=e2e-helm",
            "-f",
            "-",
        ],
        Some(&crd),
    );
    assert!(again.success && again.stderr.trim().is_empty(), "{again:?}");
    let deleted = suite.kubectl(
        &[
            "delete",
            "crd",
            "compositions.copy.e2e.toa.io",
            "--wait=false",
        ],
        None,
    );
    assert!(deleted.success, "{deleted:?}");
}

/// Two Redis addresses: `kubectl apply` is refused by the CRD's CEL rule with the exact message,
/// and nothing is stored; one and three are taken (a server-side dry run).
pub async fn two_addresses_are_refused_at_admission(suite: Arc<Suite>) {
    let namespace = "e2e-cel";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let with = |name: &str, addresses: &[&str]| {
        let object = composition(
            namespace,
            name,
            json!({ "context": { "atomicity": { "redis": addresses } } }),
        );
        serde_json::to_string(&object).unwrap()
    };
    let two = suite.kubectl(
        &["apply", "-f", "-"],
        Some(&with("even", &["redis://10.0.0.1", "redis://10.0.0.2"])),
    );
    assert!(!two.success, "two addresses were taken: {two:?}");
    assert!(two.stderr.contains(TWO_ADDRESSES), "{two:?}");
    let stored = suite.kubectl(&["get", "composition", "even", "-n", namespace], None);
    assert!(
        !stored.success && stored.stderr.contains("NotFound"),
        "{stored:?}"
    );
    for addresses in [
        &["redis://10.0.0.1"][..],
        &["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"],
    ] {
        let taken = suite.kubectl(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&with("odd", addresses)),
        );
        assert!(taken.success, "{} addresses: {taken:?}", addresses.len());
    }
}

/// Pod Security admission enforces `restricted` in the suite's namespaces: a bare pod that
/// breaks the profile is refused, naming it; the chart's Deployment's pod, unmodified, is
/// admitted (created with `dryRun=All`). The operator's pods are admitted in every scenario.
pub async fn pod_security_admits_what_the_operator_and_chart_make(suite: Arc<Suite>) {
    let namespace = "e2e-psa";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let pods = Api::<Pod>::namespaced(suite.admin.clone(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let bare: Pod = serde_json::from_value(json!({
        "metadata": { "name": "bare", "namespace": namespace },
        "spec": { "containers": [{ "name": "c", "image": "localhost/toa/busybox:1" }] }
    }))
    .unwrap();
    match pods.create(&dry_run, &bare).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains("violates PodSecurity \"restricted:latest\"")
                    && status.message.contains("runAsNonRoot"),
                "{status:?}"
            );
        }
        other => panic!("a bare pod was not refused by Pod Security admission: {other:?}"),
    }

    // The chart's pod refers to its ServiceAccount, which must exist where it is created.
    let template = suite.chart.deployment.spec.clone().unwrap().template;
    let account: ServiceAccount = serde_json::from_value(json!({
        "metadata": { "name": suite.chart.service_account, "namespace": namespace }
    }))
    .unwrap();
    let accounts = Api::<ServiceAccount>::namespaced(suite.admin.clone(), namespace);
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let mut chart_pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        status: None,
    };
    chart_pod.metadata.name = Some("operator".to_owned());
    chart_pod.metadata.namespace = Some(namespace.to_owned());
    let admitted = pods.create(&dry_run, &chart_pod).await;
    assert!(
        admitted.is_ok(),
        "the chart's pod in a restricted namespace: {admitted:?}"
    );
}

/// A namespace whose admission refuses every pod (a ValidatingAdmissionPolicy, as a cluster's
/// policy engine would): the Composition's Deployment exists, its ReplicaSet cannot create a pod,
/// and `Degraded=True`, `PodsRefused` says why, within seconds, not at a timeout; once the policy
/// goes, the pods come and `Degraded` clears.
pub async fn pods_refused_at_admission_are_degraded(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-refused", "refused");
    const DENIAL: &str = "e2e: this namespace admits no pod";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": "e2e-no-pods" },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]
            }]},
            "validations": [{ "expression": "false", "message": DENIAL }]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": "e2e-no-pods" },
        "spec": {
            "policyName": "e2e-no-pods",
            "validationActions": ["Deny"],
            "matchResources": { "namespaceSelector": { "matchLabels": {
                "kubernetes.io/metadata.name": namespace
            }}}
        }
    });
    for object in [&policy, &binding] {
        let applied = suite.kubectl(
            &["apply", "--server-side", "-f", "-"],
            Some(&object.to_string()),
        );
        assert!(applied.success, "{applied:?}");
    }
    // The policy takes effect once the API server has compiled it: a bare pod is refused.
    crate::wait::eventually("the policy refuses pods", PATIENCE, || {
        let pods = Api::<Pod>::namespaced(suite.admin.clone(), namespace);
        async move {
            let probe: Pod = serde_json::from_value(json!({
                "metadata": { "name": "probe" },
                "spec": { "containers": [{ "name": "c", "image": "localhost/toa/busybox:1",
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 65532,
                        "allowPrivilegeEscalation": false,
                        "capabilities": { "drop": ["ALL"] },
                        "seccompProfile": { "type": "RuntimeDefault" } } }] }
            }))
            .unwrap();
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            match pods.create(&dry_run, &probe).await {
                Err(kube::Error::Api(status)) if status.message.contains(DENIAL) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    let start = Instant::now();
    apply(&suite, &composition(namespace, name, json!({}))).await;
    let degraded = wait_condition(
        &suite,
        namespace,
        name,
        "Degraded",
        "True",
        Some("PodsRefused"),
        PATIENCE,
    )
    .await;
    eprintln!(
        "e2e: pods_refused_at_admission_are_degraded: Degraded=True {:.1} s after apply",
        start.elapsed().as_secs_f64()
    );
    let message = condition(&degraded, "Degraded").unwrap().message;
    assert!(
        message.starts_with("the Deployment cannot create pods: FailedCreate: ")
            && message.contains(DENIAL),
        "{message}"
    );
    let ready = condition(&degraded, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "RollingOut")
    );

    // The policy goes: the ReplicaSet creates the pod and the Composition comes up.
    for kind in [
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
    ] {
        let deleted = suite.kubectl(&["delete", kind, "e2e-no-pods"], None);
        assert!(deleted.success, "{deleted:?}");
    }
    wait_condition(
        &suite,
        namespace,
        name,
        "Degraded",
        "False",
        Some("AsExpected"),
        crate::support::STOP_PATIENCE,
    )
    .await;
}
