//! Events in pods (DESIGN 18): e2e.orders in one Composition publishes e2e.orders.changed on
//! every stored change; e2e.ledger in another Composition of the same application receives it
//! over a RabbitMQ of the suite's own, each on a PostgreSQL of the suite's own. 20 transitions of
//! one order: the ledger holds one object per stored version, checked from its store. Both
//! export their spans to an OTLP receiver of the suite's own (`spec.traces`): a call from the
//! orders' pod to the ledger is one trace across the two pods.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::entities::postgres;
use crate::support::{
    apply, composition, credentials, manifest_of, ready_pods, wait_no_pods, Suite, PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, node, services};

/// A fixture's manifest, as the Composition carries it.
fn fixture(name: &str) -> Value {
    let path = format!("operator/tests/fixtures/image/components/{name}/manifest.toa.yaml");
    let text = std::fs::read_to_string(cluster::repo().join(path)).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// A call from the orders' pod to the ledger, through the broker, is one trace: `call` in the
/// caller's pod, `receive` and `operate` in the ledger's, each the child of the one before, each
/// pod's spans under its Composition's name.
async fn one_trace_across_two_pods(
    suite: &Suite,
    traces: &services::Traces,
    caller: &str,
    callee: &str,
) {
    let request = json!({ "input": { "limit": 1 } });
    let answers = calls(suite, caller, "e2e.ledger.enumerate", 1, request).await;
    assert!(answers[0].get("reply").is_some(), "{answers:?}");
    let spans = eventually("the call's three spans exported", PATIENCE, || async {
        let all = traces.spans();
        let call = all
            .iter()
            .find(|s| s["name"] == "call e2e.ledger.enumerate" && s["instance"] == caller)
            .ok_or_else(|| format!("no call span yet: {all:?}"))?;
        let trace: Vec<&Value> = all.iter().filter(|s| s["trace"] == call["trace"]).collect();
        let named = |name: &str| trace.iter().find(|s| s["name"] == name).copied();
        match (
            named("receive e2e.ledger"),
            named("operate e2e.ledger.enumerate"),
        ) {
            (Some(receive), Some(operate)) => Ok([call.clone(), receive.clone(), operate.clone()]),
            _ => Err(format!("{trace:?}")),
        }
    })
    .await;
    let [call, receive, operate] = &spans;
    assert_eq!(receive["parent"], call["span"], "{spans:?}");
    assert_eq!(operate["parent"], receive["span"], "{spans:?}");
    let placed: Vec<(&Value, &Value)> = spans
        .iter()
        .map(|s| (&s["instance"], &s["service"]))
        .collect();
    assert_eq!(
        placed,
        [
            (&json!(caller), &json!("orders")),
            (&json!(callee), &json!("ledger")),
            (&json!(callee), &json!("ledger")),
        ],
        "each pod's spans, under its Composition's name"
    );
}

/// Asks `pod`'s recorder for `count` calls of `target` at once with `request`; the answers.
async fn calls(suite: &Suite, pod: &str, target: &str, count: u32, request: Value) -> Vec<Value> {
    let label = format!("events-{}", rand::random::<u32>());
    suite.harness.ask(
        pod,
        json!({
            "do": "calls", "target": target, "count": count, "request": request, "label": label,
        }),
    );
    eventually(&format!("{pod}'s {target} answered"), PATIENCE, || async {
        let told = suite
            .harness
            .events(pod)
            .into_iter()
            .find(|e| e.event == "answered" && e.details.get("label") == Some(&json!(label)));
        told.and_then(|e| e.details["answers"].as_array().cloned())
            .ok_or_else(|| "not yet".to_owned())
    })
    .await
}

/// The ledger's objects, asked through `pod`: (order, version) → how many.
async fn ledger(suite: &Suite, pod: &str) -> BTreeMap<(String, u64), usize> {
    let request = json!({ "input": { "limit": 1000 } });
    let answers = calls(suite, pod, "e2e.ledger.enumerate", 1, request).await;
    let mut kept = BTreeMap::new();
    for item in answers[0]["reply"]["items"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let order = item["order"].as_str().unwrap_or_default().to_owned();
        *kept
            .entry((order, item["version"].as_u64().unwrap_or(0)))
            .or_default() += 1;
    }
    kept
}

pub async fn an_event_crosses_two_compositions_once_per_stored_change(suite: Arc<Suite>) {
    let namespace = "e2e-events";
    let store = tokio::task::spawn_blocking(|| postgres::PostgresServer::start_on(node::BRIDGE_IP))
        .await
        .unwrap();
    let address = store.login("shop", "e2e-events-password");
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-events-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    let spans = std::env::temp_dir().join(format!("toa-e2e-spans-{}", std::process::id()));
    let traces = services::Traces::start(node::BRIDGE_IP, spans);
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let login = json!({
        "amqp-username": "guest", "amqp-password": "guest",
        "storage-username": "shop", "storage-password": "e2e-events-password",
    });
    let credentials = credentials(&suite, namespace, login).await;
    let spec = |component: &str, recorder: &str, replicas: u32| {
        json!({
            "application": "e2e-events",
            "replicas": replicas,
            "context": { "amqp": rabbit.url(), "storage": address },
            "credentials": credentials,
            "traces": { "endpoint": traces.endpoint() },
            "components": [
                { "name": component, "manifest": fixture(component) },
                { "name": format!("e2e.{recorder}"), "manifest": manifest_of(recorder) },
            ],
        })
    };
    let start = Instant::now();
    apply(
        &suite,
        &composition(namespace, "ledger", spec("e2e.ledger", "c126", 1)),
    )
    .await;
    apply(
        &suite,
        &composition(namespace, "orders", spec("e2e.orders", "c127", 1)),
    )
    .await;
    let receiving = ready_pods(&suite, namespace, "ledger", 1).await.remove(0);
    let publishing = ready_pods(&suite, namespace, "orders", 1).await.remove(0);
    // Until a first event arrives: the ledger's queue is bound (a receiver sees the events
    // published after its queue exists).
    eventually("a first event reaches the ledger", PATIENCE, || async {
        let request = json!({ "query": { "id": "probe" }, "input": { "total": 1 } });
        calls(&suite, &publishing.name, "e2e.orders.transit", 1, request).await;
        let kept = ledger(&suite, &receiving.name).await;
        if kept.keys().any(|(order, _)| order == "probe") {
            Ok(())
        } else {
            Err(format!("{kept:?}"))
        }
    })
    .await;
    let request = json!({ "query": { "id": "kettle" }, "input": { "total": 2 } });
    let answers = calls(&suite, &publishing.name, "e2e.orders.transit", 20, request).await;
    let stored = answers.iter().filter(|a| a.get("reply").is_some()).count();
    assert_eq!(stored, 20, "{answers:?}");
    let expected: BTreeMap<(String, u64), usize> = (1..=20)
        .map(|version| (("kettle".to_owned(), version), 1))
        .collect();
    let kept = eventually("the ledger holds every version once", PATIENCE, || async {
        let kept: BTreeMap<(String, u64), usize> = ledger(&suite, &receiving.name)
            .await
            .into_iter()
            .filter(|((order, _), _)| order == "kettle")
            .collect();
        if kept.len() >= 20 {
            Ok(kept)
        } else {
            Err(format!("{kept:?}"))
        }
    })
    .await;
    assert_eq!(kept, expected, "one object per stored change of the kettle");
    eprintln!(
        "e2e: events: 20 changes received across Compositions {:.1} s after apply",
        start.elapsed().as_secs_f64()
    );
    one_trace_across_two_pods(&suite, &traces, &publishing.name, &receiving.name).await;
    // The pods go before their store and broker.
    for (name, component, recorder) in [
        ("orders", "e2e.orders", "c127"),
        ("ledger", "e2e.ledger", "c126"),
    ] {
        apply(
            &suite,
            &composition(namespace, name, spec(component, recorder, 0)),
        )
        .await;
    }
    for name in ["orders", "ledger"] {
        wait_no_pods(&suite, namespace, name).await;
    }
    drop(store);
}
