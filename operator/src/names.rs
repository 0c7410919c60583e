//! The operator's vocabulary: the names, labels, annotations, container names and mount paths
//! its objects share. At the bottom of the operator's layers: the builders ([`crate::desired`]),
//! the readings of what is observed ([`crate::observed`]) and the requests ([`crate::kube_io`])
//! all name things the same way from here, and this module uses none of them.

use std::collections::BTreeMap;

pub use toa_context::control::{CONTROL_PORT, PROBE_PORT};
/// Where the control token Secret is mounted in the agent container.
pub const CONTROL_DIR: &str = "/var/run/toa/control";
/// The key of the control token in the `<name>-control` Secret.
pub const TOKEN_KEY: &str = "token";
/// The key of the previous control token during a rotation: mounted beside `token`, where the
/// agent reads it.
pub use toa_context::control::PREVIOUS_TOKEN as PREVIOUS_KEY;
/// The Deployment's annotation holding its pods' drain key.
pub const DRAIN_KEY: &str = "toa.io/drain-key";
/// Where each component's local API token volume is mounted in the agent container
/// (`<dir>/<index>`, `--component-tokens`).
pub const TOKENS_DIR: &str = "/var/run/toa/tokens";
/// Where a component container has its own token volume (`TOA_AGENT_TOKEN_FILE` is `token` in it).
pub const COMPONENT_TOKEN_DIR: &str = "/var/run/toa/agent";
/// Where component manifests are mounted in the agent container.
pub const COMPONENTS_DIR: &str = "/components";
/// The namespace's ConfigMap of every Composition's component manifests (`<component>.yaml`):
/// each Composition applies its own keys with a field manager of its own
/// ([`crate::declarations::manager`]), so callers in every pod of the namespace know every
/// component's declarations; the agent reads the mounted files again when they change.
pub const DECLARATIONS: &str = "toa-declarations";
/// Where [`DECLARATIONS`] is mounted in the agent container (`--declarations`).
pub const DECLARATIONS_DIR: &str = "/var/run/toa/declarations";
/// Where Prometheus finds a pod's metrics (annotation-based scraping).
pub const SCRAPE_ANNOTATIONS: [&str; 3] = [
    "prometheus.io/scrape",
    "prometheus.io/port",
    "prometheus.io/path",
];
/// The container `kubectl logs POD` shows.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";

/// The agent's container name; a component's is [`component_container`].
pub const AGENT_CONTAINER: &str = "agent";

/// The container component `full_name` runs in: its name with `-` for `.` (`store.orders` →
/// `store-orders`), so `kubectl logs POD -c store-orders` needs no lookup. A name that is no DNS
/// label so (longer than 63 characters, or ending in `-`, which component names may) keeps its
/// first 54 characters and 8 hex digits of its SHA-256: still unique. Validation refuses a
/// component whose container would be the agent's or another's.
pub fn component_container(full_name: &str) -> String {
    let name = full_name.replace('.', "-");
    if name.len() <= 63 && !name.ends_with('-') {
        return name;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(full_name.as_bytes());
    let suffix: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{suffix}",
        name[..name.len().min(54)].trim_end_matches('-')
    )
}
/// Labels and the field manager of everything the operator applies.
pub const MANAGER: &str = "toa-operator";
pub const LABEL_COMPOSITION: &str = "toa.io/composition";

/// The ConfigMap holding the manifests.
pub fn components_name(composition: &str) -> String {
    format!("{composition}-components")
}

/// The Secret holding the control token.
pub fn control_name(composition: &str) -> String {
    format!("{composition}-control")
}

/// The labels of every object of a composition; the Deployment selects its pods by the last two.
pub fn labels(composition: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "toa".to_owned()),
        (
            "app.kubernetes.io/instance".to_owned(),
            composition.to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            MANAGER.to_owned(),
        ),
        (LABEL_COMPOSITION.to_owned(), composition.to_owned()),
    ])
}

/// The labels its Deployment (and its PodDisruptionBudget) select a composition's pods by.
pub fn selector(composition: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/instance".to_owned(),
            composition.to_owned(),
        ),
        (LABEL_COMPOSITION.to_owned(), composition.to_owned()),
    ])
}

/// [`selector`] as a label selector's text (the scale subresource's `status.selector`).
pub fn selector_text(composition: &str) -> String {
    let pairs: Vec<String> = selector(composition)
        .into_iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    pairs.join(",")
}

/// The label selector of a composition's pods, as `Api::list` takes it.
pub fn pod_selector(composition: &str) -> String {
    format!("{LABEL_COMPOSITION}={composition}")
}
