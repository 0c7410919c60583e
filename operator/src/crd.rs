//! The `Composition` custom resource (`toa.io/v1alpha1`): a set of components deployed together,
//! with their image, replicas, manifests and the application's context for one environment.
//!
//! The CRD in `crds/composition.yaml` is generated from these types (`cargo run -p toa-operator
//! --bin crdgen`); a test fails when the two differ. The schema checks what an API server can
//! check at admission (CEL included: every supported server, 1.33 and later, runs it);
//! [`crate::validate`] checks everything again at reconcile time, for objects stored before a rule
//! existed, for what CEL cannot judge, and for `render` and the agent, which share its checks.

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The context annotations the spec embeds: toa-context owns them, with their schema.
pub use toa_context::spec::{AddressedSpec, AtomicitySpec, ContextSpec, LimitsSpec};

mod stored;
pub use stored::{Stored, Undecodable};

/// Condition types written to `status.conditions`.
pub mod conditions {
    /// Whether the composition runs as its spec says; `False` with [`super::reasons`] otherwise.
    pub const READY: &str = "Ready";
    /// Whether the composition is stopped by a halt (`spec.halted`).
    pub const HALTED: &str = "Halted";
    /// Whether a rollout of the composition's Deployment is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// Whether something is wrong that the operator cannot fix alone (failing containers,
    /// agents not answering).
    pub const DEGRADED: &str = "Degraded";
}

/// Condition reasons (CamelCase, as Kubernetes expects).
pub mod reasons {
    /// The spec was refused at reconcile time; what runs is left untouched.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// An object the operator would write belongs to another field manager (a Secret of the
    /// control Secret's name someone else made); nothing is taken over or rolled out.
    pub const CONFLICT: &str = "Conflict";
    /// Every pod runs the current spec and is available.
    pub const ROLLED_OUT: &str = "RolledOut";
    /// The Deployment has not yet rolled out the current spec.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// A halt stopped the composition (`Ready=False`, `Halted=True`).
    pub const HALTED: &str = "Halted";
    /// Some pods' agents did not answer the control endpoint, or a pod has no IP yet.
    pub const AGENTS_UNREACHABLE: &str = "AgentsUnreachable";
    /// A pod's container crash-loops, cannot start or ended, or the pod failed.
    pub const PODS_FAILING: &str = "PodsFailing";
    /// The Deployment cannot create pods: admission refused them (Pod Security, a quota, a
    /// policy), as its `ReplicaFailure` condition says.
    pub const PODS_REFUSED: &str = "PodsRefused";
    /// Nothing wrong (`Degraded=False`).
    pub const AS_EXPECTED: &str = "AsExpected";
    // The `Halted` condition's other reasons name the halt's phase: see `crate::halt::Phase`.
}

/// The desired state of a composition.
// Printer columns repeat `type_ = "string"`; clippy takes the repeats for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "toa.io",
    version = "v1alpha1",
    kind = "Composition",
    plural = "compositions",
    shortname = "comp",
    namespaced,
    status = "CompositionStatus",
    derive = "PartialEq",
    doc = "A set of toa components deployed together, with the agent beside each replica.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.updatedReplicas"
    ),
    printcolumn(
        name = "Halted",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Halted")].status"#
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Degraded")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CompositionSpec {
    /// The application the components belong to (`name` in context.toa.yaml); Redis keys and
    /// queues are namespaced by it. A DNS label.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9-]+$"))]
    pub application: String,
    /// The container image that runs every component of the composition.
    #[schemars(length(min = 1))]
    pub image: String,
    /// How many pods run the composition.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Requests and limits of the component container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The components, each with its manifest (`manifest.toa.yaml`). Names are unique.
    #[schemars(
        length(min = 1),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub components: Vec<ComponentSpec>,
    /// The application's context annotations, resolved for one environment.
    #[serde(default)]
    pub context: ContextSpec,
    /// Where the credentials for Redis and the broker are; addresses never carry them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,
    /// Where the pods' store (`context.storage`) takes its user, password and CA from, when not
    /// from `credentials`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// `true` asks for a halt: the composition is stopped once quiet (see `halt`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub halted: bool,
    /// How a halt proceeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<HaltSpec>,
    /// Who the component containers run as. Every pod meets the restricted Pod Security
    /// profile whatever is set here; by default everything runs as uid and gid 65532.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecuritySpec>,
    /// The agents' logs. Changing it rolls the pods out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogsSpec>,
    /// Where the agents send their spans (OpenTelemetry, OTLP over HTTP). Without, none are
    /// recorded; calls still pass their callers' trace context on. Changing it rolls the pods
    /// out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<TracesSpec>,
    /// How many of the composition's pods voluntary disruptions (a node drain) may take at once:
    /// a PodDisruptionBudget, made while the spec asks for two or more replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<DisruptionBudgetSpec>,
    /// What the pods get besides what the operator sets: where they run, the Secrets of the
    /// registries their images come from, labels and annotations. What the operator needs (the
    /// agent, its ports, the security context, the drain) cannot be changed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodSettings>,
}

/// The pods' placement, registries and metadata ([`CompositionSpec::pod`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Labels added to the pods; the keys the operator selects them by are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to the pods (a service mesh's, a secrets injector's); the keys the
    /// operator sets, and AppArmor or seccomp profiles, are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Secrets in the namespace with the credentials of the registries `image` and the agent's
    /// image come from. Naming one takes `get` on it (the chart's admission policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The nodes the pods may run on, by their labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the pods spread across zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The pods' PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The ServiceAccount the pods run as (for a cloud identity, say) [default: the namespace's
    /// `default`]. Naming one takes `use` on it (the chart's admission policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Whether the pods get the ServiceAccount's API token [default false: the component
    /// programs are not the operator's to trust with API credentials].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
}

/// The composition's PodDisruptionBudget.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudgetSpec {
    /// Whether the operator keeps one [default true]; `false` where the namespace has budgets of
    /// its own for these pods (two budgets over one pod make its eviction fail). The operator
    /// deletes nothing: one it made before is deleted by hand (`kubectl delete pdb <name>`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Pods a drain may evict at once, 1 or more [default 1]: 0 would block every drain.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1))]
    pub max_unavailable: i32,
}

impl Default for DisruptionBudgetSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_max_unavailable() -> i32 {
    1
}

/// The agents' log level and format (`toa-agent --log-level`/`--log-format`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogsSpec {
    /// The least severe events logged: error, warn, info, debug or trace [default info].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "log_level_schema")]
    pub level: Option<toa_context::logs::Level>,
    /// `plain` text, or `json`: one object a line [default plain].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "log_format_schema")]
    pub format: Option<toa_context::logs::Format>,
}

/// Where the agents export their spans.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracesSpec {
    /// The collector's OTLP/HTTP base URL, `http://otel-collector.monitoring:4318`: spans go
    /// to its `/v1/traces`. Plain http://, without a user, password or query. Where the
    /// operator restricts the pods' egress, the collector must be among the places allowed.
    #[schemars(length(min = 8, max = 2048), regex(pattern = r"^http://"))]
    pub endpoint: String,
    /// The spans' `service.name` [default: the Composition's name].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_name: Option<String>,
}

/// Who the component containers run as; the agent always runs as 65532.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecuritySpec {
    /// The user id of the component containers [default 65532]; never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_as_user: Option<i64>,
    /// The group id of the component containers [default 65532]; never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub run_as_group: Option<i64>,
    /// The group that owns the pod's volumes [default 65532]; never 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fs_group: Option<i64>,
    /// Run the component containers as their image's own `USER` (which must be a numeric,
    /// non-root user: the kubelet refuses to start any other under `runAsNonRoot`). Excludes
    /// `runAsUser` and `runAsGroup`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub image_user: bool,
}

/// One component of the composition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSpec {
    /// The component's full name, `namespace.name` or `name`, as its manifest says: lowercase
    /// letters, digits and '-', each part starting with a letter.
    #[schemars(length(min = 1, max = 127), regex(pattern = COMPONENT_NAME_PATTERN))]
    pub name: String,
    /// The component's manifest, as written in its `manifest.toa.yaml`.
    #[schemars(schema_with = "free_form_object")]
    pub manifest: Map<String, Value>,
    /// The component's configuration for this environment (context.toa.yaml's
    /// `configuration.<component>`), checked against the manifest's `configuration` schema; its
    /// defaults fill in what is absent. The program reads it from `TOA_CONFIGURATION`. A secret
    /// is only named here (`"$NAME"`): its value is the key `NAME` of the credentials Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub configuration: Option<Map<String, Value>>,
    /// Requests and limits of this component's container, instead of `spec.resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Environment variables of this component's program, beside the runtime's own (`TOA_*`,
    /// which are refused here): each a `value`, or a key of a Secret or ConfigMap in the
    /// composition's namespace. The admission policy lets only someone who may read (`get`) each
    /// Secret and ConfigMap name it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env: Vec<ComponentEnv>,
}

/// One environment variable of a component's program ([`ComponentSpec::env`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentEnv {
    /// Letters, digits, '_', '-' and '.', not starting with a digit; not `TOA_…`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The value; exclusive with `valueFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    /// A key of a Secret or of a ConfigMap, exactly one of them; exclusive with `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<ComponentEnvSource>,
}

/// Where a component's variable takes its value ([`ComponentEnv::value_from`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentEnvSource {
    /// A key of a Secret in the composition's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    /// A key of a ConfigMap in the composition's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key of a Secret or ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The object's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// A missing object or key leaves the variable unset instead of holding the container back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// The schema's check of a component's full name; the manifest's own rules (toa-context) are the
/// reference, applied again at reconcile time.
pub const COMPONENT_NAME_PATTERN: &str = r"^[a-z][a-z0-9-]{0,62}(\.[a-z][a-z0-9-]{0,62})?$";

/// Keys read from the Secret: `redis-username`, `redis-password`, `amqp-username`,
/// `amqp-password`, each optional.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSpec {
    /// A Secret in the composition's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// The store's credentials from a CloudNativePG cluster: its `<cluster>-app` Secret (keys
/// `username`, `password`) and its `<cluster>-ca` Secret (key `ca.crt`, which turns TLS on). The
/// pods reference them; the operator never reads them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The name of a CloudNativePG `Cluster` in the composition's namespace.
    #[serde(rename = "cloudNativePG")]
    #[schemars(
        length(min = 1, max = 249),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub cloud_native_pg: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HaltSpec {
    /// How long, in seconds, no pod may make or receive a call before the composition is stopped.
    #[serde(default = "default_quiet_window")]
    #[schemars(range(min = 1))]
    pub quiet_window: i64,
    /// How long, in seconds, a halt waits for a quiet window before it is called off.
    #[serde(default = "default_grace")]
    #[schemars(range(min = 1))]
    pub grace: i64,
}

impl Default for HaltSpec {
    fn default() -> Self {
        Self {
            quiet_window: default_quiet_window(),
            grace: default_grace(),
        }
    }
}

/// What the operator observed and concluded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositionStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One entry per type (`Ready`, `Halted`): a map keyed by `type`, so server-side apply merges
    /// them by type rather than replacing the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The composition's pods, of any revision (the scale subresource's `status.replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Pods whose containers are all ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Pods running the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,
    /// `ready/desired`, as `kubectl get` shows it (desired is 0 while a halt stops the
    /// composition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// The pods' label selector, for the scale subresource (`kubectl scale`, an autoscaler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl Composition {
    /// The condition of type `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_)
    }
}

/// The CRD as written to `crds/composition.yaml`.
pub fn crd_yaml() -> String {
    let body = serde_yaml::to_string(&Composition::crd()).expect("the CRD serializes to YAML");
    format!(
        "# Generated from operator/src/crd.rs by `cargo run -p toa-operator --bin crdgen > crds/composition.yaml`; do not edit.\n{body}"
    )
}

pub const DEFAULT_REPLICAS: i32 = 1;

fn default_replicas() -> i32 {
    DEFAULT_REPLICAS
}

fn default_quiet_window() -> i64 {
    30
}

fn default_grace() -> i64 {
    60
}

fn is_false(value: &bool) -> bool {
    !value
}

/// Manifests are free-form: the API server keeps every field as given.
/// One of `values`: a plain string enum (the generated schema of an optional enum lists `null`
/// among its values, which a structural schema need not carry).
fn string_enum(values: Vec<&str>) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "enum": values })
}

fn log_level_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use clap::ValueEnum;
    let levels = toa_context::logs::Level::value_variants();
    string_enum(levels.iter().map(|level| level.as_str()).collect())
}

fn log_format_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use clap::ValueEnum;
    let formats = toa_context::logs::Format::value_variants();
    string_enum(formats.iter().map(|format| format.as_str()).collect())
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests;
