//! The operator's benchmark on the real control plane and a real node (not a test): how long from
//! `apply` until the Deployments exist and until `Ready=True` for 100 Compositions without pods;
//! with real pods, from `apply` until every pod is Ready and from a halt until `Halted=True`, for 1
//! and 20 Compositions of 2 replicas; the operator's memory, and the agents' as the kubelet runs
//! them.
//!
//! ```sh
//! cargo bench -p toa-operator --bench operator
//! ```
//!
//! It sets up what the end-to-end suite does (`operator/tests/e2e`: control plane, a real node
//! with the images built from this workspace, the chart, the operator under the chart's
//! ServiceAccount) and prints `BENCH <name> <ours> <baseline> <ratio>` (`-` where there is no
//! baseline); times in ms, memory in MB. The baseline is a client that applies the same objects
//! itself (the ConfigMaps, the Secret and the Deployment `toa_operator::desired` builds, without
//! owner references) and waits for the Deployments to be available; its "halt" scales them to
//! zero and waits until no pod is left: the cost of the operator is the ratio. The baseline runs
//! first each time, and is scaled to zero before ours starts.

#[allow(dead_code)]
#[path = "../tests/e2e/chart.rs"]
mod chart;
#[allow(dead_code)]
#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[allow(dead_code)]
#[path = "../tests/e2e/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../tests/e2e/operator.rs"]
mod operator;
#[allow(dead_code)]
#[path = "../tests/e2e/wait.rs"]
mod wait;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};
use toa_operator::desired::{self, Settings};
use toa_operator::Composition;

/// Applies in flight at once, for ours and for the baseline.
const IN_FLIGHT: usize = 16;
const PATIENCE: Duration = Duration::from_secs(600);

fn composition(namespace: &str, name: &str, replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "toa.io/v1alpha1",
        "kind": "Composition",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "application": "bench",
            "image": "localhost/toa/python:e2e",
            "replicas": replicas,
            "halt": { "quietWindow": 1, "grace": 30 },
            "components": [{
                // One component is one Composition's in a namespace: each its own (the
                // image holds the recorder as e2e.c000 … e2e.c127).
                "name": format!("e2e.{name}"),
                "manifest": {
                    "name": name,
                    "namespace": "e2e",
                    "program": ["python3", "recorder.py"],
                    "lifecycle": ["preflight", "ready", "pause", "resume", "dispose"],
                    "operations": { "echo": { "input": { "type": "object" } } }
                }
            }]
        }
    })
}

fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("c{i:03}")).collect()
}

/// Polls `check` every 50 ms until it is true; the time it took from `start`.
async fn until<F, Fut>(what: &str, start: Instant, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: not within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn deployments_exist(client: &Client, namespace: &str, count: usize) -> bool {
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default())
        .await
        .is_ok_and(|list| list.items.len() == count)
}

/// Every Deployment of the namespace has rolled out its generation and its replica is available.
async fn deployments_available(client: &Client, namespace: &str, count: usize) -> bool {
    all_listed::<Deployment>(client, namespace, count, |deployment| {
        let want = deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        deployment.status.as_ref().is_some_and(|status| {
            status.observed_generation == deployment.metadata.generation
                && status.updated_replicas.unwrap_or(0) == want
                && status.available_replicas.unwrap_or(0) == want
        })
    })
    .await
}

/// The namespace holds `count` objects of the kind and each is `done`.
async fn all_listed<K>(
    client: &Client,
    namespace: &str,
    count: usize,
    done: impl Fn(&K) -> bool,
) -> bool
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Ok(list) = Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    else {
        return false;
    };
    list.items.len() == count && list.items.iter().all(done)
}

async fn compositions_ready(client: &Client, namespace: &str, count: usize) -> bool {
    all_listed::<Composition>(client, namespace, count, |composition| {
        composition.condition("Ready").is_some_and(|c| {
            c.status == "True" && c.observed_generation == composition.metadata.generation
        })
    })
    .await
}

/// Ours: the Compositions applied; (until every Deployment exists, until every one is Ready).
async fn ours(
    client: &Client,
    namespace: &str,
    count: usize,
    replicas: i32,
) -> (Duration, Duration) {
    cluster::restricted_namespace(client, namespace).await;
    let api = Api::<Composition>::namespaced(client.clone(), namespace);
    let start = Instant::now();
    let applies = futures::stream::iter(names(count)).map(|name| {
        let api = api.clone();
        let object = composition(namespace, &name, replicas);
        async move {
            api.patch(
                &name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&object),
            )
            .await
        }
    });
    let watch_deployments = until("ours: every Deployment exists", start, || {
        deployments_exist(client, namespace, count)
    });
    let (applied, created) = tokio::join!(
        applies.buffer_unordered(IN_FLIGHT).try_collect::<Vec<_>>(),
        watch_deployments
    );
    applied.expect("the Compositions are applied");
    let ready = until("ours: every Composition is Ready", start, || {
        compositions_ready(client, namespace, count)
    })
    .await;
    (created, ready)
}

/// The baseline: a client applies what the operator would, itself; (until every Deployment
/// exists, until every one is available).
async fn baseline(
    client: &Client,
    namespace: &str,
    count: usize,
    replicas: i32,
    settings: &Settings,
) -> (Duration, Duration) {
    cluster::restricted_namespace(client, namespace).await;
    let objects: Vec<desired::Desired> = names(count)
        .iter()
        .map(|name| {
            let mut object: Composition =
                serde_json::from_value(composition(namespace, name, replicas)).unwrap();
            // A uid for the owner references desired() writes; they are taken out below, since
            // no Composition exists for the baseline.
            object.meta_mut().uid = Some(format!("00000000-0000-0000-0000-{:012}", 0));
            let valid = toa_operator::validate::validate(&object.spec).unwrap();
            let keys = toa_operator::agent_client::Keys::one(&"t".repeat(64));
            let drain = "d".repeat(64);
            let mut objects =
                desired::desired(&object, &valid, settings, &keys, &drain, replicas).unwrap();
            objects.components.metadata.owner_references = None;
            objects.declarations.metadata.owner_references = None;
            objects.control.metadata.owner_references = None;
            objects.deployment.metadata.owner_references = None;
            objects
        })
        .collect();
    let start = Instant::now();
    let applies = futures::stream::iter(objects).map(|objects| {
        let client = client.clone();
        async move {
            let params = PatchParams::apply("bench-baseline").force();
            let name = objects.deployment.name_any();
            let maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            maps.patch(
                &objects.components.name_any(),
                &params,
                &Patch::Apply(&objects.components),
            )
            .await?;
            maps.patch(
                &objects.declarations.name_any(),
                &PatchParams::apply(&toa_operator::declarations::manager(&name)).force(),
                &Patch::Apply(&objects.declarations),
            )
            .await?;
            Api::<Secret>::namespaced(client.clone(), namespace)
                .patch(
                    &objects.control.name_any(),
                    &params,
                    &Patch::Apply(&objects.control),
                )
                .await?;
            Api::<Deployment>::namespaced(client.clone(), namespace)
                .patch(&name, &params, &Patch::Apply(&objects.deployment))
                .await
        }
    });
    let watch_deployments = until("baseline: every Deployment exists", start, || {
        deployments_exist(client, namespace, count)
    });
    let (applied, created) = tokio::join!(
        applies.buffer_unordered(IN_FLIGHT).try_collect::<Vec<_>>(),
        watch_deployments
    );
    applied.expect("the baseline's objects are applied");
    let available = until("baseline: every Deployment is available", start, || {
        deployments_available(client, namespace, count)
    })
    .await;
    (created, available)
}

async fn pods_left(client: &Client, namespace: &str) -> usize {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), namespace)
        .list_metadata(&ListParams::default())
        .await
        .map_or(usize::MAX, |list| list.items.len())
}

async fn compositions_halted(client: &Client, namespace: &str, count: usize) -> bool {
    all_listed::<Composition>(client, namespace, count, |composition| {
        composition
            .condition("Halted")
            .is_some_and(|c| c.status == "True")
    })
    .await
}

/// A merge patch to each named object, `IN_FLIGHT` at once.
async fn merge_each<K>(api: &Api<K>, names: Vec<String>, patch: serde_json::Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(names)
        .map(|name| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await
        .expect("every patch is taken");
}

/// Ours: every Composition asked to halt; until every one is `Halted=True` and no pod is left.
async fn halt_ours(client: &Client, namespace: &str, count: usize) -> Duration {
    let api = Api::<Composition>::namespaced(client.clone(), namespace);
    let start = Instant::now();
    merge_each(&api, names(count), json!({ "spec": { "halted": true } })).await;
    until("ours: every Composition is Halted", start, || async {
        compositions_halted(client, namespace, count).await
            && pods_left(client, namespace).await == 0
    })
    .await
}

/// The baseline's halt: every Deployment scaled to zero; until no pod is left.
async fn halt_baseline(client: &Client, namespace: &str) -> Duration {
    let api = Api::<Deployment>::namespaced(client.clone(), namespace);
    let start = Instant::now();
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    let names = list.items.iter().map(ResourceExt::name_any).collect();
    merge_each(&api, names, json!({ "spec": { "replicas": 0 } })).await;
    until("baseline: no pod left", start, || async {
        pods_left(client, namespace).await == 0
    })
    .await
}

/// The resident memory of every agent the kubelet runs (`toa-agent compose`), in MB.
fn agents_rss() -> Vec<f64> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let agent = args.first().is_some_and(|a| a.ends_with(b"toa-agent"))
            && args.get(1) == Some(&&b"compose"[..]);
        if agent {
            found.push(memory(pid).0);
        }
    }
    found.sort_by(f64::total_cmp);
    found
}

/// Real pods: `count` Compositions of 2 replicas against the baseline, apply → every pod Ready,
/// then halt → no pod left; and the agents' memory while ours idle.
async fn with_pods(client: &Client, count: usize, settings: &Settings) {
    let baseline_namespace = format!("bench-baseline-pods-{count}");
    let ours_namespace = format!("bench-ours-pods-{count}");
    let (_, base_ready) = baseline(client, &baseline_namespace, count, 2, settings).await;
    let base_halt = halt_baseline(client, &baseline_namespace).await;
    let (_, ready) = ours(client, &ours_namespace, count, 2).await;
    until("ours: every pod Ready", Instant::now(), || async {
        deployments_available(client, &ours_namespace, count).await
    })
    .await;
    // Idle: the lifecycle done, nothing called.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = agents_rss();
    let halted = halt_ours(client, &ours_namespace, count).await;
    bench(
        &format!("apply_to_pods_ready_ms_{count}x2"),
        ms(ready),
        Some(ms(base_ready)),
    );
    bench(
        &format!("halt_to_halted_ms_{count}x2"),
        ms(halted),
        Some(ms(base_halt)),
    );
    if !rss.is_empty() {
        bench(
            &format!("agent_rss_mb_median_{count}x2"),
            rss[rss.len() / 2],
            None,
        );
        bench(
            &format!("agent_rss_mb_max_{count}x2"),
            rss[rss.len() - 1],
            None,
        );
    }
}

/// (VmRSS, VmHWM) of a process, in MB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn bench(name: &str, ours: f64, baseline: Option<f64>) {
    match baseline {
        Some(b) => println!("BENCH {name} {ours:.1} {b:.1} {:.2}", ours / b),
        None => println!("BENCH {name} {ours:.1} - -"),
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    let root = std::env::temp_dir().join(format!("toa-bench-operator-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let agent = cluster::workspace_binary("toa-agent", "toa-agent");
    let terminals = cluster::workspace_binary("toa-example-terminals", "toa-example-terminals");
    // TOA_K8S_VERSION=v1.33.13 measures on the floor of the supported range.
    let release = match std::env::var("TOA_K8S_VERSION").as_deref() {
        Ok(cluster::FLOOR) => cluster::FLOOR,
        Ok(cluster::NEWEST) | Err(_) => cluster::NEWEST,
        Ok(other) => panic!(
            "TOA_K8S_VERSION={other}: the bench runs on {} or {}",
            cluster::NEWEST,
            cluster::FLOOR
        ),
    };
    println!("BENCH release {release}");
    let plane = cluster::ControlPlane::start(&root.join("control-plane"), release);
    let admin = cluster::client(&plane.kubeconfig).await;
    let node = node::Node::start(&root.join("n"), &plane.kubeconfig, release);
    // No harness: the recorder tells nothing.
    node.import_images(
        &agent,
        std::path::Path::new(env!("CARGO_BIN_EXE_toa-operator")),
        &terminals,
        "",
    );
    cluster::privileged_namespace(&admin, "toa-system").await;
    let chart =
        chart::install_release(&admin, &plane.kubeconfig, "toa-system", chart::RELEASE, &[]).await;
    let agent_image = chart
        .args
        .iter()
        .find_map(|arg| arg.strip_prefix("--agent-image="))
        .expect("the chart passes --agent-image")
        .to_owned();
    let mut operator = operator::Operator::under_chart(&admin, plane.port, &chart, &root).await;
    operator.start().await;
    let settings = Settings {
        agent_image,
        agent_resources: serde_json::from_str(toa_operator::args::DEFAULT_AGENT_RESOURCES)
            .expect("the default resources parse"),
        control_from: None,
        egress: Vec::new(),
        node_networks: Vec::new(),
    };
    let pid = operator.pid().unwrap();
    let (idle, _) = memory(pid);

    // Without pods first, on an idle machine: the operator and the API server alone.
    let (base_created_0, base_ready_0) =
        baseline(&admin, "bench-baseline-100-empty", 100, 0, &settings).await;
    let (created_0, ready_0) = ours(&admin, "bench-ours-100-empty", 100, 0).await;
    bench(
        "apply_to_deployment_ms_100_no_pods",
        ms(created_0),
        Some(ms(base_created_0)),
    );
    bench(
        "apply_to_ready_ms_100_no_pods",
        ms(ready_0),
        Some(ms(base_ready_0)),
    );

    // Real pods: 1 and 20 Compositions of 2 replicas.
    let reconciles = operator.reconciles().await;
    let seconds = operator
        .metric("toa_operator_reconcile_duration_seconds_sum")
        .await;
    with_pods(&admin, 1, &settings).await;
    with_pods(&admin, 20, &settings).await;
    let reconciles = operator.reconciles().await - reconciles;
    let seconds = operator
        .metric("toa_operator_reconcile_duration_seconds_sum")
        .await
        - seconds;
    let errors = operator.metric("toa_operator_reconcile_errors_total").await;

    bench("reconciles_pods", reconciles as f64, None);
    bench(
        "reconcile_mean_ms_pods",
        seconds * 1000.0 / reconciles.max(1) as f64,
        None,
    );
    bench("reconcile_errors_total", errors, None);
    let (rss, peak) = memory(pid);
    bench("operator_rss_mb_idle", idle, None);
    bench("operator_rss_mb_end", rss, None);
    bench("operator_peak_rss_mb", peak, None);

    operator.check_running();
    operator.stop().await;
    drop(node);
    drop(plane);
    let _ = std::fs::remove_dir_all(&root);
}
