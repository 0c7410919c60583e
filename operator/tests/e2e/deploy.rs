//! A Composition applied: deployed, its pods up and `Ready=True`; or refused at reconcile time
//! (what the CRD's schema cannot judge), nothing deployed and what already ran left as it was.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster;
use crate::support::{
    agent_status, apply, components_of, composition, condition, control_tokens, deployment,
    describe, lifecycle, manifest, uids, wait_condition, wait_pods, warnings, Suite, COMPONENT,
    PATIENCE,
};
use crate::wait::eventually;

/// A valid Composition → its Deployment → pods → `Ready=True`.
pub async fn ready(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-ready", "shop");
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let start = Instant::now();
    // Shaped: a label, an annotation, placement the node meets, a toleration.
    let pod = json!({
        "labels": { "team": "e2e" },
        "annotations": { "example.com/owner": "suite" },
        "nodeSelector": { "kubernetes.io/os": "linux" },
        "tolerations": [{ "key": "example.com/dedicated", "operator": "Exists" }],
    });
    // The component's own variables: a value, a ConfigMap's key and a Secret's key.
    let configs = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace);
    let settings: ConfigMap = serde_json::from_value(
        json!({ "metadata": { "name": "settings" }, "data": { "format": "plain" } }),
    )
    .unwrap();
    configs
        .create(&Default::default(), &settings)
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(suite.admin.clone(), namespace);
    let payments = serde_json::from_value(
        json!({ "metadata": { "name": "payments" }, "stringData": { "api-key": "k-123" } }),
    )
    .unwrap();
    secrets
        .create(&Default::default(), &payments)
        .await
        .unwrap();
    let env = json!([
        { "name": "E2E_REGION", "value": "eu" },
        { "name": "E2E_FORMAT", "valueFrom": { "configMapKeyRef": { "name": "settings", "key": "format" } } },
        { "name": "E2E_KEY", "valueFrom": { "secretKeyRef": { "name": "payments", "key": "api-key" } } },
    ]);
    let components = json!([{ "name": COMPONENT, "manifest": manifest(), "env": env }]);
    apply(
        &suite,
        &composition(
            namespace,
            name,
            json!({ "replicas": 2, "pod": pod, "components": components }),
        ),
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
    // The chart's operator applies a NetworkPolicy beside the Deployment (enforced by the
    // cluster's network plugin; the test node's bridge enforces none, so only the object is
    // checked): the control port only from the operator's pods.
    let policies: kube::Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        kube::Api::namespaced(suite.admin.clone(), namespace);
    let policy = policies
        .get(name)
        .await
        .expect("the Composition's NetworkPolicy");
    let policy = serde_json::to_value(&policy).unwrap();
    assert_eq!(
        policy["metadata"]["ownerReferences"][0]["name"], name,
        "{policy}"
    );
    let ingress = &policy["spec"]["ingress"];
    assert_eq!(ingress[0]["ports"][0]["port"], 7091, "{policy}");
    assert!(
        ingress[0]["from"][0]["podSelector"]["matchLabels"].is_object(),
        "{policy}"
    );
    assert_eq!(ingress[1]["ports"][0]["port"], 7092, "{policy}");
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
    // A node drain evicts one of the two at a time: the PodDisruptionBudget selects both (the
    // disruption controller counts them).
    let budgets: kube::Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        kube::Api::namespaced(suite.admin.clone(), namespace);
    let budget = eventually("the budget counts both pods", PATIENCE, || {
        let budgets = budgets.clone();
        async move {
            let budget = budgets.get(name).await.map_err(|e| e.to_string())?;
            let expected = budget.status.as_ref().map(|s| s.expected_pods);
            (expected == Some(2))
                .then_some(budget.clone())
                .ok_or(format!("{:?}", budget.status))
        }
    })
    .await;
    let max = budget.spec.unwrap().max_unavailable;
    assert_eq!(
        max,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let tokens = control_tokens(&suite, namespace, name).await;
    let http = reqwest::Client::new();
    for pod in &pods {
        // Every container started once and stayed up: the agent read its token (its control
        // endpoint answers with it), nothing crash-looped.
        // The component's container is named after it, and `kubectl logs POD` shows it.
        assert_eq!(
            pod.restarts(),
            [("agent".to_owned(), 0), ("e2e-recorder".to_owned(), 0)].into(),
            "{}",
            pod.name
        );
        let annotations = pod.pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get("kubectl.kubernetes.io/default-container")
                .map(String::as_str),
            Some("e2e-recorder")
        );
        // The spec's pod settings, as the API server stored the pod the kubelet runs.
        assert_eq!(
            annotations.get("example.com/owner").map(String::as_str),
            Some("suite")
        );
        let labels = pod.pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("e2e"));
        let spec = pod.pod.spec.clone().unwrap();
        assert_eq!(spec.node_selector.unwrap()["kubernetes.io/os"], "linux");
        let tolerated = spec.tolerations.unwrap_or_default();
        assert!(
            tolerated
                .iter()
                .any(|t| t.key.as_deref() == Some("example.com/dedicated")),
            "{tolerated:?}"
        );
        // The component's variables, as its program read them.
        let told: Vec<serde_json::Value> = suite
            .harness
            .events(&pod.name)
            .iter()
            .filter(|e| e.event == "environment")
            .map(|e| e.details["variables"].clone())
            .collect();
        assert_eq!(
            told,
            [json!({ "E2E_REGION": "eu", "E2E_FORMAT": "plain", "E2E_KEY": "k-123" })],
            "{}",
            pod.name
        );
        let status = agent_status(pod, &tokens).await;
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
        // Pod Security admission enforces `restricted` in this namespace: the pod exists, so
        // it was admitted. The agent is a native sidecar, an init container that keeps running.
        let spec = pod.pod.spec.clone().unwrap();
        let init = spec.init_containers.unwrap_or_default();
        assert_eq!(
            init.iter()
                .map(|c| (c.name.as_str(), c.restart_policy.as_deref()))
                .collect::<Vec<_>>(),
            [("agent", Some("Always"))],
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

/// A Redis address with credentials in it (which the API server's schema cannot see; the CEL
/// rule refuses only an even count, see [`crate::admission`]): `Ready=False`, `InvalidSpec`, a
/// message naming the field without the password, nothing deployed; and a running composition
/// changed so keeps its Deployment and pods as they were, as it does when the API server would
/// refuse its pods (the manifests' ConfigMap unchanged too).
pub async fn invalid_spec(suite: Arc<Suite>) {
    const PASSWORD: &str = "hunter2-e2e";
    let namespace = "e2e-invalid";
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let with_credentials =
        json!({ "atomicity": { "redis": [format!("redis://shop:{PASSWORD}@10.0.0.1:6379")] } });
    let refusal = |composition: &toa_operator::Composition| {
        let message = condition(composition, "Ready").unwrap().message;
        assert!(
            message.contains("atomicity.redis") && message.contains("carries credentials"),
            "{message}"
        );
        assert!(
            !message.contains(PASSWORD),
            "the password in the status: {message}"
        );
    };

    // New: the API server takes it, the operator refuses it.
    apply(
        &suite,
        &composition(namespace, "leaky", json!({ "context": with_credentials })),
    )
    .await;
    let refused = wait_condition(
        &suite,
        namespace,
        "leaky",
        "Ready",
        "False",
        Some("InvalidSpec"),
        PATIENCE,
    )
    .await;
    refusal(&refused);
    // A Warning event says it too, without the password, once however often it is reconciled.
    let said = warnings(&suite, namespace, "leaky", "InvalidSpec").await;
    let (_, note) = said.iter().find(|(r, _)| r == "InvalidSpec").unwrap();
    assert!(
        note.contains("carries credentials") && !note.contains(PASSWORD),
        "{note}"
    );
    let degraded = condition(&refused, "Degraded").unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "InvalidSpec")
    );
    assert!(
        deployment(&suite, namespace, "leaky").await.is_none(),
        "nothing deployed"
    );
    assert!(Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace)
        .get_opt("leaky-components")
        .await
        .unwrap()
        .is_none());
    assert!(Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .get_opt("leaky-control")
        .await
        .unwrap()
        .is_none());

    // Running, then refused: what runs stays.
    let kept_refused = || {
        let ready = Some("InvalidSpec");
        wait_condition(&suite, namespace, "kept", "Ready", "False", ready, PATIENCE)
    };
    apply(&suite, &composition(namespace, "kept", json!({}))).await;
    wait_condition(&suite, namespace, "kept", "Ready", "True", None, PATIENCE).await;
    let before = deployment(&suite, namespace, "kept").await.unwrap();
    let pods = wait_pods(&suite, namespace, "kept", 1).await;
    apply(
        &suite,
        &composition(
            namespace,
            "kept",
            json!({ "context": with_credentials, "image": "e2e.local/recorder:2" }),
        ),
    )
    .await;
    let refused = kept_refused().await;
    refusal(&refused);
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

    // Pods the API server refuses (an unknown toleration operator), with a second component:
    // the dry run finds it before anything the running pods read is written, so the manifests'
    // ConfigMap keeps its one component and the Deployment its template.
    let config_maps = Api::<ConfigMap>::namespaced(suite.admin.clone(), namespace);
    let manifests = config_maps.get("kept-components").await.unwrap();
    let second = components_of("c125")[0].clone();
    let spec = json!({
        "pod": { "tolerations": [{ "key": "example.com/x", "operator": "Sometimes" }] },
        "components": [{ "name": COMPONENT, "manifest": manifest() }, second],
    });
    apply(&suite, &composition(namespace, "kept", spec)).await;
    let refused = kept_refused().await;
    let message = condition(&refused, "Ready").unwrap().message;
    assert!(
        message.starts_with("the API server refuses the pods:") && message.contains("operator"),
        "{message}"
    );
    let kept = config_maps.get("kept-components").await.unwrap();
    assert_eq!(
        (kept.metadata.resource_version, kept.data),
        (manifests.metadata.resource_version, manifests.data),
        "the manifests the running pods read are unchanged"
    );
    let after = deployment(&suite, namespace, "kept").await.unwrap();
    assert_eq!(after.spec, before.spec, "the Deployment is untouched");
}
