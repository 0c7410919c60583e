//! `toa-operator run`: the controller, the HTTP endpoint and the lease, together until shutdown.

use crate::agent_client::HttpAgentControl;
use crate::controller::{self, Context};
use crate::desired::Settings;
use crate::events::Events;
use crate::http;
use crate::key_ring;
use crate::lease;
use crate::metrics::Metrics;
use futures::future::FusedFuture;
use futures::FutureExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// What `run` needs, checked by [`crate::args::RunArgs::into_config`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub agent_image: String,
    pub agent_resources: k8s_openapi::api::core::v1::ResourceRequirements,
    pub metrics_listen: SocketAddr,
    /// `None`: leader election off, this replica always reconciles (run one replica only).
    pub lease: Option<LeaseSettings>,
    /// `None`: no NetworkPolicy per Composition.
    pub control_from: Option<crate::desired::ControlFrom>,
    /// The egress the NetworkPolicy allows besides DNS; empty: egress is not restricted.
    pub egress: Vec<k8s_openapi::api::networking::v1::NetworkPolicyEgressRule>,
    /// Where the kubelet connects from besides the node's addresses (`--node-networks`).
    pub node_networks: Vec<toa_context::network::Network>,
    /// Where the operator's key is.
    pub key: KeySettings,
    /// The namespaces watched; empty: all.
    pub watch_namespaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySettings {
    pub secret: String,
    /// `None`: the client's default namespace (the pod's own, in a cluster).
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub name: String,
    /// `None`: the client's default namespace (the pod's own, in a cluster).
    pub namespace: Option<String>,
    pub identity: String,
}

/// Why `run` stopped before its shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No kubeconfig and not in a cluster: a configuration error (exit 64).
    #[error("cannot configure the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("cannot read the API server's version (to check it is supported): {0}")]
    Version(#[source] kube::Error),
    #[error(transparent)]
    Unsupported(#[from] crate::supported::Unsupported),
    #[error("cannot listen on {address} for /health, /ready and /metrics: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the agents' control client: {0}")]
    AgentClient(#[source] reqwest::Error),
    #[error("the HTTP endpoint stopped: {0}")]
    Http(#[source] std::io::Error),
    #[error("the {0} stopped before shutdown")]
    Stopped(&'static str),
}

impl RunError {
    /// Whether the configuration is at fault (exit 64) rather than the environment.
    pub fn is_configuration(&self) -> bool {
        matches!(self, Self::Client(_) | Self::Listen { .. })
    }
}

/// Runs until `shutdown` completes; the controller lets reconciles under way finish and the
/// leader gives up its lease. Named tasks under one supervisor ([`supervise`]): the controller,
/// the HTTP endpoint, the lease's election, the leader gauge and the key reader.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let client = connect().await?;
    let listener = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .map_err(|source| RunError::Listen {
            address: config.metrics_listen,
            source,
        })?;
    let agents = HttpAgentControl::new().map_err(RunError::AgentClient)?;
    let metrics = Metrics::default();
    let (leader_tx, leader_rx) = watch::channel(config.lease.is_none());
    let (key_tx, key_rx) = watch::channel(None);
    let key_reader = {
        let namespace = config
            .key
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        key_ring::keep_reading(
            Api::namespaced(client.clone(), &namespace),
            config.key.secret.clone(),
            key_tx,
        )
    };
    // One shutdown, seen by every task.
    let shutdown = shutdown.shared();
    let ready = Arc::new(AtomicBool::new(false));
    let server = http::serve(
        listener,
        http::router(metrics.clone(), ready.clone()),
        shutdown.clone(),
    );
    let gauge = leader_gauge(leader_rx.clone(), metrics.clone());
    let context = context(&client, &config, agents, metrics, (leader_rx, key_rx));
    // The lease is given up only once the controller has stopped, so no reconcile of this
    // replica overlaps with the next leader's.
    let (controller_done, controller_stopped) = tokio::sync::oneshot::channel::<()>();
    let election = election(client, config.lease, leader_tx, controller_stopped);
    ready.store(true, Ordering::Release);
    let controller = controller::run(Arc::new(context), shutdown.clone());
    let tasks = Tasks {
        election,
        server,
        controller,
        gauge,
        key_reader,
    };
    supervise(tasks, shutdown, controller_done).await
}

/// The client, once the API server's release is one the operator supports.
async fn connect() -> Result<Client, RunError> {
    let client = Client::try_default().await.map_err(RunError::Client)?;
    let version = client
        .apiserver_version()
        .await
        .map_err(RunError::Version)?;
    let release = crate::supported::check(&version)?;
    if release > crate::supported::NEWEST_TESTED {
        tracing::warn!(
            %release,
            newest_tested = %crate::supported::NEWEST_TESTED,
            "the API server is newer than any release the operator was tested on"
        );
    } else {
        tracing::info!(%release, "the API server's release is supported");
    }
    Ok(client)
}

/// The controller's context: the settings every Composition's objects take, the agents' client,
/// the leader and key watches, and the events' reporter.
fn context(
    client: &Client,
    config: &Config,
    agents: HttpAgentControl,
    metrics: Metrics,
    (leader, key): (
        watch::Receiver<bool>,
        watch::Receiver<Option<key_ring::KeyRing>>,
    ),
) -> Context {
    let settings = Settings {
        agent_image: config.agent_image.clone(),
        agent_resources: config.agent_resources.clone(),
        control_from: config.control_from.clone(),
        egress: config.egress.clone(),
        node_networks: config.node_networks.clone(),
    };
    let mut context = Context::new(
        client.clone(),
        settings,
        Arc::new(agents),
        metrics,
        leader,
        key,
    );
    context.watch_namespaces = config.watch_namespaces.clone();
    context.events = Events::new(Recorder::new(
        client.clone(),
        Reporter {
            controller: "toa-operator".to_owned(),
            instance: config.lease.as_ref().map(|lease| lease.identity.clone()),
        },
    ));
    context
}

/// The lease's election until the controller has stopped (then the lease is given up); without
/// a lease, only the wait.
async fn election(
    client: Client,
    lease: Option<LeaseSettings>,
    leader: watch::Sender<bool>,
    controller_stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Some(settings) = lease else {
        let _ = controller_stopped.await;
        return;
    };
    let namespace = settings
        .namespace
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let api = Api::namespaced(client, &namespace);
    let config = lease::Config {
        name: settings.name,
        namespace,
        identity: settings.identity,
    };
    let stopped = async move {
        let _ = controller_stopped.await;
    };
    lease::run(api, config, leader, stopped).await;
}

/// Keeps the leader gauge at what the election says.
async fn leader_gauge(mut leader: watch::Receiver<bool>, metrics: Metrics) {
    loop {
        metrics.leader.set(i64::from(*leader.borrow_and_update()));
        if leader.changed().await.is_err() {
            // The lease loop ended: nothing more to report.
            std::future::pending::<()>().await;
        }
    }
}

/// The tasks `run` supervises.
struct Tasks<E, S, C, G, K> {
    election: E,
    server: S,
    controller: C,
    gauge: G,
    key_reader: K,
}

/// Until shutdown, every task runs; one that ends earlier stops the process with an error,
/// rather than leaving an operator without its lease, endpoint or controller unnoticed. After
/// the shutdown, the controller finishes, then the election gives up the lease, then the
/// endpoint ends.
async fn supervise<E, S, C, G, K>(
    tasks: Tasks<E, S, C, G, K>,
    shutdown: futures::future::Shared<impl Future<Output = ()>>,
    controller_done: tokio::sync::oneshot::Sender<()>,
) -> Result<(), RunError>
where
    E: Future<Output = ()>,
    S: Future<Output = std::io::Result<()>>,
    C: Future<Output = ()>,
    G: Future<Output = ()>,
    K: Future<Output = ()>,
{
    let mut election = std::pin::pin!(tasks.election);
    let mut server = std::pin::pin!(tasks.server.fuse());
    let mut controller = std::pin::pin!(tasks.controller.fuse());
    let (mut gauge, mut key_reader) = (
        std::pin::pin!(tasks.gauge),
        std::pin::pin!(tasks.key_reader),
    );
    // The endpoint and the controller end on the shutdown too, and on another thread the
    // shutdown can complete between this task's polls of it and of them: ending then is no error.
    let shut_down = || shutdown.clone().now_or_never().is_some();
    let mut server_result = None;
    loop {
        tokio::select! {
            biased;
            () = shutdown.clone() => break,
            () = &mut election => return Err(RunError::Stopped("lease loop")),
            result = &mut server => {
                if !shut_down() {
                    result.map_err(RunError::Http)?;
                    return Err(RunError::Stopped("HTTP endpoint"));
                }
                server_result = Some(result);
            }
            () = &mut controller => {
                if !shut_down() {
                    return Err(RunError::Stopped("controller"));
                }
            }
            () = &mut gauge => return Err(RunError::Stopped("leader gauge")),
            () = &mut key_reader => return Err(RunError::Stopped("key reader")),
        }
    }
    tracing::info!("shutting down: finishing reconciles under way");
    if !controller.is_terminated() {
        controller.await;
    }
    let _ = controller_done.send(());
    election.await;
    match server_result {
        Some(result) => result,
        None => server.await,
    }
    .map_err(RunError::Http)
}
