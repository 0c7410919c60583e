//! The chart as Helm itself (scripts/helm, the real command) installs, upgrades and tests it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::cluster::{free_ports, privileged_namespace, repo, METRICS_PORTS};
use crate::node::BRIDGE_IP;
use crate::wait::eventually;

/// The release the suite's operator runs under.
pub const RELEASE: &str = "toa";
/// How long the chart's `helm test` pod asks the operator's `/ready` (`tests.timeoutSeconds`).
const TEST_SECONDS: u64 = 10;

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

/// The release `toa` of charts/toa-operator, as a user upgrading from the chart's earlier shape
/// gets it: [`earlier_chart`] installed with `helm install` (its CRD from `crds/`, with an older
/// schema), the CRD handed to the release as docs/composition.md says, then `helm upgrade` to this
/// chart, which must bring the CRD's new schema and its keep policy. Both with no error and
/// nothing on standard error (no warning). The Deployment has no replicas (pods cannot reach the
/// API server on loopback): the suite runs the operator binary with that Deployment's arguments
/// instead, under the ServiceAccount's identity; the image scenario runs it with host networking.
pub async fn install_chart(
    admin: &Client,
    kubeconfig: &Path,
    namespace: &str,
    work: &Path,
) -> Chart {
    // The image scenario runs the chart's Deployment here with host networking.
    privileged_namespace(admin, namespace).await;
    let metrics_port = free_ports(METRICS_PORTS, 1);
    let values = values(metrics_port, &[]);
    let earlier = earlier_chart(work);
    let release = (namespace, RELEASE);
    helm_release(kubeconfig, release, &["install"], &earlier, &values);
    wait_established(admin, "compositions.toa.io").await;
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    assert!(
        spec_property(&crds, "pod").await.is_none(),
        "the earlier CRD has no spec.pod"
    );
    hand_over_crd(&crds, namespace).await;
    helm_release(
        kubeconfig,
        release,
        &["upgrade"],
        &repo().join("charts/toa-operator"),
        &values,
    );
    let crd = crds.get("compositions.toa.io").await.unwrap();
    assert_eq!(
        crd.metadata
            .annotations
            .unwrap_or_default()
            .get("helm.sh/resource-policy")
            .map(String::as_str),
        Some("keep"),
        "the upgraded CRD is kept on uninstall"
    );
    eventually(
        "helm upgrade brings the CRD's new schema",
        Duration::from_secs(30),
        || {
            let crds = crds.clone();
            async move {
                spec_property(&crds, "pod")
                    .await
                    .map(drop)
                    .ok_or("no spec.pod yet".to_owned())
            }
        },
    )
    .await;
    manifest(kubeconfig, release, metrics_port)
}

/// [`install_chart`]'s chart as release `release`, installed in one step (with `sets`, `KEY=JSON`,
/// beside the suite's own values) into `namespace`, which must exist. The returned [`Chart`] holds
/// the Deployment as the release installed it (`helm get manifest`).
pub async fn install_release(
    admin: &Client,
    kubeconfig: &Path,
    namespace: &str,
    release: &str,
    sets: &[&str],
) -> Chart {
    let metrics_port = free_ports(METRICS_PORTS, 1);
    let values = values(metrics_port, sets);
    let chart = repo().join("charts/toa-operator");
    helm_release(
        kubeconfig,
        (namespace, release),
        &["install"],
        &chart,
        &values,
    );
    wait_established(admin, "compositions.toa.io").await;
    manifest(kubeconfig, (namespace, release), metrics_port)
}

/// The suite's values, `sets` first.
fn values(metrics_port: u16, sets: &[&str]) -> Vec<String> {
    let own = [
        format!("metrics.port={metrics_port}"),
        "replicas=0".to_owned(),
        // The admission policy has its own test on a real API server
        // (charts/test_admission.py); here it would refuse what the suite needs the API server
        // to take: addresses on the node's bridge IPs, and one with credentials, which the
        // operator must refuse itself.
        "admissionPolicy.enabled=false".to_owned(),
        // The images scripts/images built and imported into the node.
        "image.repository=\"localhost/toa/operator\"".to_owned(),
        "image.tag=\"e2e\"".to_owned(),
        "agentImage.repository=\"localhost/toa/agent\"".to_owned(),
        "agentImage.tag=\"e2e\"".to_owned(),
        // The rig has no Services (no kube-proxy): `helm test` asks the operator where the image
        // scenario runs it, on the host's network, which pods reach at the bridge's address.
        format!("tests.address=\"{BRIDGE_IP}:{metrics_port}\""),
        format!("tests.timeoutSeconds={TEST_SECONDS}"),
    ];
    sets.iter()
        .map(|set| (*set).to_owned())
        .chain(own)
        .collect()
}

/// The chart as its earlier versions shipped it, in `work`: the CRD in `crds/` (which Helm installs
/// once and never upgrades) without the `spec.pod` those versions lacked, no CRD template.
fn earlier_chart(work: &Path) -> PathBuf {
    let chart = work.join("earlier-chart/toa-operator");
    let _ = std::fs::remove_dir_all(&chart);
    copy_dir(&repo().join("charts/toa-operator"), &chart);
    std::fs::remove_file(chart.join("templates/crd.yaml")).unwrap();
    let text = std::fs::read_to_string(chart.join("files/composition.yaml")).unwrap();
    let mut crd: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let properties = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["spec"]["properties"];
    let removed = properties.as_mapping_mut().unwrap().remove("pod");
    assert!(removed.is_some(), "the CRD has spec.pod to leave out");
    std::fs::create_dir_all(chart.join("crds")).unwrap();
    std::fs::write(
        chart.join("crds/composition.yaml"),
        serde_yaml::to_string(&crd).unwrap(),
    )
    .unwrap();
    let meta = std::fs::read_to_string(chart.join("Chart.yaml")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        meta.replace("\nversion: 0.1.0\n", "\nversion: 0.0.9\n"),
    )
    .unwrap();
    chart
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The two commands docs/composition.md gives for a CRD no release owns, as the patch they make.
async fn hand_over_crd(crds: &Api<CustomResourceDefinition>, namespace: &str) {
    let patch = json!({ "metadata": {
        "labels": { "app.kubernetes.io/managed-by": "Helm" },
        "annotations": {
            "meta.helm.sh/release-name": RELEASE,
            "meta.helm.sh/release-namespace": namespace,
        },
    }});
    crds.patch(
        "compositions.toa.io",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// `spec.<name>` in the stored CRD's schema.
async fn spec_property(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
) -> Option<serde_json::Value> {
    let crd = crds.get("compositions.toa.io").await.unwrap();
    let version = crd.spec.versions.into_iter().next()?;
    let schema = serde_json::to_value(version.schema?.open_api_v3_schema?).unwrap();
    schema["properties"]["spec"]["properties"]
        .get(name)
        .cloned()
}

/// A klog line at info level: `I` and the date as `MMDD`, then a space.
fn klog_info(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() > 5
        && bytes[0] == b'I'
        && bytes[1..5].iter().all(u8::is_ascii_digit)
        && bytes[5] == b' '
}

/// scripts/helm with `args`, then the release's namespace and the kubeconfig.
fn helm(kubeconfig: &Path, namespace: &str, args: &[&str]) -> Output {
    Command::new(repo().join("scripts/helm"))
        .args(args)
        .args(["--namespace", namespace])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("scripts/helm runs")
}

/// `helm VERB RELEASE CHART --set-json VALUE…`, which must succeed with nothing on standard error
/// but Helm's client-go info lines.
fn helm_release(
    kubeconfig: &Path,
    (namespace, release): (&str, &str),
    verb: &[&str],
    chart: &Path,
    values: &[String],
) {
    let chart = chart.to_str().unwrap();
    let mut args: Vec<&str> = verb.iter().copied().chain([release, chart]).collect();
    args.extend(values.iter().flat_map(|set| ["--set-json", set.as_str()]));
    let done = helm(kubeconfig, namespace, &args);
    let stderr = String::from_utf8_lossy(&done.stderr);
    // Helm's client-go logs its own watches at info level (klog's `I1203 …` lines, as when a
    // watch of the CRD ends while Helm stops waiting): those are not the API server's warnings,
    // which come as `Warning:` or klog `W` lines, and fail the install here.
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| !klog_info(line) && !line.trim().is_empty())
        .collect();
    assert!(
        done.status.success() && said.is_empty(),
        "helm {} {release} (scripts/helm): {}\n{stderr}",
        verb.join(" "),
        done.status
    );
}

/// `helm test RELEASE --logs`: whether the chart's test pod passed, and what Helm and the pod said.
pub fn helm_test(kubeconfig: &Path, namespace: &str) -> (bool, String) {
    let done = helm(
        kubeconfig,
        namespace,
        &["test", RELEASE, "--logs", "--timeout", "2m"],
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    (done.status.success(), said)
}

/// What the release installed, as Helm recorded it (`helm get manifest`).
fn manifest(kubeconfig: &Path, (namespace, release): (&str, &str), metrics_port: u16) -> Chart {
    let output = helm(kubeconfig, namespace, &["get", "manifest", release]);
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
