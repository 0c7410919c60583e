//! `toa-agent compose DIR...`: runs components locally, the way the seeds' `toa compose` does.
//!
//! It reads the context for an environment (`local` by default), starts each component's program,
//! serves the local API, runs the lifecycle (`preflight` → operations served → `settle` → `ready`
//! → "Composition complete"), runs pulses, and on SIGINT/SIGTERM (or `POST /v1/drain`) drains:
//! stops taking calls and pulses, runs `dispose`, leaves the slots membership, stops the programs.
//! Without `atomicity` it coordinates in-process; calls between its components go in-process.

use crate::activity::Activity;
use crate::api::{self, Host};
use crate::atom::{Atom, AtomConfig, Mode, Scope};
use crate::broker::Broker;
use crate::calls::{Callee, Calls};
use crate::catalog::{Catalog, Source};
use crate::component::program::Program;
use crate::component::{Component, ComponentError};
use crate::drain;
use crate::instance::Instance;
use crate::lifecycle::{self, Member};
use crate::metrics::Metrics;
use crate::supervisor::Process;
use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use toa_context::{Context, Credentials, RunCommand};
use tokio::sync::watch;

/// What `compose` was asked to run.
pub struct Options {
    pub context: Context,
    pub credentials: Credentials,
    pub components: Vec<PathBuf>,
    pub listen: SocketAddr,
    pub instance: Instance,
    /// Told the local API's address once the composition is complete.
    pub on_ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    /// Where the control endpoint listens, and the token every control request must carry.
    pub control: Option<(SocketAddr, String)>,
    /// Where the probes (`/healthz`, `/readyz`) listen on the pod network, if anywhere.
    pub probe: Option<SocketAddr>,
    /// Attach to programs started by someone else (a pod's component containers) instead of
    /// starting them: component i serves 127.0.0.1:(this port + i).
    pub attach: Option<u16>,
    /// A directory of other components' manifests, `<component>.yaml` (see [`crate::catalog`]).
    pub declarations: Option<PathBuf>,
    /// A local run coordinates in-process without `atomicity`; a pod does not.
    pub mode: Mode,
    /// How to reach the broker the context names (`None` without one).
    pub broker: Option<BrokerConfig>,
}

/// The broker's credentials (`TOA_AMQP_USERNAME`, `TOA_AMQP_PASSWORD`) and tuning.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub credentials: Credentials,
    pub tuning: crate::broker::Tuning,
}

#[derive(Debug, thiserror::Error)]
pub enum ComposeError {
    #[error(transparent)]
    Component(#[from] ComponentError),
    #[error("{0}")]
    Setup(String),
}

/// Runs until `shutdown` completes, then drains. Returns an error when the start failed.
pub async fn run(options: Options, shutdown: impl Future<Output = ()>) -> Result<(), ComposeError> {
    let Options {
        context,
        credentials,
        components,
        listen,
        instance,
        on_ready,
        control,
        attach,
        probe,
        declarations,
        mode,
        broker: broker_config,
    } = options;
    let mut loaded = Vec::new();
    for dir in &components {
        loaded.push(Arc::new(Component::load(dir)?));
    }
    let mut names: Vec<&str> = loaded.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(ComposeError::Setup(format!(
            "component {} is given twice",
            twice[0]
        )));
    }

    let metrics = Metrics::new();
    let mut atoms = HashMap::new();
    for component in &loaded {
        let config = AtomConfig {
            scope: Scope::new(context.name.clone(), component.name.clone()),
            mode,
            atomicity: context.atomicity.clone(),
            credentials: credentials.clone(),
            instance: instance.to_string(),
        };
        let atom =
            Atom::start(config, metrics.clone()).map_err(|e| ComposeError::Setup(e.to_string()))?;
        atoms.insert(component.name.clone(), Arc::new(atom));
    }

    // Every listener first. In a pod the component containers start only once these are bound
    // (the agent's postStart hook or startupProbe waits for them), so no program can take
    // their ports; and the probes answer `/healthz` from here on, through attaching and the
    // lifecycle.
    let listener = bind_local(listen, mode).await?;
    let address = listener
        .local_addr()
        .map_err(|e| ComposeError::Setup(e.to_string()))?;
    let agent_url = format!("http://{address}");
    let control = match control {
        Some((address, token)) => Some((bind(address, "control endpoint").await?, token)),
        None => None,
    };
    // The control endpoint answers from here on: `starting` until the lifecycle is done, and a
    // halt asked for meanwhile is kept for then.
    let activity = Activity::new();
    let process = Process::new(instance.to_string(), activity.clone());
    let control = match control {
        Some((listener, token)) => {
            let app = crate::control::router(token.clone(), process.clone());
            let served = tokio::spawn(axum::serve(listener, app).into_future());
            Some((served, token))
        }
        None => None,
    };
    let (trigger, asked) = drain::channel(control.as_ref().map(|(_, token)| token.as_str()));
    let control = control.map(|(served, _)| served);
    let drain::Asked {
        asked: mut drain,
        done: drained_tx,
        started: mut containers_started,
    } = asked;
    // A stop (the signal, or a drain asked for) ends the start too: a pod deleted while it
    // starts does not keep its preStop hooks waiting for a drain that would come only after.
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = drain.recv() => {}
        }
    };
    tokio::pin!(stop);
    let (serving_tx, serving) = watch::channel(false);
    // Ready: the lifecycle is done and every program answers.
    let (ready_tx, lifecycle_ready) = watch::channel(false);
    let (programs_up_tx, programs_up) = watch::channel(true);
    let ready = all_true(vec![lifecycle_ready, programs_up]);
    let probes = match probe {
        Some(address) => {
            let listener = bind(address, "probe endpoint").await?;
            // The drain key is in the path: anything the probes do not serve goes to it.
            let app = api::calls::probes(ready.clone(), metrics.clone()).fallback_service(
                axum::Router::new()
                    .fallback(drain::by_path)
                    .with_state(trigger.clone()),
            );
            Some(tokio::spawn(axum::serve(listener, app).into_future()))
        }
        None => None,
    };
    let stop_listeners = |probes: &Option<tokio::task::JoinHandle<_>>| {
        if let Some(probes) = probes {
            probes.abort();
        }
    };

    // Start every program at once.
    let starts = loaded.iter().enumerate().map(|(index, component)| {
        let (agent_url, instance) = (agent_url.clone(), instance.clone());
        async move {
            match attach {
                // Component i serves first_port + i, as the operator tells its container.
                Some(first_port) => component.attach(first_port + index as u16).await,
                None => component.start(&agent_url, instance.as_str()).await,
            }
        }
    });
    let started = tokio::select! {
        started = futures::future::join_all(starts) => started,
        _ = &mut stop => {
            return stopped_while_starting(&drained_tx, &probes, Vec::new(), None).await;
        }
    };
    let mut programs: Vec<Program> = Vec::new();
    let mut members = Vec::new();
    let mut failure = None;
    for (component, started) in loaded.iter().zip(started) {
        match started {
            Ok((program, client)) => {
                programs.push(program);
                members.push(Member {
                    component: component.clone(),
                    client: client.with_run_command_limit(context.limits.run_command),
                });
            }
            Err(error) => {
                failure.get_or_insert(error);
            }
        }
    }
    if let Some(error) = failure {
        stop_listeners(&probes);
        stop_programs(programs).await;
        return Err(error.into());
    }

    // A program that stops answering makes the process not ready, and its calls go elsewhere.
    let alive: Vec<watch::Receiver<bool>> = members
        .iter()
        .map(|m| m.client.watch(ALIVE_EVERY))
        .collect();
    let mut all_alive = all_true(alive.clone());
    tokio::spawn(async move {
        loop {
            programs_up_tx.send_replace(*all_alive.borrow_and_update());
            if all_alive.changed().await.is_err() {
                return;
            }
        }
    });
    let callees = members
        .iter()
        .map(|m| {
            (
                m.component.name.clone(),
                Callee {
                    component: m.component.clone(),
                    client: m.client.clone(),
                    repeats: atoms[&m.component.name].repeats(),
                },
            )
        })
        .collect();
    let calls = Calls::new(
        callees,
        instance.to_string(),
        &context,
        serving.clone(),
        activity.clone(),
    );
    let calls = match &context.amqp {
        None => Arc::new(calls),
        Some(address) => {
            let connected = async {
                let BrokerConfig {
                    credentials,
                    tuning,
                } = broker_config
                    .clone()
                    .ok_or("the broker's configuration was not read")?;
                let broker = Broker::connect(
                    address,
                    &credentials,
                    &context.name,
                    instance.as_str(),
                    &context.limits,
                    tuning,
                )
                .await
                .map_err(|e| e.to_string())?;
                for (member, alive) in members.iter().zip(&alive) {
                    let offer = crate::broker::Offer {
                        component: member.component.clone(),
                        client: member.client.clone(),
                        instance: instance.to_string(),
                        serving: serving.clone(),
                        alive: alive.clone(),
                        activity: activity.clone(),
                        dead_lettered: metrics.dead_lettered(&context.name, &member.component.name),
                        repeats: atoms[&member.component.name].repeats(),
                    };
                    broker.serve(offer).await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(broker)
            };
            let connected = tokio::select! {
                connected = connected => connected,
                _ = &mut stop => {
                    return stopped_while_starting(&drained_tx, &probes, programs, None).await;
                }
            };
            match connected {
                Ok(broker) => {
                    tracing::info!(broker = %address, "calls go over the broker");
                    let catalog = Catalog::new(&loaded, sources(&components, declarations));
                    catalog.keep_reloading();
                    Arc::new(calls.over_broker(broker, catalog))
                }
                Err(message) => {
                    stop_listeners(&probes);
                    stop_programs(programs).await;
                    return Err(ComposeError::Setup(message));
                }
            }
        }
    };
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let host = Arc::new(Host {
        atoms: atoms.clone(),
        calls: Some(calls.clone()),
        instance: instance.to_string(),
        ready,
        listeners: Default::default(),
        metrics: metrics.clone(),
    });
    let app = api::router(host).merge(
        axum::Router::new()
            .route("/v1/drain", axum::routing::post(drain::by_header))
            .with_state(trigger),
    );
    let server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = server_stopped.await;
            })
            .into_future(),
    );
    tracing::info!(agent = %agent_url, instance = %instance, "serving the local API");

    // Component containers that the kubelet restarted, from their `postStart` hooks: every
    // container's first start is the pod's; a later one (even during this lifecycle) is a new
    // program, which gets the lifecycle again below rather than `settle` without `preflight`.
    let mut starts_seen = vec![0u32; members.len()];
    let started = tokio::select! {
        started = lifecycle::run_up(&members, &serving_tx) => started,
        _ = &mut stop => {
            return stopped_while_starting(&drained_tx, &probes, programs, Some(server)).await;
        }
    };
    if let Err(error) = started {
        server.abort();
        stop_listeners(&probes);
        stop_programs(programs).await;
        return Err(error.into());
    }
    ready_tx.send_replace(true);
    tracing::info!(components = ?names, "Composition complete");
    if let Some(on_ready) = on_ready {
        let _ = on_ready.send(address);
    }
    process.started(members.clone(), calls.clone()).await;

    // A component container the kubelet restarted: its new program gets the lifecycle again, in
    // this process, which keeps its listeners: the agent never lets its ports go.
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(index) = containers_started.recv() => {
                let Some(seen) = starts_seen.get_mut(index) else {
                    tracing::warn!(index, "a postStart hook named a container this pod does not have");
                    continue;
                };
                *seen += 1;
                if *seen == 1 {
                    continue;
                }
                let member = &members[index];
                let port = programs[index].port();
                tracing::warn!(component = %member.component.name, port, "the component's container restarted; running the lifecycle again for its new program");
                ready_tx.send_replace(false);
                serving_tx.send_replace(false);
                let again = async {
                    member.component.attach(port).await?;
                    lifecycle::run_up(std::slice::from_ref(member), &serving_tx).await
                };
                let again = tokio::select! {
                    again = again => again,
                    _ = &mut stop => break,
                };
                match again {
                    Ok(()) => {
                        serving_tx.send_replace(true);
                        ready_tx.send_replace(true);
                        tracing::info!(component = %member.component.name, "the component serves again");
                    }
                    Err(error) => {
                        tracing::error!(%error, "the component's new program did not start");
                        if let Some(control) = control {
                            control.abort();
                        }
                        server.abort();
                        stop_listeners(&probes);
                        for atom in atoms.values() {
                            atom.shutdown().await;
                        }
                        return Err(error.into());
                    }
                }
            }
        }
    }
    tracing::info!("draining: no more calls in, running dispose");
    ready_tx.send_replace(false);
    serving_tx.send_replace(false);
    process.drain().await;
    let running = calls.drain(context.limits.drain).await;
    if running > 0 {
        tracing::warn!(
            running,
            budget_ms = context.limits.drain.as_millis() as u64,
            "calls still run at the end of the drain's budget: dispose runs anyway; calls from the broker are given back to it, for another replica"
        );
    }
    if let Some(control) = control {
        control.abort();
    }
    if let Err(error) = lifecycle::phase(&members, RunCommand::Dispose).await {
        tracing::error!(%error, "dispose failed");
    }
    drained_tx.send_replace(true);
    for atom in atoms.values() {
        atom.shutdown().await;
    }
    stop_programs(programs).await;
    // Let a waiting drain request have its answer, then stop serving. The probe port stays
    // until here: the components' preStop hooks wait on it for the drain.
    let _ = stop_server.send(());
    if tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .is_err()
    {
        tracing::warn!("the local API did not close within 2 s");
    }
    stop_listeners(&probes);
    tracing::info!("stopped");
    Ok(())
}

/// How often each program is checked for an open port.
const ALIVE_EVERY: Duration = Duration::from_millis(500);

/// A watch that is true while every one of `watches` is.
fn all_true(mut watches: Vec<watch::Receiver<bool>>) -> watch::Receiver<bool> {
    let now = |watches: &mut Vec<watch::Receiver<bool>>| {
        watches.iter_mut().all(|w| *w.borrow_and_update())
    };
    let (tx, rx) = watch::channel(now(&mut watches));
    if watches.is_empty() {
        return rx;
    }
    tokio::spawn(async move {
        loop {
            let changes = watches.iter_mut().map(|w| Box::pin(w.changed()));
            let (changed, _, _) = futures::future::select_all(changes).await;
            if changed.is_err() || tx.is_closed() {
                return;
            }
            tx.send_replace(now(&mut watches));
        }
    });
    rx
}

/// The local API's listener. A local run serves on a free port when the address is taken; in a
/// pod a taken port means something else holds it, and the agent refuses to start.
async fn bind_local(
    listen: SocketAddr,
    mode: Mode,
) -> Result<tokio::net::TcpListener, ComposeError> {
    match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => Ok(listener),
        Err(error) if mode == Mode::Local => {
            tracing::warn!(%listen, %error, "the agent's address is taken; serving on a free port instead");
            tokio::net::TcpListener::bind((listen.ip(), 0))
                .await
                .map_err(|e| ComposeError::Setup(e.to_string()))
        }
        Err(error) => Err(ComposeError::Setup(format!("local API {listen}: {error}"))),
    }
}

async fn bind(address: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, ComposeError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| ComposeError::Setup(format!("{what} {address}: {e}")))
}

/// A stop asked for before the composition was complete: what started stops, without `dispose`
/// (nothing ran `ready`), and a waiting drain is answered.
async fn stopped_while_starting<T>(
    drained: &watch::Sender<bool>,
    probes: &Option<tokio::task::JoinHandle<T>>,
    programs: Vec<Program>,
    server: Option<tokio::task::JoinHandle<T>>,
) -> Result<(), ComposeError> {
    tracing::info!("stopped while starting");
    if let Some(server) = server {
        server.abort();
    }
    stop_programs(programs).await;
    drained.send_replace(true);
    // Let the waiting drain requests have their answer.
    tokio::time::sleep(Duration::from_millis(200)).await;
    if let Some(probes) = probes {
        probes.abort();
    }
    Ok(())
}

/// Where the other components' declarations are: the directories beside the given ones (a local
/// run), and the declarations directory (a pod).
fn sources(dirs: &[PathBuf], declarations: Option<PathBuf>) -> Vec<Source> {
    let parents: std::collections::BTreeSet<PathBuf> = dirs
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir).ok()?.parent().map(PathBuf::from))
        .collect();
    parents
        .into_iter()
        .map(Source::Neighbours)
        .chain(declarations.map(Source::Manifests))
        .collect()
}

async fn stop_programs(programs: Vec<Program>) {
    futures::future::join_all(programs.into_iter().map(|p| p.stop(Duration::from_secs(5)))).await;
}

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
