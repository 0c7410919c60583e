//! End to end: the operator against a real API server (kube-apiserver and kube-controller-manager
//! with etcd, from `scripts/control-plane`) and a real node (the same release's kubelet and
//! kube-scheduler, containerd, runc and a CNI bridge, from `scripts/node`), running images built
//! from this workspace's binaries (`scripts/images`): nothing is simulated. Pod Security admission
//! enforces the restricted level in every namespace but the one where the image scenario runs the
//! chart's Deployment with host networking; the CRD's CEL rule runs at admission.
//!
//! Two tests, each with a control plane and a node of its own, one after the other (nextest's
//! `processes` group: they share the node's bridge): `end_to_end` runs every scenario on the
//! newest supported release, v1.37.2; `floor` runs the CRD, the admission refusals, a deploy and a
//! halt on the oldest, v1.33.13. nextest runs every test in a process of its own, and a control
//! plane takes seconds to start and two cores to run, so one process owns it, from start to stop.
//! The scenarios run concurrently, each in a namespace of its own, on the same operator; then,
//! alone, two operator replicas (the leader killed) and the operator's own image; the operator
//! restart and the deletion run last. A failed scenario does not stop the others: all run, then
//! the test fails naming each failure.
//!
//! Setup: the chart's earlier shape (its CRD in `crds/`, an older schema) is installed with `helm
//! install` (scripts/helm), the CRD handed to the release as the docs say, and the release
//! upgraded to this chart with `helm upgrade` (the CRD with its new schema, ServiceAccount, RBAC,
//! Service, and the Deployment without replicas), each failing on any warning; the operator runs as a process with the chart Deployment's arguments under the
//! chart's ServiceAccount (a token from the TokenRequest API), so a permission the chart lacks
//! fails the suite (and any `forbidden` in its log fails it too); the API server listens on
//! loopback, which pods cannot reach, so only the image scenario runs the chart's own Deployment
//! (host network, a kubeconfig Secret). Pods run the agent image and `localhost/toa/python:e2e`,
//! whose component `e2e.recorder` tells the suite's harness ([`harness`], on the node's bridge)
//! what happens in its container and does what the harness asks of it.
//!
//! Layout: this file holds the entry points and the scenario lists only. The scenarios live by
//! intent: [`deploy`] (a Composition deployed, or refused by the operator), [`entities`] (an
//! entity's objects shared by two pods through a PostgreSQL), [`admission`] (what
//! the API server refuses: the CEL rule, Pod Security, a pod refused by admission), [`halt`],
//! [`rollout`], [`atomicity`], [`pods`] (pods in trouble), [`leader`] (two replicas), [`image`]
//! (the operator's own image), [`drain`] (who may drain a pod), [`deletion`], [`ownership`]
//! (names the operator derives) and
//! [`poison`] (a Composition it cannot decode, stored through the whole run); [`support`] holds
//! the suite's shared parts and the helpers they share. The machinery: [`cluster`] (the control plane), [`chart`] (Helm's install, upgrade and test), [`node`],
//! [`operator`] (the operator as a process), [`harness`], [`services`] (a Redis and a RabbitMQ of
//! the suite's own) and [`wait`].

mod admission;
mod atomicity;
mod chart;
mod cluster;
mod deletion;
mod deploy;
mod drain;
mod entities;
mod events;
mod halt;
mod harness;
mod image;
mod keys;
mod leader;
mod node;
mod odd;
mod operator;
mod ownership;
mod pods;
mod poison;
mod rollout;
mod services;
mod support;
mod tenancy;
mod typescript;
mod wait;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::ControlPlane;
use harness::Harness;
use node::Node;
use operator::Operator;
use support::Suite;

/// One scenario, run in a task of its own: a panic is its failure.
type Scenario = fn(Arc<Suite>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Every scenario on the newest supported release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn end_to_end() {
    run_on(cluster::NEWEST, batches()).await;
}

/// The scenarios that run on the floor of the supported range as well: the CRD and what the API
/// server refuses or stores (the poison), a deploy and a halt.
const ON_THE_FLOOR: [&str; 8] = [
    "the_crd_installs_without_a_warning",
    "odd_compositions_are_refused_or_reconciled",
    "two_addresses_are_refused_at_admission",
    "pod_security_admits_what_the_operator_and_chart_make",
    "pods_refused_at_admission_are_degraded",
    "a_composition_that_cannot_be_decoded_is_refused_on_itself",
    "ready",
    "halt_quiet_then_unhalt",
];

/// The floor of the supported range: [`ON_THE_FLOOR`], concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn floor() {
    let scenarios: Vec<(&str, Scenario)> = batches()
        .into_iter()
        .flatten()
        .filter(|(name, _)| ON_THE_FLOOR.contains(name))
        .collect();
    assert_eq!(
        scenarios.len(),
        ON_THE_FLOOR.len(),
        "every floor scenario is listed"
    );
    run_on(cluster::FLOOR, vec![scenarios]).await;
}

/// Starts a control plane and a node of `release`, runs the batches one after the other (the
/// scenarios of a batch concurrently), and fails naming every scenario that failed.
async fn run_on(release: &'static str, batches: Vec<Vec<(&'static str, Scenario)>>) {
    let started = Instant::now();
    let root = std::env::temp_dir().join(format!("toa-e2e-{release}-{}", std::process::id()));
    forget_earlier_runs();
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let (plane, suite) = start(&root, release, started).await;

    let mut failures = Vec::new();
    // TOA_E2E_ONLY=ready,halt_quiet_then_unhalt runs only those (while working on them).
    let only = std::env::var("TOA_E2E_ONLY").ok();
    let chosen = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    for batch in batches {
        let batch: Vec<(&str, Scenario)> = batch.into_iter().filter(|(n, _)| chosen(n)).collect();
        let runs = batch
            .into_iter()
            .map(|(name, scenario)| run(suite.clone(), name, scenario));
        failures.extend(futures::future::join_all(runs).await.into_iter().flatten());
    }
    failures.extend(after_all(&suite).await);
    eprintln!(
        "e2e: all scenarios on {release} done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        let tail = suite.operator.lock().await.tail(80);
        panic!(
            "{} scenario(s) failed on {release}:\n{}\n\nthe operator's log, last lines:\n{tail}\n(the pods' logs \
             under {}, the kubelet's in {}; TOA_E2E_KEEP=1 keeps them)",
            failures.len(),
            failures.join("\n"),
            suite.node.dir().join("log/pods").display(),
            suite.node.dir().join("kubelet.log").display(),
        );
    }
    // The node goes before the control plane it reports to.
    drop(suite);
    drop(plane);
    if std::env::var_os("TOA_E2E_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// Stops what an earlier run left, and removes its state once it is an hour old. A run killed
/// at nextest's timeout leaves its node's bridge, which the next node cannot take; a failed run
/// keeps its state, logs and all, for a look (some 700 MiB each, which filled the disk until the
/// node's kubelet evicted every pod for DiskPressure), and the last hour's (this CI run's) stays
/// for that look. A run whose process still lives (another clone's) is left alone; with
/// `TOA_E2E_KEEP` nothing is removed.
fn forget_earlier_runs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let keep = std::env::var_os("TOA_E2E_KEEP").is_some();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("toa-e2e-v")
            .and_then(|r| r.rsplit('-').next())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = std::process::Command::new(cluster::repo().join("scripts/node"))
            .arg("stop")
            .arg(entry.path().join("n"))
            .output();
        let modified = entry.metadata().and_then(|m| m.modified());
        let old =
            modified.is_ok_and(|m| m.elapsed().unwrap_or_default() > Duration::from_secs(3600));
        if old && !keep {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The control plane and the node of `release` with the images, the harness, the chart and the
/// suite's operator, their state in `root`.
async fn start(
    root: &std::path::Path,
    release: &'static str,
    started: Instant,
) -> (ControlPlane, Arc<Suite>) {
    let agent = cluster::workspace_binary("toa-agent", "toa-agent");
    let terminals = cluster::workspace_binary("toa-example-terminals", "toa-example-terminals");

    let plane = ControlPlane::start(&root.join("control-plane"), release);
    let admin = cluster::client(&plane.kubeconfig).await;
    let node = Node::start(&root.join("n"), &plane.kubeconfig, release);
    let harness = Harness::start(node::BRIDGE_IP.parse().unwrap()).await;
    node.import_images(
        &agent,
        std::path::Path::new(env!("CARGO_BIN_EXE_toa-operator")),
        &terminals,
        &harness.url,
    );
    let chart = chart::install_chart(&admin, &plane.kubeconfig, "toa-system", root).await;
    let mut operator = Operator::under_chart(&admin, plane.port, &chart, root).await;
    operator.start().await;
    eprintln!(
        "e2e: {release} control plane, node, images, chart and operator up in {:.1} s (state in {})",
        started.elapsed().as_secs_f64(),
        root.display()
    );
    let suite = Arc::new(Suite {
        release,
        admin,
        admin_kubeconfig: plane.kubeconfig.clone(),
        node,
        harness,
        chart,
        operator_kubeconfig: root.join("operator.kubeconfig"),
        root: root.to_path_buf(),
        api_port: plane.port,
        operator: tokio::sync::Mutex::new(operator),
    });
    (plane, suite)
}

/// The scenarios, in batches run one after the other; the scenarios of a batch run concurrently.
fn batches() -> Vec<Vec<(&'static str, Scenario)>> {
    // First, what the API server admits or refuses: quick, and one pod at most, before the batch
    // that starts some twenty.
    let admission: Vec<(&str, Scenario)> = vec![
        ("the_crd_installs_without_a_warning", |s| {
            Box::pin(admission::the_crd_installs_without_a_warning(s))
        }),
        ("two_addresses_are_refused_at_admission", |s| {
            Box::pin(admission::two_addresses_are_refused_at_admission(s))
        }),
        (
            "pod_security_admits_what_the_operator_and_chart_make",
            |s| Box::pin(admission::pod_security_admits_what_the_operator_and_chart_make(s)),
        ),
        ("pods_refused_at_admission_are_degraded", |s| {
            Box::pin(admission::pods_refused_at_admission_are_degraded(s))
        }),
        ("odd_compositions_are_refused_or_reconciled", |s| {
            Box::pin(odd::odd_compositions_are_refused_or_reconciled(s))
        }),
        // First, so that every later scenario runs with it stored.
        (
            "a_composition_that_cannot_be_decoded_is_refused_on_itself",
            |s| Box::pin(poison::a_composition_that_cannot_be_decoded_is_refused_on_itself(s)),
        ),
    ];
    let concurrent: Vec<(&str, Scenario)> = vec![
        ("ready", |s| Box::pin(deploy::ready(s))),
        ("invalid_spec", |s| Box::pin(deploy::invalid_spec(s))),
        ("halt_quiet_then_unhalt", |s| {
            Box::pin(halt::halt_quiet_then_unhalt(s))
        }),
        ("halt_busy_called_off", |s| {
            Box::pin(halt::halt_busy_called_off(s))
        }),
        ("halt_of_a_composition_called_by_another", |s| {
            Box::pin(halt::halt_of_a_composition_called_by_another(s))
        }),
        ("spec_change_rolls_out", |s| {
            Box::pin(rollout::spec_change_rolls_out(s))
        }),
        ("unanswering_pod_during_halt", |s| {
            Box::pin(halt::unanswering_pod_during_halt(s))
        }),
        ("atomicity_splits_slots", |s| {
            Box::pin(atomicity::atomicity_splits_slots(s))
        }),
        ("failing_pods_are_degraded", |s| {
            Box::pin(pods::failing_pods_are_degraded(s))
        }),
        ("slow_preflight_is_not_killed", |s| {
            Box::pin(pods::slow_preflight_is_not_killed(s))
        }),
        ("a_crashed_program_is_served_again", |s| {
            Box::pin(pods::a_crashed_program_is_served_again(s))
        }),
        ("a_typescript_composition_answers_as_the_seed_says", |s| {
            Box::pin(typescript::a_typescript_composition_answers_as_the_seed_says(s))
        }),
        (
            "an_event_crosses_two_compositions_once_per_stored_change",
            |s| Box::pin(events::an_event_crosses_two_compositions_once_per_stored_change(s)),
        ),
        (
            "two_pods_sharing_a_store_sell_a_stock_of_100_exactly_once_each",
            |s| {
                Box::pin(
                    entities::two_pods_sharing_a_store_sell_a_stock_of_100_exactly_once_each(s),
                )
            },
        ),
        (
            "another_pods_drain_is_refused_and_the_kubelets_drains",
            |s| Box::pin(drain::another_pods_drain_is_refused_and_the_kubelets_drains(s)),
        ),
    ];
    // Second, alone: a second replica, and the leader killed, which leaves no reconciling
    // operator for seconds; it ends with the suite's operator the leader again.
    let replicas: Vec<(&str, Scenario)> = vec![("two_replicas_one_leader", |s| {
        Box::pin(leader::two_replicas_one_leader(s))
    })];
    // Alone too: the operator's own image replaces the suite's operator for a while.
    let image: Vec<(&str, Scenario)> = vec![("the_operator_image_runs", |s| {
        Box::pin(image::the_operator_image_runs(s))
    })];
    // Alone: a rotation of the operator's key touches every Composition's Secret; a namespaced
    // install stops the suite's operator (which watches every namespace) while it runs.
    let keys: Vec<(&str, Scenario)> = vec![("rotation_during_a_halt", |s| {
        Box::pin(keys::rotation_during_a_halt(s))
    })];
    let namespaced: Vec<(&str, Scenario)> =
        vec![("a_namespaced_install_runs_only_its_namespaces", |s| {
            Box::pin(keys::a_namespaced_install_runs_only_its_namespaces(s))
        })];
    // Last: the operator restart, which must not stop another scenario's operator, and the
    // deletion, which relies on the garbage collector only: it learns of the CRD at its first
    // resync, 30 s after the controller manager started, so the later, the shorter the wait.
    let alone: Vec<(&str, Scenario)> = vec![
        ("operator_restart_during_halt", |s| {
            Box::pin(halt::operator_restart_during_halt(s))
        }),
        ("deletion_cleans_up", |s| {
            Box::pin(deletion::deletion_cleans_up(s))
        }),
        ("foreign_objects_are_not_taken_over", |s| {
            Box::pin(ownership::foreign_objects_are_not_taken_over(s))
        }),
        ("a_declared_component_is_not_taken_over", |s| {
            Box::pin(ownership::a_declared_component_is_not_taken_over(s))
        }),
    ];
    vec![
        admission, concurrent, replicas, image, keys, namespaced, alone,
    ]
}

/// Runs `scenario` in a task of its own; what it failed with, if it failed.
async fn run(suite: Arc<Suite>, name: &str, scenario: Scenario) -> Option<String> {
    let start = Instant::now();
    let result = tokio::spawn(scenario(suite)).await;
    let took = start.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            eprintln!("e2e: {name} passed in {took:.1} s");
            None
        }
        Err(error) => {
            let message = match error.try_into_panic() {
                Ok(payload) => payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
                Err(error) => error.to_string(),
            };
            eprintln!("e2e: {name} FAILED in {took:.1} s: {message}");
            Some(format!("{name}: {message}"))
        }
    }
}

/// After every scenario: the operator still runs, does not reconcile in a loop once everything
/// settled, and was never refused a request its RBAC should grant; then it stops. What failed.
async fn after_all(suite: &Suite) -> Vec<String> {
    let mut failures = Vec::new();
    let mut operator = suite.operator.lock().await;
    operator.check_running();
    // No hot loop: once everything has settled, a composition is looked at again only on its
    // resync (5 min) or while something is pending (every 5 s). One pass over every composition
    // is no loop: the operator restarted by the last scenarios reconciles them all once when it
    // becomes the leader, which may fall in this window. More than two per composition is.
    if let Err(error) = poison::still_refused(suite).await {
        failures.push(format!("the poison at the end: {error}"));
    }
    let compositions = kube::Api::<toa_operator::crd::Stored>::all(suite.admin.clone())
        .list(&Default::default())
        .await
        .map_or(0, |list| list.items.len() as u64);
    let bound = (2 * compositions).max(20);
    let before = operator.reconciles().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = operator.reconciles().await - before;
    eprintln!("e2e: reconciles in 6 s of idling: {idle} ({compositions} compositions)");
    if idle > bound {
        failures.push(format!(
            "{idle} reconciles of {compositions} compositions in 6 s with nothing changing: a hot loop"
        ));
    }
    if let Some(pid) = operator.pid() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss = status.lines().find(|line| line.starts_with("VmRSS:"));
        eprintln!("e2e: the operator's memory at the end: {rss:?}");
    }
    let log = operator.log();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("forbidden") || line.contains("Forbidden"))
        .take(5)
        .collect();
    if !forbidden.is_empty() {
        failures.push(format!(
            "the operator was refused requests its RBAC should grant:\n{}",
            forbidden.join("\n")
        ));
    }
    operator.stop().await;
    failures
}
