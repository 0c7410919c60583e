//! The control plane (`scripts/control-plane`), the chart installed on it, and the clients.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::pinned_kind;
use kube::{Api, Client, Config, ResourceExt};
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
    for _ in 0..200 {
        let base = range.start + rand_below(range.end - range.start - count);
        if (base..base + count).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            return base;
        }
    }
    panic!("no {count} free ports in a row in {range:?}");
}

fn rand_below(bound: u16) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    ((nanos ^ std::process::id().wrapping_mul(2_654_435_761)) % u32::from(bound)) as u16
}

/// A control plane started by `scripts/control-plane start`, stopped on drop.
pub struct ControlPlane {
    dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub port: u16,
}

impl ControlPlane {
    /// Starts one with its state in `dir`; panics (never skips) when it cannot.
    pub fn start(dir: &Path) -> Self {
        let port = free_ports(40000..50000, 4);
        let mut plane = Self {
            dir: dir.to_path_buf(),
            kubeconfig: PathBuf::new(),
            port,
        };
        let output = Command::new(repo().join("scripts/control-plane"))
            .arg("start")
            .arg(dir)
            .arg(port.to_string())
            .output()
            .expect("scripts/control-plane runs");
        if !output.status.success() {
            let log = std::fs::read_to_string(dir.join("apiserver.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "the control plane did not start (scripts/control-plane start {} {port}; build it \
                 with scripts/control-plane build):\n{}\n{}\napiserver.log, last lines:\n{}",
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

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/control-plane"))
            .arg("stop")
            .arg(&self.dir)
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

/// Creates (applies) a namespace.
pub async fn namespace(client: &Client, name: &str) {
    namespace_labelled(client, name, serde_json::json!({})).await;
}

/// A namespace labelled for the restricted Pod Security level, as a user of a server with Pod
/// Security admission (≥ 1.23) labels it; v1.20 does not enforce it.
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

/// Renders charts/toa-operator with charts/render.py (helm-python-sdk, offline) and applies what it
/// renders, server-side, as `helm install` would: the CRD, the ServiceAccount, RBAC and the
/// Service. The Deployment is kept, not applied (pods cannot reach the API server on loopback):
/// the suite runs the operator binary with that Deployment's arguments instead, under the
/// ServiceAccount's identity; the image scenario applies it with host networking.
pub async fn install_chart(admin: &Client, namespace: &str) -> Chart {
    install_release(admin, namespace, "toa", &[]).await
}

/// [`install_chart`] as release `release`, with `sets` (`KEY=JSON`) beside the suite's own values.
pub async fn install_release(
    admin: &Client,
    namespace: &str,
    release: &str,
    sets: &[&str],
) -> Chart {
    let metrics_port = free_ports(30000..40000, 1);
    let output = Command::new("python3")
        .arg(repo().join("charts/render.py"))
        .args(["--release", release, "--namespace", namespace])
        .args(sets.iter().flat_map(|set| ["--set", set]))
        .args(["--set", &format!("metrics.port={metrics_port}")])
        // The images scripts/images built and imported into the node.
        .args(["--set", "image.repository=localhost/toa/operator"])
        .args(["--set", "image.tag=e2e"])
        .args(["--set", "agentImage.repository=localhost/toa/agent"])
        .args(["--set", "agentImage.tag=e2e"])
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "charts/render.py failed (scripts/services installs helm-python-sdk): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    self::namespace(admin, namespace).await;
    let mut deployment = None;
    let mut service_account = None;
    // Parsed whole first: the YAML parser is not Send, and the applies await.
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).unwrap())
        .collect();
    for value in documents {
        if value.is_null() {
            continue;
        }
        let kind = value["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "Deployment" => {
                deployment = Some(serde_json::from_value::<Deployment>(value).unwrap());
                continue;
            }
            "ServiceAccount" => {
                service_account = Some(value["metadata"]["name"].as_str().unwrap().to_owned());
            }
            "CustomResourceDefinition" => {
                apply_crd(admin, value).await;
                continue;
            }
            _ => {}
        }
        apply(admin, value).await;
    }
    let deployment = deployment.expect("the chart renders a Deployment");
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

/// Server-side apply of one rendered object, whatever its kind.
async fn apply(client: &Client, value: serde_json::Value) {
    let object: DynamicObject = serde_json::from_value(value).unwrap();
    let types = object.types.clone().expect("apiVersion and kind");
    let gvk = kube::api::GroupVersionKind::try_from(&types).unwrap();
    let (resource, capabilities) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|error| panic!("{gvk:?} is not served: {error}"));
    let api: Api<DynamicObject> = match (capabilities.scope, object.namespace()) {
        (kube::discovery::Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), &namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &object.name_any(),
        &PatchParams::apply("e2e-helm").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|error| panic!("applying {} {}: {error}", types.kind, object.name_any()));
}

/// Applies the CRD and waits until it is established. A v1.20 server does not know
/// `x-kubernetes-validations` (CEL, from 1.25) and server-side apply refuses a field its schema
/// lacks, so the rule is taken out first, as such a server would drop it anyway; the operator's
/// reconcile-time check is what refuses an even number of addresses there.
async fn apply_crd(client: &Client, mut value: serde_json::Value) {
    let version = client.apiserver_version().await.unwrap();
    let minor: u32 = version
        .minor
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap();
    if minor < 25 {
        strip(&mut value, "x-kubernetes-validations");
    }
    let crd: CustomResourceDefinition = serde_json::from_value(value).unwrap();
    let name = crd.name_any();
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("e2e-helm").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap_or_else(|error| panic!("applying the CRD {name}: {error}"));
    eventually("the CRD is established", Duration::from_secs(30), || {
        let api = api.clone();
        let name = name.clone();
        async move {
            let crd = api.get(&name).await.map_err(|e| e.to_string())?;
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

fn strip(value: &mut serde_json::Value, key: &str) {
    match value {
        serde_json::Value::Object(map) => {
            map.remove(key);
            map.values_mut().for_each(|v| strip(v, key));
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| strip(v, key)),
        _ => {}
    }
}

/// A kubeconfig for the chart's ServiceAccount: its token, from the Secret v1.20's token
/// controller creates for it (listed in the ServiceAccount's `secrets`).
pub async fn service_account_kubeconfig(
    admin: &Client,
    api_port: u16,
    chart: &Chart,
    path: &Path,
) -> PathBuf {
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &chart.namespace);
    let secrets = Api::<Secret>::namespaced(admin.clone(), &chart.namespace);
    let token = eventually(
        "the ServiceAccount's token Secret is filled",
        Duration::from_secs(60),
        || {
            let (accounts, secrets) = (accounts.clone(), secrets.clone());
            let name = chart.service_account.clone();
            async move {
                let account = accounts.get(&name).await.map_err(|e| e.to_string())?;
                let secret = account
                    .secrets
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|reference| reference.name)
                    .ok_or("no token Secret listed yet")?;
                let secret = secrets.get(&secret).await.map_err(|e| e.to_string())?;
                let token = secret
                    .data
                    .and_then(|mut data| data.remove("token"))
                    .ok_or("the Secret holds no token yet")?;
                Ok(String::from_utf8(token.0).unwrap())
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
