//! The suite's kubelet: the control plane has none, so this one runs the composition pods as local
//! processes.
//!
//! It watches the pods labelled `app.kubernetes.io/managed-by=toa-operator` (the pod template's
//! labels) in every namespace. For each new pod it:
//! 1. binds it to the suite's Node (`POST pods/NAME/binding`);
//! 2. gives it an IP of its own on loopback (`127.B.x.y`, B from the suite's process id), and a
//!    directory: its volumes (the ConfigMap's and the Secret's items written as files, as a
//!    kubelet mounts them), and for each component container a copy of "the image",
//!    `operator/tests/fixtures/image`, holding `/components/<component>/`;
//! 3. starts each container's `command` as a process, translated from the pod's view to this
//!    machine's: paths under a mount go to the volume's directory, other absolute paths to the
//!    image copy, `toa-agent` is the binary built from `agent/`; addresses the pod spec gives as
//!    `127.0.0.1:709x` or `0.0.0.0:709x` (the agent's local API, control endpoint and probes) take the
//!    pod's IP, since pods here share the host's network; the attach ports (`--attach 7100`, the
//!    component's `TOA_PORT`), which the agent always dials on 127.0.0.1, move to free ports of the
//!    pod's own. Environment: `value`s, `fieldRef: metadata.name`/`namespace` and
//!    `secretKeyRef`s are resolved; `PYTHONPATH` points at `examples/python`, as the image would ship
//!    toa.py. Init containers are not run: `install-agent` only puts the agent's binary where the
//!    `preStop` hook finds it, and here `toa-agent` is already the built binary;
//! 4. writes the pod's status: `Running`, the pod IP, and `Ready=True` once the readiness probe
//!    (the agent's `/readyz`) answers 200;
//! 5. when the pod is being deleted (a `deletionTimestamp`): runs each container's `preStop` exec
//!    hook (`toa-agent drain`, which returns once `dispose` ran), sends SIGTERM to every process,
//!    waits for them to exit (SIGKILL after the grace period), and removes the pod
//!    (DELETE with grace 0, preconditioned on its UID).
//!
//! Process output goes to `<pod dir>/<container>.log`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::repo;

pub const NODE: &str = "e2e-node";
const SELECTOR: &str = "app.kubernetes.io/managed-by=toa-operator";
/// The first of the ports the suite gives pods for `--attach` (they are the pod's own loopback
/// ports in a cluster).
const ATTACH_FIRST: u16 = 21000;
/// The attach port the pod spec names, from which component *i* serves `+ i`.
const SPEC_ATTACH: u16 = 7100;

/// What the suite knows of a pod it runs.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    /// The process id of each container's process, by container name.
    pub pids: HashMap<String, u32>,
    /// Set once the processes have exited and the pod was removed.
    pub gone: bool,
}

impl PodInfo {
    /// The agent's local API, as the component reaches it (`TOA_AGENT`).
    pub fn local_api(&self) -> String {
        format!("http://{}:7090", self.ip)
    }

    /// The lifecycle commands the pod's component ran (the fixture's `lifecycle.jsonl`).
    pub fn lifecycle(&self, component: &str) -> Vec<String> {
        let path = self
            .dir
            .join("rootfs/component-0/components")
            .join(component)
            .join("lifecycle.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter_map(|event| event["event"].as_str().map(str::to_owned))
            .collect()
    }
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodInfo>,
    /// Per pod UID: set to `true` when the pod is being deleted.
    deleting: HashMap<String, watch::Sender<bool>>,
    next_ip: u32,
    next_attach: u16,
    /// The suite is over: pods' tasks stop without a word.
    stopped: bool,
}

pub struct Kubelet {
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

struct Shared {
    client: Client,
    root: PathBuf,
    agent: PathBuf,
    state: Arc<Mutex<State>>,
}

impl Kubelet {
    /// Creates the Node and starts watching pods; `root` holds the pods' directories.
    pub async fn start(client: Client, root: &Path, agent: PathBuf) -> Self {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": NODE, "labels": { "e2e": "true" } }
        }))
        .unwrap();
        Api::<Node>::all(client.clone())
            .patch(
                NODE,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&node),
            )
            .await
            .expect("the Node is created");
        std::fs::create_dir_all(root).unwrap();
        let state = Arc::new(Mutex::new(State {
            next_ip: 2,
            next_attach: ATTACH_FIRST,
            ..State::default()
        }));
        let shared = Arc::new(Shared {
            client: client.clone(),
            root: root.to_path_buf(),
            agent,
            state: state.clone(),
        });
        let pods = Api::<Pod>::all(client);
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default().labels(SELECTOR))
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        seen(&shared, pod)
                    }
                    Ok(watcher::Event::Delete(pod)) => {
                        // Removed without our DELETE (grace 0 by someone, or never bound): stop.
                        if let Some(sender) = shared
                            .state
                            .lock()
                            .unwrap()
                            .deleting
                            .get(&pod.uid().unwrap_or_default())
                        {
                            let _ = sender.send(true);
                        }
                    }
                    Ok(_) => {}
                    Err(error) => eprintln!("kubelet: watch error: {error}"),
                }
            }
        });
        Self { state, task }
    }

    /// The pods the suite runs (or ran) in `namespace` whose name starts with `prefix`.
    pub fn pods(&self, namespace: &str, prefix: &str) -> Vec<PodInfo> {
        let state = self.state.lock().unwrap();
        let mut pods: Vec<PodInfo> = state
            .pods
            .values()
            .filter(|pod| pod.namespace == namespace && pod.name.starts_with(prefix))
            .cloned()
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        pods
    }

    pub fn pod(&self, uid: &str) -> Option<PodInfo> {
        self.state.lock().unwrap().pods.get(uid).cloned()
    }

    /// Stops watching and stops every pod's processes (SIGKILL; the suite is over).
    pub fn shutdown(&self) {
        self.task.abort();
        let mut state = self.state.lock().unwrap();
        state.stopped = true;
        for pod in state.pods.values().filter(|pod| !pod.gone) {
            for pid in pod.pids.values() {
                signal(*pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: a signal to a process this suite started.
    unsafe { libc::kill(pid as i32, signal) };
}

/// A pod event: start the pod when new, tell its task when it is being deleted.
fn seen(shared: &Arc<Shared>, pod: Pod) {
    let uid = pod.uid().unwrap_or_default();
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let mut state = shared.state.lock().unwrap();
    if let Some(sender) = state.deleting.get(&uid) {
        if deleting {
            let _ = sender.send(true);
        }
        return;
    }
    if deleting {
        // Never started here: nothing to stop, only the object to remove.
        drop(state);
        let client = shared.client.clone();
        tokio::spawn(async move { remove(&client, &pod).await });
        return;
    }
    let (sender, receiver) = watch::channel(false);
    state.deleting.insert(uid, sender);
    drop(state);
    let shared = shared.clone();
    tokio::spawn(async move {
        let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        if let Err(error) = run_pod(&shared, pod, receiver).await {
            eprintln!("kubelet: pod {name}: {error}");
        }
    });
}

async fn remove(client: &Client, pod: &Pod) {
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(error) = api.delete(&pod.name_any(), &params).await {
        if !matches!(&error, kube::Error::Api(status) if status.code == 404 || status.code == 409) {
            eprintln!("kubelet: cannot remove pod {}: {error}", pod.name_any());
        }
    }
}

/// How a path, address or port in the pod spec reads on this machine, for one container.
struct View {
    ip: Ipv4Addr,
    attach: u16,
    /// (mount path, directory), longest mount path first.
    mounts: Vec<(String, PathBuf)>,
    /// The image's copy for this container.
    rootfs: PathBuf,
    agent: PathBuf,
}

impl View {
    fn path(&self, path: &str) -> PathBuf {
        for (mount, dir) in &self.mounts {
            if let Some(rest) = path.strip_prefix(mount.as_str()) {
                if rest.is_empty() || rest.starts_with('/') {
                    return dir.join(rest.trim_start_matches('/'));
                }
            }
        }
        self.rootfs.join(path.trim_start_matches('/'))
    }

    fn program(&self, program: &str) -> PathBuf {
        if program == "toa-agent" || program.ends_with("/toa-agent") {
            self.agent.clone()
        } else if program.starts_with('/') {
            self.path(program)
        } else {
            // Found on PATH, as in the image.
            PathBuf::from(program)
        }
    }

    /// An argument or a variable's value: the agent's addresses take the pod's IP, absolute
    /// paths under a mount or in the image are translated.
    fn value(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for port in 7090..7100 {
            for host in ["127.0.0.1", "0.0.0.0"] {
                text = text.replace(&format!("{host}:{port}"), &format!("{}:{port}", self.ip));
            }
        }
        if text.starts_with('/') {
            return self.path(&text).display().to_string();
        }
        text
    }

    fn attach_port(&self, text: &str) -> String {
        match text.parse::<u16>() {
            Ok(port) if (SPEC_ATTACH..SPEC_ATTACH + 100).contains(&port) => {
                (self.attach + (port - SPEC_ATTACH)).to_string()
            }
            _ => text.to_owned(),
        }
    }

    /// A container's `command` + `args`, translated.
    fn command(&self, container: &Container) -> Vec<String> {
        let mut words: Vec<String> = container.command.iter().flatten().cloned().collect();
        words.extend(container.args.iter().flatten().cloned());
        let mut out = Vec::new();
        let mut attach_next = false;
        for (index, word) in words.iter().enumerate() {
            if index == 0 {
                out.push(self.program(word).display().to_string());
            } else if attach_next {
                out.push(self.attach_port(word));
            } else if let Some(port) = word.strip_prefix("--attach=") {
                out.push(format!("--attach={}", self.attach_port(port)));
            } else {
                out.push(self.value(word));
            }
            attach_next = word == "--attach";
        }
        out
    }
}

struct Running {
    name: String,
    child: Child,
}

async fn run_pod(
    shared: &Shared,
    pod: Pod,
    mut deleting: watch::Receiver<bool>,
) -> Result<(), String> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let api = Api::<Pod>::namespaced(shared.client.clone(), &namespace);
    let spec = pod.spec.clone().ok_or("no spec")?;

    // 1. Bind.
    if spec.node_name.is_none() {
        let binding = serde_json::json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": { "name": name, "uid": uid },
            "target": { "apiVersion": "v1", "kind": "Node", "name": NODE }
        });
        let bound: Result<serde_json::Value, _> = api
            .create_subresource("binding", &name, &PostParams::default(), &binding)
            .await;
        if let Err(error) = bound {
            // Gone or taken meanwhile: nothing to run.
            return Err(format!("binding: {error}"));
        }
    }

    // 2. An IP, ports and a directory.
    let (ip, attach) = {
        let mut state = shared.state.lock().unwrap();
        let n = state.next_ip;
        state.next_ip += 1;
        let components = spec.containers.len() as u16;
        let mut attach = state.next_attach;
        while !(attach..attach + components)
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        {
            attach += components;
        }
        state.next_attach = attach + components;
        // 127.B.x.y with B from the process id, so that processes a killed run left behind
        // (holding 127.0.0.2:7091, say) do not take a new run's addresses.
        let b = 10 + (std::process::id() % 200) as u8;
        (
            Ipv4Addr::new(127, b, (n / 250) as u8, (n % 250 + 2) as u8),
            attach,
        )
    };
    let dir = shared.root.join(format!("{namespace}.{name}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    shared.state.lock().unwrap().pods.insert(
        uid.clone(),
        PodInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: uid.clone(),
            ip,
            dir: dir.clone(),
            pids: HashMap::new(),
            gone: false,
        },
    );

    // Volumes: their sources may appear a little after the pod (a kubelet retries).
    let volumes = loop {
        match volumes(shared, &namespace, &spec, &dir).await {
            Ok(volumes) => break volumes,
            Err(error) => {
                if *deleting.borrow() {
                    remove(&shared.client, &pod).await;
                    return Err(format!("deleted before its volumes were there: {error}"));
                }
                eprintln!("kubelet: pod {name}: {error}; trying again");
                tokio::select! {
                    _ = deleting.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    };

    // 3. Start the containers.
    let secrets = Api::<Secret>::namespaced(shared.client.clone(), &namespace);
    let mut running = Vec::new();
    let mut views = Vec::new();
    for container in &spec.containers {
        // The agent's image holds nothing the suite needs but the binary; every other image is
        // the fixture's.
        let rootfs = dir.join("rootfs").join(&container.name);
        let agent_image = container
            .image
            .as_deref()
            .is_some_and(|image| image.contains("toa-agent"));
        if agent_image {
            std::fs::create_dir_all(&rootfs).map_err(|e| e.to_string())?;
        } else {
            copy_dir(&repo().join("operator/tests/fixtures/image"), &rootfs)
                .map_err(|e| format!("copying the image: {e}"))?;
        }
        let mounts = {
            let mut mounts: Vec<(String, PathBuf)> = container
                .volume_mounts
                .iter()
                .flatten()
                .filter_map(|mount| {
                    Some((mount.mount_path.clone(), volumes.get(&mount.name)?.clone()))
                })
                .collect();
            mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
            mounts
        };
        let view = View {
            ip,
            attach,
            mounts,
            rootfs: rootfs.clone(),
            agent: shared.agent.clone(),
        };
        let env = environment(container, &view, &pod, &secrets).await?;
        let words = view.command(container);
        let cwd = match &container.working_dir {
            Some(dir) => view.path(dir),
            None => rootfs.clone(),
        };
        let log = std::fs::File::create(dir.join(format!("{}.log", container.name)))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&words[0])
            .args(&words[1..])
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PYTHONPATH", repo().join("examples/python"))
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {words:?} in {}: {e}", cwd.display()))?;
        if let Some(pid) = child.id() {
            if let Some(info) = shared.state.lock().unwrap().pods.get_mut(&uid) {
                info.pids.insert(container.name.clone(), pid);
            }
        }
        running.push(Running {
            name: container.name.clone(),
            child,
        });
        views.push((container.clone(), view, env));
    }

    // 4. Status: running; ready once the readiness probe answers.
    let probe = spec.containers.iter().find_map(|c| {
        let get = c.readiness_probe.as_ref()?.http_get.as_ref()?;
        let port = match &get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port) => *port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(_) => return None,
        };
        Some(format!(
            "http://{ip}:{port}{}",
            get.path.clone().unwrap_or_default()
        ))
    });
    let started = k8s_openapi::jiff::Timestamp::now();
    write_status(&api, &name, ip, started, false).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut ready = false;
    let mut exited = false;
    while !*deleting.borrow() {
        if shared.state.lock().unwrap().stopped {
            return Ok(());
        }
        if !ready {
            let answered = match &probe {
                Some(url) => http
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success()),
                None => true,
            };
            if answered {
                ready = true;
                write_status(&api, &name, ip, started, true).await;
            }
        }
        if !exited && !shared.state.lock().unwrap().stopped {
            for process in &mut running {
                if let Ok(Some(status)) = process.child.try_wait() {
                    eprintln!(
                        "kubelet: pod {namespace}/{name}: container {} exited on its own: {status} (see {})",
                        process.name,
                        dir.join(format!("{}.log", process.name)).display()
                    );
                    exited = true;
                }
            }
            if exited && ready {
                ready = false;
                write_status(&api, &name, ip, started, false).await;
            }
        }
        tokio::select! {
            _ = deleting.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }

    // 5. Stop: preStop hooks, SIGTERM, wait, remove.
    let grace =
        Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(1) as u64);
    let deadline = Instant::now() + grace;
    let hooks = views.iter().filter_map(|(container, view, env)| {
        let command = container
            .lifecycle
            .as_ref()?
            .pre_stop
            .as_ref()?
            .exec
            .as_ref()?
            .command
            .clone()?;
        let words: Vec<String> = command
            .iter()
            .enumerate()
            .map(|(i, word)| {
                if i == 0 {
                    view.program(word).display().to_string()
                } else {
                    view.value(word)
                }
            })
            .collect();
        let name = container.name.clone();
        let env = env.clone();
        let dir = dir.clone();
        Some(async move {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{name}.prestop.log")))
                .ok()?;
            let mut child = Command::new(&words[0])
                .args(&words[1..])
                .env_clear()
                .envs(env)
                .stdout(log.try_clone().ok()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .ok()?;
            match tokio::time::timeout_at(deadline.into(), child.wait()).await {
                Ok(status) => {
                    let status = status.ok()?;
                    if !status.success() {
                        eprintln!("kubelet: {name}'s preStop hook {words:?} exited {status}");
                    }
                }
                Err(_) => eprintln!(
                    "kubelet: {name}'s preStop hook did not return within the grace period"
                ),
            }
            Some(())
        })
    });
    futures::future::join_all(hooks).await;
    for process in &running {
        if let Some(pid) = process.child.id() {
            signal(pid, libc::SIGTERM);
        }
    }
    for process in &mut running {
        if tokio::time::timeout_at(deadline.into(), process.child.wait())
            .await
            .is_err()
        {
            eprintln!(
                "kubelet: pod {namespace}/{name}: {} did not stop within the grace period; killed",
                process.name
            );
            let _ = process.child.kill().await;
        }
    }
    remove(&shared.client, &pod).await;
    let mut state = shared.state.lock().unwrap();
    if let Some(info) = state.pods.get_mut(&uid) {
        info.gone = true;
    }
    Ok(())
}

async fn write_status(
    api: &Api<Pod>,
    name: &str,
    ip: Ipv4Addr,
    started: k8s_openapi::jiff::Timestamp,
    ready: bool,
) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = if ready { "True" } else { "False" };
    let patch = serde_json::json!({
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip.to_string(),
            "podIPs": [{ "ip": ip.to_string() }],
            "startTime": started.to_string(),
            "conditions": [
                { "type": "PodScheduled", "status": "True", "lastTransitionTime": started.to_string() },
                { "type": "Initialized", "status": "True", "lastTransitionTime": started.to_string() },
                { "type": "ContainersReady", "status": ready, "lastTransitionTime": now },
                { "type": "Ready", "status": ready, "lastTransitionTime": now },
            ],
        }
    });
    if let Err(error) = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        eprintln!("kubelet: pod {name}: cannot write its status: {error}");
    }
}

/// A file of a volume: its path in the volume, its content, its mode.
type File = (String, Vec<u8>, Option<i32>);

/// Writes the pod's volumes under `dir/volumes/<name>`: ConfigMap and Secret items (all keys
/// when no items are listed), empty directories otherwise.
async fn volumes(
    shared: &Shared,
    namespace: &str,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    dir: &Path,
) -> Result<HashMap<String, PathBuf>, String> {
    let mut out = HashMap::new();
    for volume in spec.volumes.iter().flatten() {
        let target = dir.join("volumes").join(&volume.name);
        std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
        let mut files: Vec<File> = Vec::new();
        let select = |data: HashMap<String, Vec<u8>>,
                      items: &Option<Vec<k8s_openapi::api::core::v1::KeyToPath>>,
                      optional: bool,
                      what: &str|
         -> Result<Vec<File>, String> {
            match items {
                None => Ok(data.into_iter().map(|(k, v)| (k, v, None)).collect()),
                Some(items) => items
                    .iter()
                    .filter_map(|item| match data.get(&item.key) {
                        Some(bytes) => Some(Ok((item.path.clone(), bytes.clone(), item.mode))),
                        None if optional => None,
                        None => Some(Err(format!("{what} has no key {}", item.key))),
                    })
                    .collect(),
            }
        };
        let mut mode = None;
        if let Some(source) = &volume.config_map {
            let api = Api::<ConfigMap>::namespaced(shared.client.clone(), namespace);
            let map = api
                .get(&source.name)
                .await
                .map_err(|e| format!("ConfigMap {}: {e}", source.name))?;
            let data = map
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            files = select(
                data,
                &source.items,
                source.optional.unwrap_or(false),
                &source.name,
            )?;
            mode = source.default_mode;
        } else if let Some(source) = &volume.secret {
            let secret_name = source.secret_name.clone().unwrap_or_default();
            let api = Api::<Secret>::namespaced(shared.client.clone(), namespace);
            let secret = api
                .get(&secret_name)
                .await
                .map_err(|e| format!("Secret {secret_name}: {e}"))?;
            let data = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            files = select(
                data,
                &source.items,
                source.optional.unwrap_or(false),
                &secret_name,
            )?;
            mode = source.default_mode;
        }
        for (path, bytes, item_mode) in files {
            let file = target.join(&path);
            std::fs::create_dir_all(file.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::write(&file, bytes).map_err(|e| e.to_string())?;
            if let Some(mode) = item_mode.or(mode) {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode as u32))
                    .map_err(|e| e.to_string())?;
            }
        }
        out.insert(volume.name.clone(), target);
    }
    Ok(out)
}

/// A container's environment: values, the pod's name and namespace, Secret keys.
async fn environment(
    container: &Container,
    view: &View,
    pod: &Pod,
    secrets: &Api<Secret>,
) -> Result<Vec<(String, String)>, String> {
    let mut env = Vec::new();
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            Some(view.value(value))
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                match field.field_path.as_str() {
                    "metadata.name" => Some(pod.name_any()),
                    "metadata.namespace" => pod.namespace(),
                    other => return Err(format!("fieldRef {other} is not supported here")),
                }
            } else if let Some(key) = &from.secret_key_ref {
                let optional = key.optional.unwrap_or(false);
                match secrets
                    .get_opt(&key.name)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    Some(secret) => match secret.data.unwrap_or_default().remove(&key.key) {
                        Some(bytes) => Some(String::from_utf8_lossy(&bytes.0).into_owned()),
                        None if optional => None,
                        None => return Err(format!("Secret {} has no {}", key.name, key.key)),
                    },
                    None if optional => None,
                    None => return Err(format!("Secret {} is missing", key.name)),
                }
            } else {
                return Err(format!("{}: valueFrom not supported here", var.name));
            }
        } else {
            Some(String::new())
        };
        if let Some(mut value) = value {
            if var.name == "TOA_PORT" {
                value = view.attach_port(&value);
            }
            env.push((var.name.clone(), value));
        }
    }
    Ok(env)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
