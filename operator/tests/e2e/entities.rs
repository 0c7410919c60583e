//! Entities in pods (DESIGN 17, seed 003): the fixture `e2e.stock` (seed 003's stock on the
//! Python SDK) in two pods that share a PostgreSQL and a RabbitMQ of the suite's own on the node's
//! bridge, the store's login from the Composition's credentials Secret. 400 reservations of one
//! kettle, 200 from each pod's recorder at once, on a stock of 100: exactly 100 sold.

// The agent's tests' server, shared; they use the parts this suite does not.
#[allow(dead_code)]
#[path = "../../../agent/tests/support/postgres.rs"]
pub mod postgres;

use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

use crate::support::{
    apply, composition, credentials, manifest, ready_pods, wait_no_pods, Suite, COMPONENT, PATIENCE,
};
use crate::wait::eventually;
use crate::{cluster, node, services};

/// The fixture's manifest, as the Composition carries it.
fn stock() -> Value {
    let path = "operator/tests/fixtures/image/components/e2e.stock/manifest.toa.yaml";
    let text = std::fs::read_to_string(cluster::repo().join(path)).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// Asks `pod`'s recorder for `count` calls of `e2e.stock.<operation>` at once on the kettle; the
/// answers, once told.
async fn calls(suite: &Suite, pod: &str, operation: &str, count: u32, input: Value) -> Vec<Value> {
    let label = format!("{operation}-{}", rand::random::<u32>());
    suite.harness.ask(
        pod,
        json!({
            "do": "calls", "target": format!("e2e.stock.{operation}"), "count": count,
            "request": { "query": { "id": "kettle" }, "input": input }, "label": label,
        }),
    );
    eventually(
        &format!("{pod}'s {operation} calls answered"),
        PATIENCE,
        || async {
            let told =
                suite.harness.events(pod).into_iter().find(|e| {
                    e.event == "answered" && e.details.get("label") == Some(&json!(label))
                });
            let answers = told.map(|e| e.details["answers"].clone());
            answers
                .and_then(|a| a.as_array().cloned())
                .ok_or_else(|| "not yet".to_owned())
        },
    )
    .await
}

pub async fn two_pods_sharing_a_store_sell_a_stock_of_100_exactly_once_each(suite: Arc<Suite>) {
    let (namespace, name) = ("e2e-entities", "stock");
    let store = tokio::task::spawn_blocking(|| postgres::PostgresServer::start_on(node::BRIDGE_IP))
        .await
        .unwrap();
    let address = store.login("shop", "e2e-store-password");
    let dir = std::env::temp_dir().join(format!("toa-e2e-rabbit-entities-{}", std::process::id()));
    let rabbit = tokio::task::spawn_blocking(move || services::Rabbit::start(node::BRIDGE_IP, dir))
        .await
        .unwrap();
    cluster::restricted_namespace(&suite.admin, namespace).await;
    let login = json!({
        "amqp-username": "guest", "amqp-password": "guest",
        "storage-username": "shop", "storage-password": "e2e-store-password",
    });
    let credentials = credentials(&suite, namespace, login).await;
    let spec = |replicas: u32| {
        json!({
            "application": "e2e-entities",
            "replicas": replicas,
            "context": { "amqp": rabbit.url(), "storage": address },
            "credentials": credentials,
            "components": [
                { "name": "e2e.stock", "manifest": stock() },
                { "name": COMPONENT, "manifest": manifest() },
            ],
        })
    };
    let start = Instant::now();
    apply(&suite, &composition(namespace, name, spec(2))).await;
    let pods = ready_pods(&suite, namespace, name, 2).await;
    let stocked = calls(
        &suite,
        &pods[0].name,
        "transit",
        1,
        json!({ "available": 100 }),
    )
    .await;
    assert_eq!(stocked[0]["reply"]["available"], json!(100), "{stocked:?}");

    let reserve = json!({ "quantity": 1 });
    let (one, two) = futures::join!(
        calls(&suite, &pods[0].name, "reserve", 200, reserve.clone()),
        calls(&suite, &pods[1].name, "reserve", 200, reserve),
    );
    let answers: Vec<Value> = one.into_iter().chain(two).collect();
    let sold = answers.iter().filter(|a| a.get("reply").is_some()).count();
    let refused = answers
        .iter()
        .filter(|a| a["error"] == json!("OUT_OF_STOCK"))
        .count();
    assert_eq!(
        (sold, refused, answers.len()),
        (100, 300, 400),
        "every call answered, 100 sold: {:?}",
        answers.iter().find(|a| a.get("failed").is_some())
    );
    let left = calls(&suite, &pods[1].name, "observe", 1, Value::Null).await;
    assert_eq!(
        (
            left[0]["reply"]["available"].clone(),
            left[0]["reply"]["VERSION"].clone()
        ),
        (json!(0), json!(101)),
        "one write per sale and the stocking: {left:?}"
    );
    eprintln!(
        "e2e: entities: 400 reservations over two pods answered {:.1} s after apply",
        start.elapsed().as_secs_f64()
    );
    // The pods go before their store and broker.
    apply(&suite, &composition(namespace, name, spec(0))).await;
    wait_no_pods(&suite, namespace, name).await;
    drop(store);
}
