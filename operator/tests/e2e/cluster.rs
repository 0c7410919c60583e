//! The control plane (`scripts/control-plane`) of one Kubernetes release, the chart installed on
//! it, and the clients.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::chart::Chart;
use crate::wait::eventually;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// A binary of this workspace, built now when missing or stale (a test of this package cannot
/// name another package's binary).
pub fn workspace_binary(package: &str, binary: &str) -> PathBuf {
    let operator = PathBuf::from(env!("CARGO_BIN_EXE_toa-operator"));
    let profile_dir = operator.parent().unwrap();
    let target = profile_dir.parent().unwrap();
    let mut command = Command::new(env!("CARGO"));
    // Without cargo's variables for this test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`): ring's build
    // script watches `CARGO_MANIFEST_DIR`, so a nested build that saw it reran it and rebuilt
    // everything above ring, and so did the next top-level build (1–2 min of every CI run).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR" {
            command.env_remove(key.as_ref());
        }
    }
    command
        .current_dir(repo())
        .args(["build", "--quiet", "-p", package, "--bin", binary])
        .env("CARGO_TARGET_DIR", target);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            command.arg("--release");
        }
        Some(other) => {
            command.args(["--profile", other]);
        }
        None => {}
    }
    let status = command.status().expect("cargo runs");
    assert!(status.success(), "cargo build -p {package} failed");
    profile_dir.join(binary)
}

/// What a command prints, or what it said on failing.
pub fn stdout_of(command: &mut Command) -> Result<String, String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// A free port on 127.0.0.1 followed by `count - 1` free ones, from `range`.
pub fn free_ports(range: std::ops::Range<u16>, count: u16) -> u16 {
    // A port the suite binds again later (an operator restarted, a control plane's four) must
    // not be one the kernel hands out to outgoing connections meanwhile: stop 34's CI lost a
    // restarted operator's port 38900 that way.
    assert!(
        range.end <= EPHEMERAL_START,
        "{range:?} overlaps the kernel's ephemeral ports (from {EPHEMERAL_START})"
    );
    // Free now is not enough: two scenarios starting at once could both pick a port before
    // either binds it (CI saw two RabbitMQ nodes of one run take the same distribution port).
    // A port handed out once in this run is never handed out again.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().expect("ports given");
    for _ in 0..200 {
        let base = range.start + rand_below(range.end - range.start - count);
        let ports = base..base + count;
        if ports.clone().all(|port| !given.contains(&port))
            && ports
                .clone()
                .all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        {
            given.extend(ports);
            return base;
        }
    }
    panic!("no {count} free ports in a row in {range:?}");
}

/// Where a control plane's ports and an operator's `/metrics` are picked: apart, and below the
/// ephemeral ports (and below NodePorts, 30000-32767).
pub const CONTROL_PLANE_PORTS: std::ops::Range<u16> = 21000..29000;
pub const METRICS_PORTS: std::ops::Range<u16> = 12000..20000;
/// Where the suite's RabbitMQ nodes take their Erlang distribution ports.
pub const DIST_PORTS: std::ops::Range<u16> = 20000..21000;
/// Where Linux's default `ip_local_port_range` starts.
const EPHEMERAL_START: u16 = 32768;

fn rand_below(bound: u16) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    ((nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % u32::from(bound)) as u16
}

/// The newest release the project supports: every scenario runs on it.
pub const NEWEST: &str = "v1.37.2";
/// The oldest: the CRD, the CEL refusal, a deploy and a halt run on it.
pub const FLOOR: &str = "v1.33.13";

/// Where `scripts/control-plane build` put a release's binaries.
pub fn release_dir(release: &str) -> PathBuf {
    let cache = std::env::var_os("TOA_K8S_CACHE").unwrap_or_else(|| "/var/cache/toa-k8s".into());
    PathBuf::from(cache).join(release)
}

/// A control plane started by `scripts/control-plane start`, stopped on drop.
pub struct ControlPlane {
    dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub port: u16,
    /// The release, as `TOA_K8S_VERSION` names it (`v1.37.2`).
    pub release: &'static str,
}

impl ControlPlane {
    /// Starts one of `release` with its state in `dir`; panics (never skips) when it cannot.
    pub fn start(dir: &Path, release: &'static str) -> Self {
        let port = free_ports(CONTROL_PLANE_PORTS, 4);
        let mut plane = Self {
            dir: dir.to_path_buf(),
            kubeconfig: PathBuf::new(),
            port,
            release,
        };
        let output = Command::new(repo().join("scripts/control-plane"))
            .arg("start")
            .arg(dir)
            .arg(port.to_string())
            .env("TOA_K8S_VERSION", release)
            .output()
            .expect("scripts/control-plane runs");
        if !output.status.success() {
            let log = std::fs::read_to_string(dir.join("apiserver.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "the {release} control plane did not start (TOA_K8S_VERSION={release} \
                 scripts/control-plane start {} {port}; build it with scripts/control-plane \
                 build):\n{}\n{}\napiserver.log, last lines:\n{}",
                dir.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        plane.kubeconfig =
            PathBuf::from(stdout.lines().last().expect("the kubeconfig path").trim());
        plane
    }
}

/// What a kubectl run said.
#[derive(Debug)]
pub struct Kubectl {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `kubectl ARGS…` of `release` (the one built beside that server, never one from PATH) with
/// `kubeconfig`, `stdin` written to it.
pub fn kubectl(release: &str, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Kubectl {
    use std::io::Write;
    let binary = release_dir(release).join("kubectl");
    let mut child = Command::new(&binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} (scripts/control-plane build): {e}", binary.display()));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let output = child.wait_with_output().unwrap();
    Kubectl {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/control-plane"))
            .arg("stop")
            .arg(&self.dir)
            .env("TOA_K8S_VERSION", self.release)
            .status();
    }
}

/// A client from a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("a kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client configuration");
    Client::try_from(config).expect("a client")
}

/// Creates (applies) a namespace where Pod Security admission enforces nothing: only for the
/// image scenario's host-network Deployment, which the restricted level refuses.
pub async fn privileged_namespace(client: &Client, name: &str) {
    let labels = serde_json::json!({
        "pod-security.kubernetes.io/enforce": "privileged",
    });
    namespace_labelled(client, name, labels).await;
}

/// A namespace where Pod Security admission enforces the restricted level (the suite's default:
/// a pod the operator generates that breaks a rule of the profile is refused).
pub async fn restricted_namespace(client: &Client, name: &str) {
    let labels = serde_json::json!({
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    });
    namespace_labelled(client, name, labels).await;
}

async fn namespace_labelled(client: &Client, name: &str, labels: serde_json::Value) {
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name, "labels": labels }
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&namespace),
        )
        .await
        .unwrap_or_else(|error| panic!("namespace {name}: {error}"));
}

/// A kubeconfig for the chart's ServiceAccount: a token from the TokenRequest API (no token
/// Secrets since 1.24), valid for a day, longer than any run of the suite.
pub async fn service_account_kubeconfig(
    admin: &Client,
    api_port: u16,
    chart: &Chart,
    path: &Path,
) -> PathBuf {
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &chart.namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(86_400),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = eventually(
        "a token for the chart's ServiceAccount",
        Duration::from_secs(60),
        || {
            let accounts = accounts.clone();
            let (name, request) = (chart.service_account.clone(), request.clone());
            async move {
                let issued = accounts
                    .create_token_request(&name, &Default::default(), &request)
                    .await
                    .map_err(|e| e.to_string())?;
                issued
                    .status
                    .map(|status| status.token)
                    .ok_or("no token in the answer".to_owned())
            }
        },
    )
    .await;
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}\n\
         users:\n- name: operator\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: local\n  context: {{cluster: local, user: operator, namespace: {namespace}}}\n\
         current-context: local\n",
        port = api_port,
        namespace = chart.namespace,
    );
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}
