//! The suite's node: a real kubelet with containerd and runc (`scripts/node`), joined to the
//! control plane, running the pods the operator's Deployments make from images built from this
//! workspace's binaries (`scripts/images`). Pods get IPs on the node's bridge (10.244.0.0/24,
//! this machine only); the suite reaches their probe and control ports there.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::repo;

/// The node's address on its bridge: pods reach the host there.
pub const BRIDGE_IP: &str = "10.244.0.1";

pub struct Node {
    dir: PathBuf,
    release: &'static str,
}

impl Node {
    /// Starts a node of `release` (its kubelet and kube-scheduler) with its state in `dir`
    /// (short: the containerd socket lives there) and waits until it is Ready; panics (never
    /// skips) when it cannot.
    pub fn start(dir: &Path, kubeconfig: &Path, release: &'static str) -> Self {
        let _ = std::fs::remove_dir_all(dir);
        let output = Command::new(repo().join("scripts/node"))
            .arg("start")
            .arg(dir)
            .arg(kubeconfig)
            .env("TOA_K8S_VERSION", release)
            .output()
            .expect("scripts/node runs");
        let node = Self {
            dir: dir.to_path_buf(),
            release,
        };
        assert!(
            output.status.success(),
            "the {release} node did not start (TOA_K8S_VERSION={release} scripts/node start {} …; \
             build it with scripts/node build):\n{}\n{}",
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        node
    }

    /// Builds the project's images from `agent`, `operator` and `terminals` and imports them;
    /// the recorder reports to `harness`.
    pub fn import_images(&self, agent: &Path, operator: &Path, terminals: &Path, harness: &str) {
        let output = Command::new(repo().join("scripts/images"))
            .arg("import")
            .arg(&self.dir)
            .arg(harness)
            .env("TOA_K8S_VERSION", self.release)
            .env("TOA_AGENT_BIN", agent)
            .env("TOA_OPERATOR_BIN", operator)
            .env("TOA_TERMINALS_BIN", terminals)
            .output()
            .expect("scripts/images runs");
        assert!(
            output.status.success(),
            "scripts/images import failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `ctr -n k8s.io ARGS…` in the node's namespaces.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        crate::cluster::stdout_of(
            Command::new(repo().join("scripts/node"))
                .arg("ctr")
                .arg(&self.dir)
                .args(args)
                .env("TOA_K8S_VERSION", self.release),
        )
    }

    /// Freezes every process of a container (the cgroup freezer): it stops answering, its
    /// connections stay open, as a lost node's would.
    ///
    /// runc gives up with `unable to freeze` when the cgroup does not settle as FROZEN within its
    /// own retries (a process of the container forking or in the kernel meanwhile, seen on the
    /// rig's cgroup v1): the container is thawed and frozen again, a bounded number of times.
    pub fn freeze(&self, container: &str) {
        let mut last = String::new();
        for _ in 0..10 {
            match self.ctr(&["tasks", "pause", container]) {
                Ok(_) => return,
                Err(error) if error.contains("unable to freeze") => {
                    last = error;
                    self.thaw(container);
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(error) => panic!("{error}"),
            }
        }
        panic!("the container did not freeze in 10 attempts: {last}");
    }

    pub fn thaw(&self, container: &str) {
        let _ = self.ctr(&["tasks", "resume", container]);
    }

    /// Where the kubelet and containerd log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/node"))
            .arg("stop")
            .arg(&self.dir)
            .env("TOA_K8S_VERSION", self.release)
            .status();
    }
}

/// A pod as the API server reports it.
#[derive(Debug, Clone)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub ip: IpAddr,
    /// Each container's (runtime id without the `containerd://` scheme, restart count).
    pub containers: BTreeMap<String, (String, i32)>,
    pub pod: Pod,
}

impl PodView {
    pub fn of(pod: &Pod) -> Option<Self> {
        let status = pod.status.as_ref()?;
        let ip = status.pod_ip.as_ref()?.parse().ok()?;
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .map(|c| {
                let id = c
                    .container_id
                    .clone()
                    .unwrap_or_default()
                    .trim_start_matches("containerd://")
                    .to_owned();
                (c.name.clone(), (id, c.restart_count))
            })
            .collect();
        Some(Self {
            name: pod.name_any(),
            uid: pod.uid()?,
            ip,
            containers,
            pod: pod.clone(),
        })
    }

    /// The agent container's runtime id.
    pub fn agent_container(&self) -> String {
        self.containers["agent"].0.clone()
    }

    pub fn restarts(&self) -> BTreeMap<String, i32> {
        self.containers
            .iter()
            .map(|(name, (_, restarts))| (name.clone(), *restarts))
            .collect()
    }
}

/// The composition's pods, as listed now.
pub async fn pods(admin: &Client, namespace: &str, composition: &str) -> Result<Vec<Pod>, String> {
    Api::<Pod>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default().labels(&format!("toa.io/composition={composition}")))
        .await
        .map(|list| list.items)
        .map_err(|e| e.to_string())
}
