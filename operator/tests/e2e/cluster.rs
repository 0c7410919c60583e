//! The control plane (`scripts/control-plane`) of one Kubernetes release, the chart installed on
//! it, and the clients.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
    for _ in 0..200 {
        let base = range.start + rand_below(range.end - range.start - count);
        if (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return base;
        }
    }
    panic!("no {count} free ports in a row in {range:?}");
}

/// Where a control plane's ports and an operator's `/metrics` are picked: apart, and below the
/// ephemeral ports (and below NodePorts, 30000-32767).
pub const CONTROL_PLANE_PORTS: std::ops::Range<u16> = 21000..29000;
pub const METRICS_PORTS: std::ops::Range<u16> = 12000..20000;
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

/// What the chart installed and how its Deployment runs the operator.
pub struct Chart {
    pub namespace: String,
    pub service_account: String,
    /// The operator container's `args` and `env` values (without `valueFrom` ones).
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub metrics_port: u16,
    /// The chart's Deployment, as rendered.
    pub deployment: Deployment,
}

/// Installs charts/toa-operator with `helm install` (scripts/helm, the real command) as release
/// `toa`: the CRD, the ServiceAccount, RBAC, the Service and the Deployment, with no error and
/// nothing on standard error (no warning). The Deployment has no replicas (pods cannot reach
/// the API server on loopback): the suite runs the operator binary with that Deployment's
/// arguments instead, under the ServiceAccount's identity; the image scenario runs it with host
/// networking.
pub async fn install_chart(admin: &Client, kubeconfig: &Path, namespace: &str) -> Chart {
    // The image scenario runs the chart's Deployment here with host networking.
    privileged_namespace(admin, namespace).await;
    install_release(admin, kubeconfig, namespace, "toa", &[]).await
}

/// [`install_chart`] as release `release`, with `sets` (`KEY=JSON`) beside the suite's own values,
/// into `namespace`, which must exist. The returned [`Chart`] holds the Deployment as the release
/// installed it (`helm get manifest`).
/// A klog line at info level: `I` and the date as `MMDD`, then a space.
fn klog_info(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 5
        && bytes[0] == b'I'
        && bytes[1..5].iter().all(u8::is_ascii_digit)
        && bytes[5] == b' '
}

pub async fn install_release(
    admin: &Client,
    kubeconfig: &Path,
    namespace: &str,
    release: &str,
    sets: &[&str],
) -> Chart {
    let metrics_port = free_ports(METRICS_PORTS, 1);
    let metrics = format!("metrics.port={metrics_port}");
    let values: Vec<&str> = sets
        .iter()
        .copied()
        .chain([
            metrics.as_str(),
            "replicas=0",
            // The admission policy has its own test on a real API server
            // (charts/test_admission.py); here it would refuse what the suite needs the API server
            // to take: addresses on the node's bridge IPs, and one with credentials, which the
            // operator must refuse itself.
            "admissionPolicy.enabled=false",
            // The images scripts/images built and imported into the node.
            "image.repository=\"localhost/toa/operator\"",
            "image.tag=\"e2e\"",
            "agentImage.repository=\"localhost/toa/agent\"",
            "agentImage.tag=\"e2e\"",
        ])
        .collect();
    let installed = Command::new(repo().join("scripts/helm"))
        .args(["install", release])
        .arg(repo().join("charts/toa-operator"))
        .args(["--namespace", namespace])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(values.iter().flat_map(|set| ["--set-json", set]))
        .output()
        .expect("scripts/helm runs");
    let stderr = String::from_utf8_lossy(&installed.stderr);
    // Helm's client-go logs its own watches at info level (klog's `I1203 …` lines, as when a
    // watch of the CRD ends while Helm stops waiting): those are not the API server's warnings,
    // which come as `Warning:` or klog `W` lines, and fail the install here.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| !klog_info(line) && !line.trim().is_empty())
        .collect();
    assert!(
        installed.status.success() && said.is_empty(),
        "helm install {release} (scripts/helm): {}\n{stderr}",
        installed.status
    );
    wait_established(admin, "compositions.toa.io").await;
    // What the release installed, as Helm recorded it.
    let output = Command::new(repo().join("scripts/helm"))
        .args(["get", "manifest", release, "--namespace", namespace])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("scripts/helm runs");
    assert!(
        output.status.success(),
        "helm get manifest {release}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let mut deployment = None;
    let mut service_account = None;
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect();
    for value in documents {
        match value["kind"].as_str() {
            Some("Deployment") => {
                deployment = Some(serde_json::from_value::<Deployment>(value).unwrap());
            }
            Some("ServiceAccount") => {
                service_account = Some(value["metadata"]["name"].as_str().unwrap().to_owned());
            }
            _ => {}
        }
    }
    let deployment = deployment.expect("the release installed a Deployment");
    let container = deployment
        .clone()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .clone();
    Chart {
        deployment,
        namespace: namespace.to_owned(),
        service_account: service_account.expect("the chart renders a ServiceAccount"),
        args: container.args.clone().unwrap_or_default(),
        env: container
            .env
            .iter()
            .flatten()
            .filter_map(|var| Some((var.name.clone(), var.value.clone()?)))
            .collect(),
        metrics_port,
    }
}

/// Waits until the CRD `name` is established.
async fn wait_established(client: &Client, name: &str) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    eventually("the CRD is established", Duration::from_secs(30), || {
        let api = api.clone();
        async move {
            let crd = api.get(name).await.map_err(|e| e.to_string())?;
            let established = crd
                .status
                .and_then(|status| status.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(()).ok_or("not yet".to_owned())
        }
    })
    .await;
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
