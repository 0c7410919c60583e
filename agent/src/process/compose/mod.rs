//! `toa-agent compose DIR...`: runs components locally, the way the seeds' `toa compose` does,
//! and in a pod beside its component containers.
//!
//! [`run`] reads top-down: [`Composition::prepare`] loads the components and binds every listener,
//! [`Composition::start`] starts (or attaches to) the programs, connects the broker and runs the
//! lifecycle (`preflight` → operations served → `settle` → `ready` → "Composition complete"),
//! [`Composition::serve`] waits for the stop (SIGINT/SIGTERM or a drain asked for) while running
//! the lifecycle again for a restarted container, and [`Composition::drain`] stops taking calls
//! and pulses, waits for calls in flight, runs `dispose`, leaves the slots membership and stops
//! the programs. Every stage is watched against the servers ([`servers`]): one that dies stops
//! the process with its error. Dropping a [`Composition`] (any early return) aborts its servers
//! and kills the programs it started. Without `atomicity` it coordinates in-process; calls between
//! its components go in-process.

mod prepare;
mod programs;
mod servers;

use crate::api::{self, Host};
use crate::calls::activity::Activity;
use crate::calls::broker::{Broker, Offer, Receiving};
use crate::calls::catalog::Catalog;
use crate::calls::receivers::{listen_locally, Receivers};
use crate::calls::router::{Callee, Calls};
use crate::component::program::Program;
use crate::component::{Component, ComponentError};
use crate::control::component_tokens::ComponentTokens;
use crate::coordination::atom::{Atom, Mode};
use crate::entities::backend::{Backend, Storage};
use crate::entities::objects::Objects;
use crate::entities::outbox::Sink;
use crate::instance::Instance;
use crate::metrics::Metrics;
use crate::process::drain;
use crate::process::lifecycle::{self, Member};
use crate::process::supervisor::Process;
use futures::FutureExt;
use servers::Servers;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use toa_context::tls::Roots;
use toa_context::{Context, Credentials, RunCommand};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

/// How many events this process's bus holds for a receiver that is behind (without a broker).
const EVENTS_BUS: usize = 1024;

/// What `compose` was asked to run.
pub struct Options {
    pub context: Context,
    pub credentials: Credentials,
    pub components: Vec<PathBuf>,
    pub listen: SocketAddr,
    pub instance: Instance,
    /// Told the local API's address once the composition is complete.
    pub on_ready: Option<oneshot::Sender<SocketAddr>>,
    /// Where the control endpoint listens, and the tokens control requests are signed with.
    pub control: Option<Control>,
    /// Where the probes (`/healthz`, `/readyz`) listen on the pod network, if anywhere.
    pub probe: Option<SocketAddr>,
    /// Attach to programs started by someone else (a pod's component containers) instead of
    /// starting them: component i serves 127.0.0.1:(this port + i).
    pub attach: Option<u16>,
    /// A directory of other components' manifests, `<component>.yaml`
    /// (see [`crate::calls::catalog`]).
    pub declarations: Option<PathBuf>,
    /// A local run coordinates in-process without `atomicity`; a pod does not.
    /// In a pod: the digest of the drain key the kubelet's hooks present; with it, only they
    /// start the drain (the local API does not).
    pub drain_digest: Option<String>,
    /// In a pod: where each component's local API token is written (`DIR/<index>/token`).
    pub component_tokens: Option<PathBuf>,
    pub mode: Mode,
    /// How to reach the broker the context names (`None` without one).
    pub broker: Option<BrokerConfig>,
    /// The context's `configuration` section: component → its values (local runs; in a pod the
    /// operator passes each component container its own).
    pub configuration: std::collections::BTreeMap<String, serde_json::Value>,
    /// In a pod: its Kubernetes namespace, which the application's queues and Redis keys carry
    /// ([`toa_context::annotations::shared_name`]).
    pub kubernetes_namespace: Option<String>,
    /// What `rediss://` and `amqps://` connections trust (`TOA_TLS_CA_FILE`).
    pub roots: Roots,
    /// The store of entities the context names (`storage`), with its credentials.
    pub storage: Option<Storage>,
    /// The local group this process joins ([`crate::coordination::group`]), by name.
    pub group: Option<String>,
}

/// The control endpoint: its address, and the tokens from the mounted Secret (read again when
/// they change: [`crate::control::tokens`]).
pub struct Control {
    pub address: SocketAddr,
    pub tokens: crate::control::tokens::Tokens,
    pub file: PathBuf,
}

/// The broker's credentials (`TOA_AMQP_USERNAME`, `TOA_AMQP_PASSWORD`) and tuning.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The application as named on the broker: in a pod with its Kubernetes namespace
    /// ([`toa_context::annotations::shared_name`]).
    pub application: String,
    pub credentials: Credentials,
    pub roots: Roots,
    pub tuning: crate::calls::broker::Tuning,
}

#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error(transparent)]
    Component(#[from] ComponentError),
    #[error("{0}")]
    Setup(String),
    #[error(transparent)]
    ComponentTokens(#[from] crate::control::component_tokens::ComponentTokenError),
    /// A server of the agent's stopped: the process stops with it.
    #[error("the {server} stopped: {message}")]
    Server {
        server: &'static str,
        message: String,
    },
}

/// Runs until `shutdown` completes (or a drain is asked for), then drains; in a pod, a drain asked
/// for is followed by a wait for `shutdown` ([`Composition::until_the_signal`]). An error: the
/// start failed, or one of the agent's servers stopped.
pub async fn run(
    options: Options,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ComposeError> {
    let (mut composition, servers, local, asked) = Composition::prepare(options).await?;
    let drain::Asked {
        asked: mut drain_asked,
        done,
        started: restarted,
    } = asked;
    composition.drained = Some(done);
    let shutdown: Stop<'_> = Box::pin(shutdown);
    let shutdown = shutdown.shared();
    // A stop (the signal, or a drain asked for) ends the start too: a pod deleted while it
    // starts does not keep its preStop hooks waiting for a drain that would come only after.
    let stop = Box::pin({
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                _ = drain_asked.recv() => {}
            }
        }
    });
    let mut watch = Watch { servers, stop };
    let served = match composition.start(local, &mut watch).await {
        Ok(()) => composition.serve(restarted, &mut watch).await,
        Err(Ended::Stopped) => {
            return composition
                .stopped_while_starting(watch.servers, shutdown)
                .await
        }
        Err(Ended::Failed(error)) => Err(error),
    };
    match served {
        Ok(()) => composition.drain(watch.servers, shutdown).await,
        Err(error) => {
            drop(watch.servers);
            composition.close().await;
            Err(error)
        }
    }
}

/// The stop: a signal, or a drain asked for.
type Stop<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Why a stage did not complete.
enum Ended {
    /// A stop was asked for.
    Stopped,
    Failed(ComposeError),
}

impl<E: Into<ComposeError>> From<E> for Ended {
    fn from(error: E) -> Self {
        Ended::Failed(error.into())
    }
}

/// What every stage is raced against: the servers (dropped: aborted) and the stop.
struct Watch<'a> {
    servers: Servers,
    stop: Stop<'a>,
}

impl Watch<'_> {
    /// `work`, unless a server dies or a stop is asked for first (in that order).
    async fn watched<T, E: Into<ComposeError>>(
        &mut self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Ended> {
        tokio::select! {
            biased;
            died = self.servers.died() => Err(Ended::Failed(died)),
            () = &mut self.stop => Err(Ended::Stopped),
            done = work => done.map_err(Ended::from),
        }
    }
}

/// One process's composition: what every stage reads and what it started.
pub struct Composition {
    context: Context,
    instance: Instance,
    components: Vec<PathBuf>,
    loaded: Vec<Arc<Component>>,
    attach: Option<u16>,
    /// A pod's process (`Mode::Pod`): after a drain it waits for its signal.
    in_pod: bool,
    declarations: Option<PathBuf>,
    broker: Option<BrokerConfig>,
    on_ready: Option<oneshot::Sender<SocketAddr>>,
    metrics: Arc<Metrics>,
    atoms: HashMap<String, Arc<Atom>>,
    /// The local group, left once the programs stopped (they may hold its locks until then).
    group: Option<Arc<crate::coordination::group::Group>>,
    activity: Arc<Activity>,
    process: Arc<Process>,
    /// The local API's address.
    address: SocketAddr,
    trigger: drain::Trigger,
    /// Told once the drain is done (its waiting requests answer then).
    drained: Option<watch::Sender<bool>>,
    /// Operations are served (after `preflight`, until the drain).
    serving: watch::Sender<bool>,
    /// The lifecycle is done; with every program answering, the process is ready.
    lifecycle_done: watch::Sender<bool>,
    programs_up: watch::Sender<bool>,
    ready: watch::Receiver<bool>,
    /// Stops the local API, letting requests in flight finish.
    local_stop: Option<oneshot::Sender<()>>,
    /// Killed on drop (those the agent started).
    programs: Vec<Program>,
    members: Vec<Member>,
    alive: Vec<watch::Receiver<bool>>,
    calls: Option<Arc<Calls>>,
    /// Each component's token for the local API.
    tokens: Arc<ComponentTokens>,
    /// The stores of the components with an entity, opened before their programs start.
    stores: HashMap<String, Backend>,
    /// The calls running here as transitions under `retry`: their components' objects tell it,
    /// the router refuses their calls to an operation declaring `once`.
    retrying: Arc<crate::entities::retrying::Retrying>,
}

/// The servers' names, as errors and logs say them.
const LOCAL_API: &str = "local API";
const CONTROL: &str = "control endpoint";
const PROBES: &str = "probe endpoint";

impl Composition {
    /// Programs started, broker connected, local API served, lifecycle run: the process is ready.
    async fn start(&mut self, local: TcpListener, watch: &mut Watch<'_>) -> Result<(), Ended> {
        let agent_url = format!("http://{}", self.address);
        let starts = programs::start(
            &self.loaded,
            self.attach,
            &agent_url,
            &self.instance,
            &self.tokens,
        );
        let started = watch
            .watched(async { Ok::<_, ComposeError>(starts.await) })
            .await?;
        self.keep(started)?;
        watch.watched(self.describe()).await?;
        self.watch_programs();
        let calls = self.calls();
        let (calls, sink, broker) = match self.context.amqp.clone() {
            None => {
                let sink = match &self.group {
                    Some(group) => Sink::Group(group.clone()),
                    None => Sink::Local(tokio::sync::broadcast::channel(EVENTS_BUS).0),
                };
                (Arc::new(calls), sink, None)
            }
            Some(_) => {
                let broker = watch.watched(self.connect()).await?;
                let catalog = Catalog::new(
                    &self.loaded,
                    prepare::sources(&self.components, self.declarations.clone()),
                );
                catalog.keep_reloading();
                let calls = Arc::new(calls.over_broker(broker.clone(), catalog));
                (calls, Sink::Broker(broker.clone()), Some(broker))
            }
        };
        self.publish_events(&sink);
        self.offer_to_group(&calls);
        self.calls = Some(calls.clone());
        self.serve_local(&mut watch.servers, local, calls.clone());
        tracing::info!(agent = %agent_url, instance = %self.instance, "serving the local API");
        watch
            .watched(lifecycle::run_up(&self.members, &self.serving))
            .await?;
        // Receiving before the process says it is ready: a ready replica's queue is bound, so
        // the events published from then on reach it (a bench saw the first ones dropped).
        watch
            .watched(self.receive_events(&sink, broker.as_ref(), &calls))
            .await?;
        self.lifecycle_done.send_replace(true);
        let names: Vec<&str> = self.loaded.iter().map(|c| c.name.as_str()).collect();
        tracing::info!(components = ?names, "Composition complete");
        if let Some(on_ready) = self.on_ready.take() {
            let _ = on_ready.send(self.address);
        }
        self.process.started(self.members.clone(), calls).await;
        Ok(())
    }

    /// Keeps the programs that started; the first failure fails the start (the others stop).
    fn keep(
        &mut self,
        started: Vec<Result<(Program, crate::component::client::ProgramClient), ComponentError>>,
    ) -> Result<(), ComponentError> {
        let mut failure = None;
        for (component, started) in self.loaded.iter().zip(started) {
            match started {
                Ok((program, client)) => {
                    self.programs.push(program);
                    self.members.push(Member {
                        component: component.clone(),
                        client: client.with_limits(&self.context.limits),
                        commands: component.manifest.lifecycle.clone(),
                        objects: None,
                        adapted: Vec::new(),
                    });
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Each program's run commands, from what it says it serves, checked against its manifest;
    /// a mismatch fails the start, naming it.
    async fn describe(&mut self) -> Result<(), ComponentError> {
        for member in &mut self.members {
            let description =
                member
                    .client
                    .describe()
                    .await
                    .map_err(|error| ComponentError::Start {
                        component: member.component.name.clone(),
                        message: error.to_string(),
                    })?;
            member.commands = member.component.commands(description.as_ref())?;
            member.adapted = member.component.adapted(description.as_ref())?;
            member.component.conditioned(description.as_ref())?;
            member.component.warn_undeclared(description.as_ref());
            member.component.check_kinds(description.as_ref())?;
            if let Some(store) = self.stores.remove(&member.component.name) {
                let retrying = self.retrying.clone();
                let description = description.as_ref();
                let objects = Objects::new(&member.component, description, store, retrying)?;
                member.objects = objects.map(Arc::new);
            }
        }
        Ok(())
    }

    /// A program that stops answering makes the process not ready, and its calls go elsewhere.
    fn watch_programs(&mut self) {
        self.alive = self
            .members
            .iter()
            .map(|m| m.client.watch(programs::ALIVE_EVERY))
            .collect();
        let mut all_alive = programs::all_true(self.alive.clone());
        let programs_up = self.programs_up.clone();
        tokio::spawn(async move {
            loop {
                programs_up.send_replace(*all_alive.borrow_and_update());
                if all_alive.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// The call router over this process's components.
    fn calls(&self) -> Calls {
        let callees = self
            .members
            .iter()
            .map(|m| {
                let callee = Callee {
                    component: m.component.clone(),
                    client: Arc::new(m.client.clone()),
                    repeats: self.atoms[&m.component.name].repeats(),
                    objects: m.objects.clone(),
                    operations: Arc::new(
                        self.metrics
                            .operations(&self.context.name, &m.component.name),
                    ),
                };
                (m.component.name.clone(), callee)
            })
            .collect();
        Calls::new(
            callees,
            self.instance.to_string(),
            &self.context,
            self.serving.subscribe(),
            self.activity.clone(),
        )
        .refusing_once_from(self.retrying.clone())
        .in_group(self.group.clone())
    }

    /// Offers this process's components to the other processes of its local group.
    fn offer_to_group(&self, calls: &Arc<Calls>) {
        let Some(group) = &self.group else { return };
        let names = self
            .members
            .iter()
            .map(|m| m.component.name.clone())
            .collect();
        let calls = calls.clone();
        group.offer(
            names,
            Arc::new(move |component, call| {
                let calls = calls.clone();
                Box::pin(async move { calls.run_handed(component, call).await })
            }),
        );
    }

    /// Where the components' events go from now on (their relays run with the pulses:
    /// `process::supervisor`).
    fn publish_events(&self, sink: &Sink) {
        for member in &self.members {
            let Some(outbox) = member.objects.as_ref().and_then(|o| o.outbox()) else {
                continue;
            };
            let waiting = self
                .metrics
                .events_waiting(&self.context.name, &member.component.name);
            outbox.connect(sink.clone(), waiting);
        }
    }

    /// The components' receivers take events from now on: off the broker, or the process's
    /// bus in a local run without one.
    async fn receive_events(
        &self,
        sink: &Sink,
        broker: Option<&Arc<Broker>>,
        calls: &Arc<Calls>,
    ) -> Result<(), ComposeError> {
        let deliveries = self.context.limits.deliveries;
        let mut in_group = std::collections::BTreeMap::new();
        for (member, alive) in self.members.iter().zip(&self.alive) {
            let component = &member.component;
            if component.manifest.receivers.is_empty() {
                continue;
            }
            latest_on_the_store(member)?;
            let receivers = Arc::new(Receivers::new(
                component.clone(),
                calls.clone(),
                member.client.clone(),
                &member.adapted,
                self.context.limits.operation,
            ));
            match (sink, broker) {
                (Sink::Local(bus), _) => listen_locally(bus.subscribe(), receivers, deliveries),
                (Sink::Group(_), _) => {
                    in_group.insert(component.name.clone(), receivers);
                }
                (_, Some(broker)) => {
                    let receiving = Receiving {
                        component: component.name.clone(),
                        labels: receivers.labels(),
                        receiver: receivers,
                        alive: alive.clone(),
                        dead_lettered: self
                            .metrics
                            .events_dead_lettered(&self.context.name, &component.name),
                    };
                    broker
                        .receive(receiving)
                        .await
                        .map_err(|e| ComposeError::Setup(e.to_string()))?;
                }
                (Sink::Broker(_), None) => unreachable!("a broker sink comes with its broker"),
            }
        }
        if let Sink::Group(group) = sink {
            receive_in_group(group, in_group, deliveries);
        }
        Ok(())
    }

    /// Connects the broker and offers it every component.
    async fn connect(&self) -> Result<Arc<Broker>, ComposeError> {
        let setup = |e: &dyn std::fmt::Display| ComposeError::Setup(e.to_string());
        let (
            Some(address),
            Some(BrokerConfig {
                application: shared,
                credentials,
                roots,
                tuning,
            }),
        ) = (&self.context.amqp, self.broker.clone())
        else {
            return Err(setup(&"the broker's configuration was not read"));
        };
        let (application, instance) = (&self.context.name, self.instance.as_str());
        let limits = &self.context.limits;
        let login = (&credentials, &roots);
        let broker = Broker::connect(address, login, &shared, instance, limits, tuning)
            .await
            .map_err(|e| setup(&e))?;
        for (member, alive) in self.members.iter().zip(&self.alive) {
            let name = &member.component.name;
            let offer = Offer {
                component: member.component.clone(),
                client: member.client.clone(),
                instance: instance.to_owned(),
                serving: self.serving.subscribe(),
                alive: alive.clone(),
                activity: self.activity.clone(),
                dead_lettered: self.metrics.dead_lettered(application, name),
                repeats: self.atoms[name].repeats(),
                redeliveries: self.atoms[name].redeliveries(),
                objects: member.objects.clone(),
                operations: self.metrics.operations(application, name),
            };
            broker.serve(offer).await.map_err(|e| setup(&e))?;
        }
        tracing::info!(broker = %address, "calls go over the broker");
        Ok(broker)
    }

    fn serve_local(&mut self, servers: &mut Servers, listener: TcpListener, calls: Arc<Calls>) {
        let answering = self.members.iter().map(|member| {
            let name = member.component.name.clone();
            (name, member.client.answering())
        });
        let host = Arc::new(Host {
            atoms: self.atoms.clone(),
            answering: answering.collect(),
            calls: Some(calls),
            instance: self.instance.to_string(),
            ready: self.ready.clone(),
            listeners: Default::default(),
            streams: Default::default(),
            metrics: self.metrics.clone(),
            tokens: self.tokens.clone(),
        });
        let app = api::router(host).merge(drain::local_route(self.trigger.clone()));
        let (stop, stopped) = oneshot::channel::<()>();
        self.local_stop = Some(stop);
        let listening = servers::Listening {
            thread: Some(crate::local_thread::handle()),
            ..servers::Listening::new(listener, servers::LOCAL_API_CONNECTIONS)
        };
        servers.serve_until(LOCAL_API, listening, app, async {
            let _ = stopped.await;
        });
    }

    /// Until the stop. A component container the kubelet restarted (told by its `postStart`
    /// hook; every container's first start is the pod's) gets the lifecycle again, in this
    /// process, which keeps its listeners: the agent never lets its ports go.
    async fn serve(
        &mut self,
        mut restarted: mpsc::UnboundedReceiver<usize>,
        watch: &mut Watch<'_>,
    ) -> Result<(), ComposeError> {
        let mut starts = vec![0u32; self.members.len()];
        loop {
            let index = tokio::select! {
                biased;
                died = watch.servers.died() => return Err(died),
                () = &mut watch.stop => return Ok(()),
                Some(index) = restarted.recv() => index,
            };
            let Some(seen) = starts.get_mut(index) else {
                tracing::warn!(
                    index,
                    "a postStart hook named a container this pod does not have"
                );
                continue;
            };
            *seen += 1;
            if *seen == 1 {
                continue;
            }
            let member = &self.members[index];
            let port = self.programs[index].port();
            let (serving, done) = (&self.serving, &self.lifecycle_done);
            let again = programs::again(member, port, serving, done);
            match watch.watched(again).await {
                Ok(()) => {}
                Err(Ended::Stopped) => return Ok(()),
                Err(Ended::Failed(error)) => {
                    tracing::error!(%error, "the component's new program did not start");
                    return Err(error);
                }
            }
        }
    }

    /// No more calls in, calls in flight waited for, `dispose`, programs stopped. In a pod, then
    /// the signal waited for: the kubelet stops the agent, a native sidecar, after the component
    /// containers, and runs its own preStop hook first; an agent that had exited would fail that
    /// hook (a `FailedPreStopHook` warning on every stopped pod), one still serving answers it
    /// at once, drained.
    async fn drain(
        mut self,
        mut servers: Servers,
        shutdown: futures::future::Shared<Stop<'_>>,
    ) -> Result<(), ComposeError> {
        tracing::info!("draining: no more calls in, running dispose");
        self.lifecycle_done.send_replace(false);
        self.serving.send_replace(false);
        self.process.drain().await;
        let budget = self.context.limits.drain;
        let running = match &self.calls {
            Some(calls) => calls.drain(budget).await,
            None => 0,
        };
        if running > 0 {
            tracing::warn!(
                running,
                budget_ms = budget.as_millis() as u64,
                "calls still run at the end of the drain's budget: dispose runs anyway; calls from the broker are given back to it, for another replica"
            );
        }
        servers.abort(CONTROL);
        if let Err(error) = lifecycle::phase(&self.members, RunCommand::Dispose).await {
            tracing::error!(%error, "dispose failed");
        }
        self.tell_drained();
        self.shutdown_atoms().await;
        programs::stop(std::mem::take(&mut self.programs)).await;
        self.leave_group();
        // A call whose program was just stopped under it is given back to the broker (once the
        // consumer stepped back): wait for that before the connection goes, or the broker would
        // requeue the original beside the copy given back, and the call would run twice.
        let left = self.activity.settled(GIVE_BACK).await;
        if left > 0 {
            tracing::warn!(
                left,
                "calls were still being given back when the process stopped"
            );
        }
        // Let a waiting drain request have its answer, then stop serving. The probe port stays
        // until here: the components' preStop hooks wait on it for the drain.
        if let Some(stop) = self.local_stop.take() {
            let _ = stop.send(());
            if !servers.finished(LOCAL_API, LOCAL_CLOSE).await {
                tracing::warn!("the local API did not close within {LOCAL_CLOSE:?}");
            }
        }
        self.until_the_signal(shutdown).await;
        tracing::info!("stopped");
        Ok(())
    }

    /// A stop asked for before the composition was complete: what started stops, without
    /// `dispose` (nothing ran `ready`), and a waiting drain is answered; in a pod, the signal is
    /// waited for, as after a drain ([`Self::drain`]).
    async fn stopped_while_starting(
        mut self,
        mut servers: Servers,
        shutdown: futures::future::Shared<Stop<'_>>,
    ) -> Result<(), ComposeError> {
        tracing::info!("stopped while starting");
        servers.abort(LOCAL_API);
        programs::stop(std::mem::take(&mut self.programs)).await;
        self.tell_drained();
        self.until_the_signal(shutdown).await;
        // Let the waiting drain requests have their answer before the probes go.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }

    /// After a failure (the servers are gone): the programs stop, the slots membership is left.
    async fn close(mut self) {
        programs::stop(std::mem::take(&mut self.programs)).await;
        self.shutdown_atoms().await;
        self.leave_group();
    }

    fn leave_group(&self) {
        if let Some(group) = &self.group {
            group.leave();
        }
    }

    /// In a pod, after a drain a hook asked for: the probe port keeps answering (a drain is
    /// answered at once, drained) until the signal, which the kubelet sends once the component
    /// containers stopped, or for as long as a stop may take ([`toa_context::Limits::stop`]):
    /// should no signal come (a component container restarted alone ran its hook), the process
    /// ends, and the kubelet starts a new agent. A drain the signal started returns at once.
    async fn until_the_signal(&self, shutdown: futures::future::Shared<Stop<'_>>) {
        if !self.in_pod {
            return;
        }
        let bound = self.context.limits.stop();
        tracing::info!(
            bound_s = bound.as_secs(),
            "drained: the probe port answers until the stop signal"
        );
        if tokio::time::timeout(bound, shutdown).await.is_err() {
            tracing::warn!(
                bound_s = bound.as_secs(),
                "no stop signal after the drain: the process ends"
            );
        }
    }

    fn tell_drained(&self) {
        if let Some(drained) = &self.drained {
            drained.send_replace(true);
        }
    }

    async fn shutdown_atoms(&self) {
        for atom in self.atoms.values() {
            atom.shutdown().await;
        }
    }
}

/// The receivers of this process's components take the events the local group hands here.
fn receive_in_group(
    group: &crate::coordination::group::Group,
    receivers: std::collections::BTreeMap<String, Arc<Receivers>>,
    deliveries: u32,
) {
    let labels = receivers
        .iter()
        .map(|(component, receivers)| (component.clone(), receivers.labels()))
        .collect();
    group.receive(
        labels,
        Arc::new(move |component, event| {
            let event = match serde_json::from_value::<crate::entities::store::Event>(event) {
                Ok(event) => event,
                Err(error) => {
                    tracing::warn!(%component, %error, "local group: an event this process cannot read is dropped");
                    return;
                }
            };
            if let Some(receivers) = receivers.get(&component).cloned() {
                tokio::spawn(async move {
                    crate::calls::receivers::deliver(&receivers, &event, deliveries).await
                });
            }
        }),
    );
}

/// How long calls cut off by the end of the drain may take to be given back (the handler waits
/// up to 1.5 s for its consumer to step back).
const GIVE_BACK: Duration = Duration::from_secs(3);

/// How long the local API may take to answer its last requests.
const LOCAL_CLOSE: Duration = Duration::from_secs(2);

/// Completes on SIGINT or SIGTERM; the handlers are installed when this is called (in a
/// runtime), so a signal during the start is not the default action (an exit without a drain).
pub fn signals() -> impl Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    }
}

/// A receiver declaring `latest` keeps the versions it applied with its writes: its operation
/// must be a transition or an assignment (known once the program said its kinds).
fn latest_on_the_store(member: &Member) -> Result<(), ComposeError> {
    let component = &member.component;
    let records = |operation: &str| {
        member
            .objects
            .as_ref()
            .is_some_and(|objects| objects.records(operation))
    };
    match component
        .manifest
        .receivers
        .iter()
        .find(|(_, receiver)| receiver.latest() && !records(receiver.operation()))
    {
        Some((label, receiver)) => Err(ComposeError::Component(ComponentError::Mismatch {
            component: component.name.clone(),
            message: format!(
                "`receivers.{label}`: `latest` keeps the versions applied with the writes, and \
                 {} is not a transition or an assignment",
                receiver.operation()
            ),
        })),
        None => Ok(()),
    }
}
