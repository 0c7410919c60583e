//! A TypeScript Composition on a real pod: the seeds' store.catalog as ported in
//! examples/typescript (`program: [toa-node]`, the SDK from the project's node_modules) and the
//! suite's TypeScript caller, in `localhost/toa/node:e2e`, whose configuration names a secret.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

use crate::support::{
    apply, composition, ready_pods_within, wait_no_pods, Suite, PATIENCE, STOP_PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, node, services};

const IMAGE: &str = "localhost/toa/node:e2e";

/// A manifest of the repository as the Composition carries it.
fn manifest(path: &str) -> Value {
    let text = std::fs::read_to_string(cluster::repo().join(path)).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// The pod becomes Ready (its agent asked the TypeScript program what it serves, checked it
/// against the manifest and ran the rc/ modules' commands), and the caller's eleven appraisals
/// through `context.remote` get ten prices and `TOO_MANY_REQUESTS`, the meter counted in Redis.
/// The caller's configuration holds `"$E2E_TOKEN"`: the kubelet gives it the credentials Secret's
/// key and the SDK puts the value in place.
pub async fn a_typescript_composition_answers_as_the_seed_says(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-typescript", "seeds");
    let redis = services::Redis::start(node::BRIDGE_IP);
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let token = format!("e2e-{:x}", rand::random::<u64>());
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "seeds-backends" },
        "stringData": { "E2E_TOKEN": token },
    }))
    .unwrap();
    Api::<Secret>::namespaced(suite.admin.clone(), namespace)
        .patch(
            "seeds-backends",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
    let spec = |replicas: u32| {
        json!({
            "application": "e2e-ts",
            "image": IMAGE,
            "replicas": replicas,
            // The meter needs atomicity in a pod. The default interval: a command may take up to
            // half of it, and 150 ms (a 300 ms interval's) was too little for the suite's Redis
            // while a dozen scenarios start pods on two cores (an appraisal failed UNAVAILABLE).
            "context": { "atomicity": { "redis": [redis.url()] } },
            "components": [
                {
                    "name": "store.catalog",
                    "manifest": manifest("examples/typescript/components/store.catalog/manifest.toa.yaml"),
                },
                {
                    "name": "e2e.seeds",
                    "manifest": manifest("operator/tests/fixtures/node-image/components/e2e.seeds/manifest.toa.yaml"),
                    "configuration": { "token": "$E2E_TOKEN" },
                },
            ],
            "credentials": { "secretName": "seeds-backends" },
        })
    };
    let start = Instant::now();
    apply(&suite, &composition(namespace, name, spec(1))).await;
    // Longer than the other scenarios' bound: both programs are Node, each transpiling its
    // TypeScript at start. A fresh machine's CI, a dozen scenarios starting pods on two cores,
    // saw the pod Ready about 90 s after the apply, just past the common bound.
    let pods = ready_pods_within(&suite, (namespace, name), 1, STOP_PATIENCE).await;
    let appraised = eventually("the caller's appraisals", PATIENCE, || async {
        suite
            .harness
            .events(&pods[0].name)
            .into_iter()
            .find(|e| e.event == "appraised")
            .map(|e| e.details.clone())
            .ok_or_else(|| format!("{:?}", suite.harness.names(&pods[0].name)))
    })
    .await;
    assert_eq!(appraised["token"], json!(token), "the secret in its place");
    let answers = appraised["answers"].clone();
    eprintln!(
        "e2e: typescript: appraised {:.1} s after apply",
        start.elapsed().as_secs_f64()
    );
    let price = json!({ "reply": { "product": "a1", "price": 42 } });
    let mut expected = vec![price; 10];
    expected.push(json!({ "error": "TOO_MANY_REQUESTS" }));
    assert_eq!(answers, Value::Array(expected));
    // Stop the pod before its Redis goes.
    apply(&suite, &composition(namespace, name, spec(0))).await;
    wait_no_pods(&suite, namespace, name).await;
}
