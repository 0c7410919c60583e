//! `toa-agent demo`: composes the seed's examples (in Python, on the Python SDK)
//! with the embedded default, runs their flows through the local API, and drains.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use toa_agent::compose::{self, Options};
use toa_agent::instance::Instance;
use toa_agent::Mode;
use toa_context::{Context, Credentials, Environment};

pub async fn run() -> ExitCode {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let context = Context::parse("name: demo\n", &Environment::local()).expect("a valid context");
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
    let options = Options {
        context,
        credentials: Credentials::default(),
        components: ["store.catalog", "store.orders", "notifications"]
            .iter()
            .map(|c| examples.join(c))
            .collect(),
        listen: "127.0.0.1:0".parse().expect("an address"),
        instance: Instance::generate(),
        on_ready: Some(ready_tx),
        control: None,
        attach: None,
        probe: None,
        declarations: None,
        drain_digest: None,
        component_tokens: None,
        configuration: Default::default(),
        kubernetes_namespace: None,
        roots: Default::default(),
        storage: None,
        // The demo's flows count on owning every slot: it runs alone.
        group: None,
        mode: Mode::Local,
        broker: None,
    };
    println!("composing examples/store.catalog, examples/store.orders, examples/notifications (embedded default: no Redis, no broker)");
    let composition = tokio::spawn(compose::run(options, async {
        let _ = stop.await;
    }));
    let flows = async {
        let address = ready.await.map_err(|_| DemoError::NotStarted)?;
        flows(&format!("http://{address}")).await
    };
    let outcome = flows.await;
    let _ = stop_tx.send(());
    let stopped = composition.await;
    match (outcome, stopped) {
        (Ok(()), Ok(Ok(()))) => {
            println!("\ndrained: dispose ran, the programs stopped");
            ExitCode::SUCCESS
        }
        (Err(error), _) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
        (_, Ok(Err(error))) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
        (_, Err(error)) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn call(
    http: &reqwest::Client,
    agent: &str,
    target: &str,
    request: Value,
) -> Result<Value, DemoError> {
    let (component, operation) = target.rsplit_once('.').expect("component.operation");
    let response = http
        .post(format!("{agent}/v1/call/{component}/{operation}"))
        .json(&request)
        .send()
        .await?;
    Ok(response.json::<Value>().await?)
}

/// Why the demo's flows stopped.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error("the composition did not start")]
    NotStarted,
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

async fn flows(agent: &str) -> Result<(), DemoError> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    println!("\nmeter: store.catalog.appraise, ten a minute per customer (each costs 6000 ms of a 60000 ms window)");
    for n in 1..=11 {
        let answer = call(
            &http,
            agent,
            "store.catalog.appraise",
            json!({"input": {"customer": "c1", "product": "a1"}}),
        )
        .await?;
        println!("  call {n:>2}: {answer}");
    }
    println!("\nrequest contract: an input the schema refuses is refused before anything is sent");
    let answer = call(
        &http,
        agent,
        "store.catalog.appraise",
        json!({"input": {"customer": 1}}),
    )
    .await?;
    println!("  {answer}");
    println!("\nlock: three store.orders.settle calls at once; the settlement runs one at a time");
    let settles = (0..3).map(|_| call(&http, agent, "store.orders.settle", json!({})));
    for answer in futures::future::join_all(settles).await {
        println!("  {}", answer?);
    }
    println!("\npulse and slots: notifications.drain runs every 500 ms on every replica over its slots of 16");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let answer = call(&http, agent, "notifications.drained", json!({})).await?;
    println!("  partitions drained so far: {answer}");
    Ok(())
}
