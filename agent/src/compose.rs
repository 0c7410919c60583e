//! `toa-agent compose DIR...`: runs components locally, the way the seeds' `toa compose` does.
//!
//! It reads the context for an environment (`local` by default), starts each component's program,
//! serves the local API, runs the lifecycle (`preflight` → operations served → `settle` → `ready`
//! → "Composition complete"), runs pulses, and on SIGINT/SIGTERM (or `POST /v1/drain`) drains:
//! stops taking calls and pulses, runs `dispose`, leaves the slots membership, stops the programs.
//! Without `atomicity` it coordinates in-process; calls between its components go in-process.

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
    let (trigger, asked) = drain::channel(control.as_ref().map(|(_, token)| token.as_str()));
    let (serving_tx, serving) = watch::channel(false);
    let (ready_tx, ready) = watch::channel(false);
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
    let mut programs: Vec<Program> = Vec::new();
    let mut members = Vec::new();
    let mut failure = None;
    for (component, started) in loaded.iter().zip(futures::future::join_all(starts).await) {
        match started {
            Ok((program, client)) => {
                programs.push(program);
                members.push(Member {
                    component: component.clone(),
                    client,
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

    let callees = members
        .iter()
        .map(|m| {
            (
                m.component.name.clone(),
                Callee {
                    component: m.component.clone(),
                    client: m.client.clone(),
                },
            )
        })
        .collect();
    let calls = Calls::new(
        callees,
        instance.to_string(),
        context.addressed.timeout,
        serving.clone(),
    );
    let calls = match &context.amqp {
        None => Arc::new(calls),
        Some(address) => {
            let connected = async {
                let credentials = Credentials::from_vars(&toa_context::ProcessVars, "TOA_AMQP")
                    .map_err(|e| e.to_string())?;
                let broker = Broker::connect(address, &credentials, &context.name)
                    .await
                    .map_err(|e| e.to_string())?;
                for member in &members {
                    broker
                        .serve(
                            &member.component.name,
                            member.client.clone(),
                            instance.as_str(),
                            serving.clone(),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(broker)
            };
            match connected.await {
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
    let drain::Asked {
        asked: mut drain,
        done: drained_tx,
    } = asked;
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

    let started = async {
        lifecycle::phase(&members, RunCommand::Preflight).await?;
        serving_tx.send_replace(true);
        lifecycle::phase(&members, RunCommand::Settle).await?;
        lifecycle::phase(&members, RunCommand::Ready).await
    };
    if let Err(error) = started.await {
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
    let process = Process::start(members.clone(), calls.clone(), instance.to_string());
    let control = match control {
        Some((listener, token)) => {
            tracing::info!(control = %listener.local_addr().map_err(|e| ComposeError::Setup(e.to_string()))?, "serving the control endpoint");
            let app = crate::control::router(token, process.clone());
            Some(tokio::spawn(axum::serve(listener, app).into_future()))
        }
        None => None,
    };

    // An attached program that goes (its container restarted) ends the agent too: the kubelet
    // restarts it, and the new agent attaches again and runs the lifecycle anew.
    let ports: Vec<u16> = programs
        .iter()
        .filter(|p| p.attached())
        .map(Program::port)
        .collect();
    let gone = async {
        if ports.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(ports.iter().map(|port| Box::pin(stopped_serving(*port))))
            .await
            .0
    };
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut shutdown => {}
        _ = drain.recv() => {}
        port = gone => {
            let component = members
                .iter()
                .zip(&programs)
                .find(|(_, program)| program.port() == port)
                .map(|(member, _)| member.component.name.clone())
                .unwrap_or_default();
            tracing::error!(component, port, "the component's program stopped serving; stopping so that the agent is restarted and runs the lifecycle again");
            ready_tx.send_replace(false);
            serving_tx.send_replace(false);
            if let Some(control) = control {
                control.abort();
            }
            stop_listeners(&probes);
            server.abort();
            for atom in atoms.values() {
                atom.shutdown().await;
            }
            return Err(ComposeError::Setup(format!(
                "component {component}: its program stopped serving 127.0.0.1:{port}"
            )));
        }
    }
    tracing::info!("draining: no more calls in, running dispose");
    ready_tx.send_replace(false);
    serving_tx.send_replace(false);
    process.drain().await;
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

/// Completes once the program serving `port` is gone, even when a new one serves the port again
/// at once (a container restarted by its kubelet within a second). It holds an idle connection to
/// the program: the kernel closes it when the process dies. A program may also close an idle
/// connection itself; then the port still accepts at once, and a fresh connection is held.
async fn stopped_serving(port: u16) -> u16 {
    use tokio::io::AsyncReadExt;
    let mut misses = 0;
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(mut held) => {
                misses = 0;
                let mut byte = [0u8; 1];
                // Nothing is ever sent: the read ends only when the connection does.
                let _ = held.read(&mut byte).await;
                match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    // The program closed an idle connection; it is still there.
                    Ok(_) => continue,
                    Err(_) => return port,
                }
            }
            // Not serving yet again after a restart we missed: give it three seconds.
            Err(_) => {
                misses += 1;
                if misses >= 3 {
                    return port;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
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

/// Completes on SIGINT or SIGTERM.
pub async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
