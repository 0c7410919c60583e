//! The first stage: the components loaded, their atoms made, and every listener bound before
//! any program starts. In a pod the component containers start only once these are bound (the
//! agent's startupProbe asks `/healthz` on the probe port, bound last), so no program can take
//! their ports;
//! the probes answer `/healthz` from here on and the control endpoint answers `starting` (a halt
//! asked for meanwhile is kept for when the lifecycle is done).

use super::servers::{Listening, Servers, CONTROL_CONNECTIONS, PROBE_CONNECTIONS};
use super::{ComposeError, Composition, Control, Options, CONTROL, PROBES};
use crate::api;
use crate::calls::activity::Activity;
use crate::calls::catalog::Source;
use crate::component::Component;
use crate::control::component_tokens::ComponentTokens;
use crate::coordination::atom::{Atom, AtomConfig, Mode, Scope};
use crate::coordination::group::{Group, Place};
use crate::entities::backend::Backend;
use crate::metrics::Metrics;
use crate::process::drain;
use crate::process::node::{self, Node};
use crate::process::supervisor::Process;
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

impl Composition {
    /// The composition, its control and probe servers running, the local API's listener (served
    /// once the calls can be routed), and the drain's receiving end.
    pub(super) async fn prepare(
        options: Options,
    ) -> Result<(Self, Servers, TcpListener, drain::Asked), ComposeError> {
        let (loaded, group) = (load(&options)?, join_group(&options).await?);
        let stores = open_stores(&loaded, &options, group.as_ref()).await?;
        let tokens = Arc::new(component_tokens(&options, &loaded)?);
        let metrics = Metrics::new();
        let atoms = atoms(&options, &loaded, &metrics, group.clone())?;
        let (local, address) = bind_local(options.listen, options.mode).await?;
        let (control, probe) = bind_control_and_probes(options.control, options.probe).await?;
        let activity = Activity::new();
        let process = Process::new(options.instance.to_string(), activity.clone());
        let in_pod = options.mode == Mode::Pod;
        let node = node_of(in_pod)?;
        let (trigger, asked) = drain::channel(options.drain_digest.clone(), in_pod, node.clone());
        let (lifecycle_done, lifecycle_ready) = watch::channel(false);
        let (programs_up, up) = watch::channel(true);
        let ready = super::programs::all_true(vec![lifecycle_ready, up]);
        let listeners = (control, probe, node);
        let servers = serve_control_and_probes(listeners, &process, (&ready, &metrics, &trigger));
        let composition = Self {
            context: options.context,
            instance: options.instance,
            components: options.components,
            loaded,
            attach: options.attach,
            in_pod,
            declarations: options.declarations,
            broker: options.broker,
            on_ready: options.on_ready,
            metrics,
            atoms,
            group,
            activity,
            process,
            address,
            trigger,
            drained: None,
            serving: watch::channel(false).0,
            lifecycle_done,
            programs_up,
            ready,
            local_stop: None,
            programs: Vec::new(),
            members: Vec::new(),
            alive: Vec::new(),
            calls: None,
            tokens,
            stores,
            retrying: Arc::default(),
        };
        Ok((composition, servers, local, asked))
    }
}

/// The control endpoint and the probes, on the listeners bound for them.
fn serve_control_and_probes(
    (control, probe, node): (Option<(TcpListener, Control)>, Option<TcpListener>, Node),
    process: &Arc<Process>,
    (ready, metrics, trigger): (&watch::Receiver<bool>, &Arc<Metrics>, &drain::Trigger),
) -> Servers {
    let mut servers = Servers::default();
    if let Some((listener, control)) = control {
        control.tokens.keep_reading(control.file);
        let app = crate::control::endpoint::router(control.tokens, process.clone());
        servers.serve(CONTROL, Listening::new(listener, CONTROL_CONNECTIONS), app);
    }
    if let Some(listener) = probe {
        let app = probes(ready, metrics, trigger);
        servers.serve(PROBES, probe_listening(listener, node), app);
    }
    servers
}

/// The components' local API tokens: in a pod with `--component-tokens`, in their volumes and
/// asked for; otherwise only given to the programs the agent starts. Written before anything
/// binds: a component container starts once the listeners are.
fn component_tokens(
    options: &Options,
    loaded: &[Arc<Component>],
) -> Result<ComponentTokens, ComposeError> {
    let names: Vec<String> = loaded.iter().map(|c| c.name.clone()).collect();
    match (&options.component_tokens, options.mode) {
        (Some(dir), Mode::Pod) => Ok(ComponentTokens::in_pod(dir, &names)?),
        (None, Mode::Pod) => {
            tracing::warn!(
                "no --component-tokens: any program in the pod may use every component's routes"
            );
            Ok(ComponentTokens::local(&names))
        }
        (_, Mode::Local) => Ok(ComponentTokens::local(&names)),
    }
}

/// `/healthz`, `/readyz`, `/metrics`, and the kubelet's hooks (the drain key is in the path:
/// anything the probes do not serve goes to them).
fn probes(
    ready: &watch::Receiver<bool>,
    metrics: &Arc<Metrics>,
    trigger: &drain::Trigger,
) -> axum::Router {
    api::calls::probes(ready.clone(), metrics.clone())
        .fallback_service(drain::hook_routes(trigger.clone()))
}

/// Every component's manifest, each name once, with its configuration (the context's values and
/// the manifest's defaults, checked: a bad value stops the start, naming it). Not in a pod: its
/// agent starts no program, and the configuration is the Composition's, which the operator
/// checked and gives to the component's container (a required value without a default, or a
/// secret, is not the pod agent's to refuse).
fn load(options: &Options) -> Result<Vec<Arc<Component>>, ComposeError> {
    let (dirs, configuration, mode) = (&options.components, &options.configuration, options.mode);
    let mut loaded = Vec::new();
    for dir in dirs {
        let mut component = Component::load(dir)?;
        if mode == Mode::Local {
            component.configure(configuration.get(&component.name))?;
        }
        loaded.push(Arc::new(component));
    }
    for name in configuration.keys() {
        if !loaded.iter().any(|c| &c.name == name) {
            tracing::info!(
                component = %name,
                "the context configures a component this composition does not run (another composition may)"
            );
        }
    }
    let mut names: Vec<&str> = loaded.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(ComposeError::Setup(format!(
            "component {} is given twice",
            twice[0]
        )));
    }
    Ok(loaded)
}

/// The stores of the components with an entity: PostgreSQL when the context names `storage`,
/// else the local group's (its leader's memory), else this process's memory, which only a process sharing calls with no other may use: over a
/// broker, replicas keeping objects of their own would disagree, so that is refused.
async fn open_stores(
    loaded: &[Arc<Component>],
    options: &Options,
    group: Option<&Arc<Group>>,
) -> Result<HashMap<String, Backend>, ComposeError> {
    let mut stores = HashMap::new();
    for component in loaded.iter().filter(|c| c.manifest.entity.is_some()) {
        if options.storage.is_none() && options.context.amqp.is_some() {
            return Err(ComposeError::Setup(format!(
                "`storage`: component {} declares an entity, and the context names a broker and \
                 no store: replicas would each keep objects of their own; name a PostgreSQL \
                 (`storage: postgres://host:5432/database`)",
                component.name
            )));
        }
        let retention = crate::entities::backend::Retention::of(&options.context.limits);
        if let (None, Some(group)) = (&options.storage, group) {
            let store = Backend::in_group(group.clone(), &component.name, retention);
            stores.insert(component.name.clone(), store);
            continue;
        }
        let store = Backend::open(options.storage.as_ref(), &component.name, retention)
            .await
            .map_err(|error| ComposeError::Setup(format!("{}: {error}", component.name)))?;
        stores.insert(component.name.clone(), store);
    }
    Ok(stores)
}

/// The local group this process joins, if any: joined before anything coordinates, so the first
/// slots view already counts the other processes.
async fn join_group(options: &Options) -> Result<Option<Arc<Group>>, ComposeError> {
    let Some(name) = &options.group else {
        return Ok(None);
    };
    let place = Place::new(name.clone()).map_err(|e| ComposeError::Setup(e.to_string()))?;
    let store = Some(crate::entities::grouped::service());
    let group = Group::join(place, options.instance.as_str(), store)
        .await
        .map_err(|e| ComposeError::Setup(e.to_string()))?;
    if group.leads() {
        tracing::info!(group = %group.name(), "local group: the first process of this application here; another `compose` of it (in another terminal) shares its coordination (--alone opts out)");
    } else {
        tracing::info!(group = %group.name(), "local group: joined the application's first process here: locks, slots, meters and the stash are shared with it (--alone opts out)");
    }
    Ok(Some(Arc::new(group)))
}

/// Each component's coordination (lock, slots, meter), by name.
fn atoms(
    options: &Options,
    loaded: &[Arc<Component>],
    metrics: &Arc<Metrics>,
    group: Option<Arc<Group>>,
) -> Result<HashMap<String, Arc<Atom>>, ComposeError> {
    let mut atoms = HashMap::new();
    for component in loaded {
        let config = AtomConfig {
            scope: Scope::new(options.context.name.clone(), component.name.clone())
                .in_namespace(options.kubernetes_namespace.clone()),
            mode: options.mode,
            atomicity: options.context.atomicity.clone(),
            credentials: options.credentials.clone(),
            roots: options.roots.clone(),
            instance: options.instance.to_string(),
            group: group.clone(),
        };
        let atom =
            Atom::start(config, metrics.clone()).map_err(|e| ComposeError::Setup(e.to_string()))?;
        atoms.insert(component.name.clone(), Arc::new(atom));
    }
    Ok(atoms)
}

/// The probe port's listening: the kubelet's probes and hooks come from the `node`, and are never
/// closed for the cap (the port is open to the whole cluster).
/// In a pod, where the node connects from (the kubelet's hooks); in a local run, nowhere.
fn node_of(in_pod: bool) -> Result<Node, ComposeError> {
    if in_pod {
        node::seen().map_err(ComposeError::Setup)
    } else {
        Ok(Node::default())
    }
}

fn probe_listening(listener: TcpListener, node: Node) -> Listening {
    Listening {
        exempt: node,
        ..Listening::new(listener, PROBE_CONNECTIONS)
    }
}

/// The local API's listener. A local run serves on a free port when the address is taken; in a
/// pod a taken port means something else holds it, and the agent refuses to start.
/// The local API's listener and its address.
async fn bind_local(
    listen: SocketAddr,
    mode: Mode,
) -> Result<(TcpListener, SocketAddr), ComposeError> {
    let listener = match TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(error) if mode == Mode::Local => {
            let listener = TcpListener::bind((listen.ip(), 0))
                .await
                .map_err(|e| ComposeError::Setup(e.to_string()))?;
            if let Ok(serving) = listener.local_addr() {
                // Said with what to do: `call` and `drain` without --agent reach another process
                // (drain would stop that one).
                tracing::warn!(taken = %listen, %error, %serving, "the agent's address is taken (another compose?): this process serves its local API on {serving} instead; `toa-agent call` and `drain` reach it with --agent http://{serving} (without, they reach $TOA_AGENT or http://127.0.0.1:{})", toa_context::control::LOCAL_PORT);
            }
            listener
        }
        Err(error) => {
            let message = format!("{} {listen}: {error}", super::LOCAL_API);
            return Err(ComposeError::Setup(message));
        }
    };
    let address = listener
        .local_addr()
        .map_err(|e| ComposeError::Setup(e.to_string()))?;
    Ok((listener, address))
}

async fn bind(address: SocketAddr, what: &str) -> Result<TcpListener, ComposeError> {
    TcpListener::bind(address)
        .await
        .map_err(|e| ComposeError::Setup(format!("{what} {address}: {e}")))
}

/// The control endpoint's listener with its tokens, then the probes' listener (bound last: the
/// startupProbe asks it), each when asked for.
async fn bind_control_and_probes(
    control: Option<Control>,
    probe: Option<SocketAddr>,
) -> Result<(Option<(TcpListener, Control)>, Option<TcpListener>), ComposeError> {
    let control = match control {
        Some(control) => Some((bind(control.address, CONTROL).await?, control)),
        None => None,
    };
    Ok((control, bind_if(probe, PROBES).await?))
}

/// [`bind`] when there is an address.
async fn bind_if(
    address: Option<SocketAddr>,
    what: &str,
) -> Result<Option<TcpListener>, ComposeError> {
    match address {
        Some(address) => Ok(Some(bind(address, what).await?)),
        None => Ok(None),
    }
}

/// Where the other components' declarations are: the directories beside the given ones (a local
/// run), and the declarations directory (a pod).
pub(super) fn sources(dirs: &[PathBuf], declarations: Option<PathBuf>) -> Vec<Source> {
    let parents: BTreeSet<PathBuf> = dirs
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir).ok()?.parent().map(PathBuf::from))
        .collect();
    parents
        .into_iter()
        .map(Source::Neighbours)
        .chain(declarations.map(Source::Manifests))
        .collect()
}
