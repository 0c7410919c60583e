//! Pure: a validated Composition → the objects the operator applies for it. No I/O and no
//! randomness: the control tokens, the drain key and the replica count are inputs, so every
//! output is a function of what the caller passes and the tests compare whole objects.
//!
//! For a Composition `shop` the operator applies, each built by a function of its own from the
//! Composition's [`Owner`] and typed inputs ([`desired`] builds them all at once):
//! - ConfigMap `shop-components` ([`components`]): each component's manifest as YAML
//!   (`<component>.yaml`), mounted into the agent at `/components/<component>/manifest.toa.yaml`;
//! - ConfigMap `toa-declarations` ([`declarations`]), shared by the namespace: this Composition's
//!   keys of it (the same manifests), mounted into the agent at `/var/run/toa/declarations`
//!   (`--declarations`), so callers in every pod know every component's declarations; how the
//!   shared object is kept is [`crate::declarations`]'s;
//! - Secret `shop-control` ([`control_secret`]): the control endpoint's token (`token`, and
//!   `previous` while the operator's key rotates), mounted into the agent at
//!   `/var/run/toa/control/`; derived from the operator's key ([`crate::key_ring`]), applied
//!   without taking over fields another manager wrote;
//! - Deployment `shop` ([`deployment`]): its drain key in the annotation [`DRAIN_KEY`] (random,
//!   made once and kept: the kubelet's hooks present it, the agent has its digest); one
//!   container per component, each running the
//!   component's `program` from `spec.image`, and the agent beside them in attach mode
//!   (`toa-agent compose … --attach`), a native sidecar (an init container with
//!   `restartPolicy: Always`), which every supported server (1.33 and later) runs.
//!
//! The image layout convention: `spec.image` holds each component under
//! `/components/<namespace.name>/` (its program and whatever it reads), the directory a component
//! container starts in, so a `program` written relative to the component's directory (as for a
//! local run) starts the same way in a pod. The agent does not see the image: it gets only the
//! manifests, mounted from the ConfigMap at the same paths in its own container.

use crate::agent_client::Keys;
use crate::crd::{ComponentEnv, Composition, KeyRef, PodSettings};
use crate::names::{
    self, component_container, components_name, control_name, labels, AGENT_CONTAINER,
    COMPONENTS_DIR, COMPONENT_TOKEN_DIR, CONTROL_DIR, CONTROL_PORT, DECLARATIONS, DECLARATIONS_DIR,
    DRAIN_KEY, MANAGER, PREVIOUS_KEY, PROBE_PORT, TOKENS_DIR, TOKEN_KEY,
};
use crate::validate::{Security, Valid, NONROOT};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapKeySelector, ConfigMapVolumeSource, Container, ContainerPort,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use toa_context::agent_args::ComposeArgs;
use toa_context::annotations::KUBERNETES_NAMESPACE;

use toa_context::control::LOCAL_PORT;
use toa_context::logs;
use toa_context::program;
use toa_context::trace;
/// How long the kubelet gives a stopping pod: the drain's wait for calls in flight, `dispose`
/// (one run command), 5 s to stop the programs ([`toa_context::Limits::stop`]), and this margin
/// for the hooks and the signal.
pub const GRACE_MARGIN_SECONDS: i64 = 5;
/// The agent's termination message when it fails is the end of its log (it says why it stopped
/// on stderr), so `Degraded` can quote it. Not for component containers: their logs may hold
/// what readers of the Composition must not see; a component that wants its reason quoted
/// writes it to /dev/termination-log.
const LOG_TAIL: &str = "FallbackToLogsOnError";
/// How long the agent's listeners may take to be bound (its `startupProbe`, period 1 s). They are
/// bound before anything else the agent does, so this covers a slow node, not the lifecycle.
pub const STARTUP_SECONDS: i32 = 60;
/// The agent's `--attach` port: component *i* (in the order of the agent's component arguments,
/// the spec's order) serves `127.0.0.1:(ATTACH_PORT + i)` in its own container, and the agent,
/// which does not start programs in a pod, waits for it there. Clear of the agent's own ports
/// (7090 local, 7091 control).
pub const ATTACH_PORT: u16 = 7100;
/// Operator settings that shape every Composition's objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The image holding `toa-agent`.
    pub agent_image: String,
    /// The agent container's requests and limits (the chart's `agentResources`).
    pub agent_resources: ResourceRequirements,
    /// Who may reach the agents' control port: with it, each Composition gets a NetworkPolicy
    /// ([`network_policy`]); without it, none.
    pub control_from: Option<ControlFrom>,
    /// With any, the NetworkPolicy restricts the pods' egress to these rules and DNS.
    pub egress: Vec<NetworkPolicyEgressRule>,
    /// Where the kubelet connects to pods from besides the node's addresses: the agents take
    /// drain hooks from there too.
    pub node_networks: Vec<toa_context::network::Network>,
}

/// The operator's pods, as a NetworkPolicy peer: their namespace and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlFrom {
    pub namespace: String,
    pub pod_labels: BTreeMap<String, String>,
}

/// The Composition's NetworkPolicy: its pods take the control port (7091) only from the
/// operator's pods, the probe port (7092) from anywhere (the kubelet's probes come from the node,
/// Prometheus from wherever it runs), and nothing else (their components listen on loopback).
/// With `egress` rules, the pods may connect only where they allow, and to DNS (port 53 anywhere:
/// every address the context names is a name). Enforced only where the cluster's network plugin
/// enforces NetworkPolicies.
pub fn network_policy(
    owner: &Owner,
    from: &ControlFrom,
    egress: &[NetworkPolicyEgressRule],
) -> NetworkPolicy {
    let port = |number: u16| NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(number))),
        protocol: Some("TCP".to_owned()),
        ..NetworkPolicyPort::default()
    };
    let namespace = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        from.namespace.clone(),
    )]);
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(namespace),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(from.pod_labels.clone()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    NetworkPolicy {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels(&owner.name)),
                ..LabelSelector::default()
            }),
            policy_types: Some(if egress.is_empty() {
                vec!["Ingress".to_owned()]
            } else {
                vec!["Ingress".to_owned(), "Egress".to_owned()]
            }),
            egress: (!egress.is_empty()).then(|| with_dns(egress)),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![operator]),
                    ports: Some(vec![port(CONTROL_PORT)]),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: Some(vec![port(PROBE_PORT)]),
                },
            ]),
        }),
    }
}

/// `rules` and DNS: UDP and TCP port 53, anywhere.
fn with_dns(rules: &[NetworkPolicyEgressRule]) -> Vec<NetworkPolicyEgressRule> {
    let dns = |protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.to_owned()),
        ..NetworkPolicyPort::default()
    };
    let mut all = vec![NetworkPolicyEgressRule {
        to: None,
        ports: Some(vec![dns("UDP"), dns("TCP")]),
    }];
    all.extend_from_slice(rules);
    all
}

/// The objects for one Composition.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub components: ConfigMap,
    /// This Composition's part of the namespace's [`DECLARATIONS`].
    pub declarations: ConfigMap,
    pub control: Secret,
    pub deployment: Deployment,
    pub disruption_budget: Option<PodDisruptionBudget>,
}

/// Why no objects could be built: the Composition lacks what an owner reference needs (it was
/// not read from the API server).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Composition {0:?} has no uid or namespace: expected an object read from the API server")]
pub struct NotStored(pub String);

/// What every object of a Composition is built from: its name, its namespace and the owner
/// reference back to it, checked once ([`Owner::of`]), so the builders below cannot fail.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    /// The Composition as the controller of what it owns.
    pub reference: OwnerReference,
}

impl Owner {
    /// `composition`'s name, namespace and owner reference; [`NotStored`] when it lacks a
    /// namespace or a uid (it was not read from the API server).
    pub fn of(composition: &Composition) -> Result<Self, NotStored> {
        let name = composition.name_any();
        let stored = || NotStored(name.clone());
        let namespace = composition.namespace().ok_or_else(stored)?;
        let reference = composition.controller_owner_ref(&()).ok_or_else(stored)?;
        Ok(Self {
            name,
            namespace,
            reference,
        })
    }

    /// The metadata of one of the Composition's own objects: named `object_name`, in its
    /// namespace, with its [`labels`] and controlled by it.
    fn meta(&self, object_name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(object_name),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels(&self.name)),
            owner_references: Some(vec![self.reference.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// The objects for `composition`, validated as `valid`, with `replicas` pods (the spec's count,
/// or 0 once a halt has stopped the composition), `keys` in the control Secret and `drain` as the
/// pods' drain key: each builder's object, all at once (the controller applies them one by one,
/// each when its inputs are known).
pub fn desired(
    composition: &Composition,
    valid: &Valid,
    settings: &Settings,
    keys: &Keys,
    drain: &str,
    replicas: i32,
) -> Result<Desired, NotStored> {
    let owner = Owner::of(composition)?;
    Ok(Desired {
        components: components(&owner, composition),
        declarations: declarations(&owner, composition),
        control: control_secret(&owner, keys),
        deployment: deployment(&owner, composition, valid, settings, drain, replicas),
        disruption_budget: disruption_budget(&owner, valid),
    })
}

/// The ConfigMap `<name>-components`: each component's manifest as YAML (`<component>.yaml`).
pub fn components(owner: &Owner, composition: &Composition) -> ConfigMap {
    ConfigMap {
        metadata: owner.meta(components_name(&owner.name)),
        data: Some(manifests(composition)),
        ..ConfigMap::default()
    }
}

/// This Composition's part of the namespace's [`DECLARATIONS`]: the same manifests, applied as
/// [`crate::declarations::manager`]. Shared by the namespace's Compositions: each is an owner,
/// none the controller, so the ConfigMap goes when the last of them does.
pub fn declarations(owner: &Owner, composition: &Composition) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(DECLARATIONS.to_owned()),
            namespace: Some(owner.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                MANAGER.to_owned(),
            )])),
            owner_references: Some(vec![OwnerReference {
                controller: None,
                block_owner_deletion: None,
                ..owner.reference.clone()
            }]),
            ..ObjectMeta::default()
        },
        data: Some(manifests(composition)),
        ..ConfigMap::default()
    }
}

/// The Secret `<name>-control` holding the current token (under [`TOKEN_KEY`]) and, during a
/// rotation of the operator's key, the previous one (under [`PREVIOUS_KEY`]; left out after it,
/// which a server-side apply removes).
pub fn control_secret(owner: &Owner, keys: &Keys) -> Secret {
    let mut data = BTreeMap::from([(
        TOKEN_KEY.to_owned(),
        ByteString(keys.current.as_bytes().to_vec()),
    )]);
    if let Some(previous) = &keys.previous {
        data.insert(
            PREVIOUS_KEY.to_owned(),
            ByteString(previous.as_bytes().to_vec()),
        );
    }
    Secret {
        metadata: owner.meta(control_name(&owner.name)),
        data: Some(data),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

fn manifests(composition: &Composition) -> BTreeMap<String, String> {
    composition
        .spec
        .components
        .iter()
        .map(|component| {
            let yaml = serde_yaml::to_string(&component.manifest)
                .expect("a JSON object serializes to YAML");
            (format!("{}.yaml", component.name), yaml)
        })
        .collect()
}

/// The Deployment `<name>`: `replicas` pods of the components' containers and the agent beside
/// them, the kubelet's hooks keyed by `drain`.
pub fn deployment(
    owner: &Owner,
    composition: &Composition,
    valid: &Valid,
    settings: &Settings,
    drain: &str,
    replicas: i32,
) -> Deployment {
    let name = owner.name.as_str();
    let selector = names::selector(name);
    let (containers, init_containers) = containers(composition, valid, settings, drain);
    let mut metadata = owner.meta(name.to_owned());
    metadata.annotations = Some(BTreeMap::from([(DRAIN_KEY.to_owned(), drain.to_owned())]));
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(name, valid)),
                    annotations: Some(pod_annotations(valid)),
                    ..ObjectMeta::default()
                }),
                spec: Some(placed(
                    PodSpec {
                        containers,
                        init_containers,
                        volumes: Some(volumes(name, composition)),
                        security_context: Some(pod_security(&valid.security)),
                        // Component programs are not the operator's to trust: no API credentials
                        // (unless the spec asks) and no other Services' addresses in their
                        // environment.
                        automount_service_account_token: Some(
                            valid.pod.automount_service_account_token.unwrap_or(false),
                        ),
                        enable_service_links: Some(false),
                        termination_grace_period_seconds: Some(grace_seconds(valid)),
                        ..PodSpec::default()
                    },
                    &valid.pod,
                )),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The composition's PodDisruptionBudget: a node drain evicts at most `maxUnavailable` of its
/// pods at once. None when the spec asks for fewer than two replicas (there is nothing to spread)
/// or turns it off. One made before the replicas went down is left (the operator deletes
/// nothing); with `maxUnavailable` at least 1 it never blocks the drain of a single pod, and pods
/// that are not ready may always be evicted (`AlwaysAllow`), so a failing composition never
/// holds a drain up.
pub fn disruption_budget(owner: &Owner, valid: &Valid) -> Option<PodDisruptionBudget> {
    let max_unavailable = valid.max_unavailable.filter(|_| valid.replicas >= 2)?;
    Some(PodDisruptionBudget {
        metadata: owner.meta(owner.name.clone()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(max_unavailable)),
            selector: Some(LabelSelector {
                match_labels: Some(names::selector(&owner.name)),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    })
}

/// The pod's containers and init containers: the components', and the agent as a native sidecar
/// (an init container with `restartPolicy: Always`, Kubernetes ≥ 1.29): the kubelet starts the
/// component containers once its startupProbe passes, that is once its listeners are bound, and
/// stops it after them.
fn containers(
    composition: &Composition,
    valid: &Valid,
    settings: &Settings,
    drain: &str,
) -> (Vec<Container>, Option<Vec<Container>>) {
    let containers = component_containers(composition, valid, drain);
    let mut agent = agent(composition, valid, settings, drain);
    agent.restart_policy = Some("Always".to_owned());
    (containers, Some(vec![agent]))
}

/// The pods' labels: the spec's, then the operator's (validation refuses the spec's setting
/// those).
fn pod_labels(name: &str, valid: &Valid) -> BTreeMap<String, String> {
    let mut labels_ = valid.pod.labels.clone();
    labels_.extend(labels(name));
    labels_
}

/// `spec` with where the pods may run and which registries' Secrets they use (`spec.pod`).
fn placed(spec: PodSpec, pod: &PodSettings) -> PodSpec {
    let some_map = |map: &BTreeMap<String, String>| (!map.is_empty()).then(|| map.clone());
    PodSpec {
        image_pull_secrets: (!pod.image_pull_secrets.is_empty())
            .then(|| pod.image_pull_secrets.clone()),
        node_selector: some_map(&pod.node_selector),
        tolerations: (!pod.tolerations.is_empty()).then(|| pod.tolerations.clone()),
        affinity: pod.affinity.clone(),
        topology_spread_constraints: (!pod.topology_spread_constraints.is_empty())
            .then(|| pod.topology_spread_constraints.clone()),
        priority_class_name: pod.priority_class_name.clone(),
        service_account_name: pod.service_account_name.clone(),
        ..spec
    }
}

/// Where Prometheus finds the agent's `/metrics` (annotation-based scraping; a PodMonitor names
/// the port `probe` instead), and the container `kubectl logs POD` shows: the first component's.
fn pod_annotations(valid: &Valid) -> BTreeMap<String, String> {
    let first = component_container(&valid.components[0].full_name());
    let [scrape, port, path] = names::SCRAPE_ANNOTATIONS;
    // The spec's own first: validation refuses the keys below, which are the operator's.
    let mut annotations = valid.pod.annotations.clone();
    annotations.extend(
        [
            (scrape, "true".to_owned()),
            (port, PROBE_PORT.to_string()),
            (path, "/metrics".to_owned()),
            (names::DEFAULT_CONTAINER_ANNOTATION, first),
        ]
        .map(|(key, value)| (key.to_owned(), value)),
    );
    annotations
}

fn volumes(name: &str, composition: &Composition) -> Vec<Volume> {
    let items = composition
        .spec
        .components
        .iter()
        .map(|component| KeyToPath {
            key: format!("{}.yaml", component.name),
            path: format!("{}/manifest.toa.yaml", component.name),
            mode: None,
        })
        .collect();
    [
        Volume {
            name: "components".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: components_name(name),
                items: Some(items),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "declarations".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: DECLARATIONS.to_owned(),
                // Applied before the Deployment; optional so a pod never waits on it.
                optional: Some(true),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "control".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(control_name(name)),
                // Mounted in the agent only. The kubelet writes it root-owned; the pod's fsGroup
                // gives the agent's group read access (a uid-65532 agent could not read a
                // root-owned 0400 file: found on a real kubelet).
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
    ]
    .into_iter()
    .chain((0..composition.spec.components.len()).map(token_volume))
    .collect()
}

/// Component `index`'s local API token: a small in-memory volume, the agent's to write and that
/// component's container's to read (docs/composition.md, "Security").
fn token_volume(index: usize) -> Volume {
    use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    Volume {
        name: format!("token-{index}"),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_owned()),
            size_limit: Some(Quantity("64Ki".to_owned())),
        }),
        ..Volume::default()
    }
}

/// One container per component, in the spec's order (the order of the agent's arguments, which
/// gives each its attach port): the component's `program` from `spec.image`, started in its
/// directory in the image, with the variables `toa-agent compose` would give it.
fn component_containers(composition: &Composition, valid: &Valid, drain: &str) -> Vec<Container> {
    valid
        .components
        .iter()
        .enumerate()
        .map(|(index, manifest)| {
            let full_name = manifest.full_name();
            Container {
                name: component_container(&full_name),
                image: Some(composition.spec.image.clone()),
                // Validation refuses a manifest without one.
                command: manifest.program.clone(),
                working_dir: Some(format!("{COMPONENTS_DIR}/{full_name}")),
                env: Some(program_env(
                    valid,
                    index,
                    full_name,
                    &composition.spec.components[index].env,
                )),
                // Its own token only: the other components' volumes are not mounted here.
                volume_mounts: Some(vec![VolumeMount {
                    name: format!("token-{index}"),
                    mount_path: COMPONENT_TOKEN_DIR.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                }]),
                // The component's own, else the composition's.
                resources: composition.spec.components[index]
                    .resources
                    .clone()
                    .or_else(|| composition.spec.resources.clone()),
                security_context: Some(container_security(
                    valid.security.run_as_user,
                    valid.security.run_as_group,
                )),
                lifecycle: Some(component_hooks(index, drain)),
                ..Container::default()
            }
        })
        .collect()
}

/// Component `index`'s program environment ([`toa_context::program`]): the same a local run
/// gives, its instance the pod's name and its token in its own volume, then its secrets.
fn program_env(
    valid: &Valid,
    index: usize,
    component: String,
    own: &[ComponentEnv],
) -> Vec<EnvVar> {
    let environment = program::Environment {
        port: toa_context::agent_args::attach_port(ATTACH_PORT, index),
        agent: format!("http://127.0.0.1:{LOCAL_PORT}"),
        component,
        instance: program::Source::PodName,
        token: program::Token::File(format!("{COMPONENT_TOKEN_DIR}/token")),
        configuration: valid.configurations[index].clone(),
    };
    let vars = environment
        .vars()
        .into_iter()
        .map(|(name, source)| match source {
            program::Source::Text(value) => EnvVar {
                name: name.to_owned(),
                value: Some(value),
                value_from: None,
            },
            program::Source::PodName => pod_name(name),
        });
    vars.chain(configuration_secrets(valid, index))
        .chain(own.iter().map(user_var))
        .collect()
}

/// A variable of `spec.components[].env` (checked: a value or one key reference).
fn user_var(var: &ComponentEnv) -> EnvVar {
    let key = |key_ref: &KeyRef| (key_ref.name.clone(), key_ref.key.clone(), key_ref.optional);
    let from = var.value_from.as_ref();
    EnvVar {
        name: var.name.clone(),
        value: var.value.clone(),
        value_from: from.map(|from| EnvVarSource {
            secret_key_ref: from
                .secret_key_ref
                .as_ref()
                .map(key)
                .map(|(name, key, optional)| SecretKeySelector {
                    name,
                    key,
                    optional,
                }),
            config_map_key_ref: from.config_map_key_ref.as_ref().map(key).map(
                |(name, key, optional)| ConfigMapKeySelector {
                    name,
                    key,
                    optional,
                },
            ),
            ..EnvVarSource::default()
        }),
    }
}

/// Stopping a pod drains the agent first: no more calls in, dispose runs while the component
/// still serves, then the kubelet stops the container. The hook asks the agent's probe port with
/// the drain key in the path (a path is all an `httpGet` hook carries on every kubelet), which
/// the program never sees. Each start of the container (the kubelet restarts it when its program
/// dies) tells the agent, which runs the lifecycle again for the new program.
fn component_hooks(index: usize, drain: &str) -> Lifecycle {
    Lifecycle {
        post_start: Some(probe_port_hook(format!(
            "{}/{index}/{drain}",
            toa_context::control::STARTED_PATH
        ))),
        pre_stop: Some(drain_hook(drain)),
        ..Lifecycle::default()
    }
}

/// `GET /drain/<key>` on the agent's probe port.
fn drain_hook(drain: &str) -> LifecycleHandler {
    probe_port_hook(format!("{}/{drain}", toa_context::control::DRAIN_PATH))
}

fn agent(composition: &Composition, valid: &Valid, settings: &Settings, drain: &str) -> Container {
    let token_file = PathBuf::from(format!("{CONTROL_DIR}/{TOKEN_KEY}"));
    Container {
        name: AGENT_CONTAINER.to_owned(),
        image: Some(settings.agent_image.clone()),
        command: Some(agent_command(composition, &token_file, drain)),
        env: Some([agent_env(valid, settings), traces_env(composition, valid)].concat()),
        ports: Some(agent_ports()),
        resources: Some(settings.agent_resources.clone()),
        termination_message_policy: Some(LOG_TAIL.to_owned()),
        security_context: Some(SecurityContext {
            read_only_root_filesystem: Some(true),
            ..container_security(Some(NONROOT), Some(NONROOT))
        }),
        // The probe listener is bound after the agent's other listeners, so `/healthz` answering
        // means all are bound; it answers all along, through attaching and the lifecycle (a TCP
        // check on the control port, which opened only after the lifecycle, killed healthy starts
        // whose `preflight` ran past ~30 s). The startupProbe covers only binding; on a native sidecar it holds the
        // component containers back until then.
        startup_probe: Some(http_probe("/healthz", 1, STARTUP_SECONDS)),
        liveness_probe: Some(http_probe("/healthz", 10, 3)),
        // Ready once every component ran `ready`.
        readiness_probe: Some(http_probe("/readyz", 5, 3)),
        // The agent's own drain, for when it stops before or without the components' hooks: a
        // kubelet hook like theirs, from the node (the agent takes hooks from nowhere else).
        lifecycle: Some(Lifecycle {
            pre_stop: Some(drain_hook(drain)),
            ..Lifecycle::default()
        }),
        volume_mounts: Some(agent_mounts(composition.spec.components.len())),
        ..Container::default()
    }
}

/// `toa-agent compose … --attach` of every component's manifest directory, in the spec's order.
fn agent_command(composition: &Composition, token_file: &Path, drain: &str) -> Vec<String> {
    ComposeArgs {
        drain_key_sha256: Some(toa_context::control::drain_digest(drain)),
        component_tokens: Some(PathBuf::from(TOKENS_DIR)),
        listen: SocketAddr::from(([127, 0, 0, 1], LOCAL_PORT)),
        control_listen: Some(SocketAddr::from(([0, 0, 0, 0], CONTROL_PORT))),
        control_token_file: Some(token_file.to_owned()),
        attach: Some(ATTACH_PORT),
        probe_listen: Some(SocketAddr::from(([0, 0, 0, 0], PROBE_PORT))),
        declarations: Some(PathBuf::from(DECLARATIONS_DIR)),
        ..ComposeArgs::new(
            composition
                .spec
                .components
                .iter()
                .map(|component| PathBuf::from(format!("{COMPONENTS_DIR}/{}", component.name)))
                .collect(),
        )
    }
    .command()
}

/// The agent's named ports: `control` and `probe`.
fn agent_ports() -> Vec<ContainerPort> {
    [("control", CONTROL_PORT), ("probe", PROBE_PORT)]
        .map(|(name, port)| ContainerPort {
            name: Some(name.to_owned()),
            container_port: i32::from(port),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        })
        .to_vec()
}

/// The agent's mounts of the pod's [`volumes`]: read-only but for the components' token
/// volumes, which it writes.
fn agent_mounts(components: usize) -> Vec<VolumeMount> {
    let read_only = [
        ("components", COMPONENTS_DIR),
        ("declarations", DECLARATIONS_DIR),
        ("control", CONTROL_DIR),
    ]
    .map(|(name, path)| VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    let tokens = (0..components).map(|index| VolumeMount {
        name: format!("token-{index}"),
        mount_path: format!("{TOKENS_DIR}/{index}"),
        ..VolumeMount::default()
    });
    read_only.into_iter().chain(tokens).collect()
}

/// The pod's `terminationGracePeriodSeconds`: the agent's longest stop, and a margin.
pub fn grace_seconds(valid: &Valid) -> i64 {
    let stop = valid.context.limits.stop().as_secs_f64().ceil() as i64;
    stop.saturating_add(GRACE_MARGIN_SECONDS)
}

fn agent_env(valid: &Valid, settings: &Settings) -> Vec<EnvVar> {
    let context = &valid.context;
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    // The names are written once, by toa-context; credentials come from the Secret below.
    let mut env: Vec<EnvVar> = context
        .to_vars()
        .into_iter()
        .map(|(name, text)| value(name, text))
        .collect();
    env.push(pod_name(program::INSTANCE));
    // The node's IPs: the kubelet's hooks come from the node.
    env.push(field(toa_context::control::HOST_IPS, "status.hostIPs"));
    // The namespace, which the application's queues and Redis keys carry: two namespaces
    // running one application name on one broker or Redis do not meet.
    env.push(field(KUBERNETES_NAMESPACE, "metadata.namespace"));
    if !settings.node_networks.is_empty() {
        let networks: Vec<String> = settings
            .node_networks
            .iter()
            .map(|n| n.to_string())
            .collect();
        env.push(value(
            toa_context::network::NODE_NETWORKS,
            networks.join(","),
        ));
    }
    if let Some(level) = valid.logs.level {
        env.push(value(logs::LEVEL_VAR, level.as_str().to_owned()));
    }
    if let Some(format) = valid.logs.format {
        env.push(value(logs::FORMAT_VAR, format.as_str().to_owned()));
    }
    env.extend(credentials(valid));
    env.extend(cloud_native_pg(valid));
    env
}

/// Where the agent exports its spans (`spec.traces`), named by the Composition unless the spec
/// names the service.
fn traces_env(composition: &Composition, valid: &Valid) -> Vec<EnvVar> {
    let Some(traces) = &valid.traces else {
        return Vec::new();
    };
    let service = traces
        .service_name
        .clone()
        .unwrap_or_else(|| composition.name_any());
    [
        (trace::ENDPOINT_VAR, traces.endpoint.clone()),
        (trace::SERVICE_VAR, service),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    })
    .collect()
}

/// The credentials Secret's keys, each optional (a Redis without ACLs needs none).
fn credentials(valid: &Valid) -> Vec<EnvVar> {
    let Some(secret) = &valid.credentials else {
        return Vec::new();
    };
    [
        ("TOA_REDIS_USERNAME", "redis-username"),
        ("TOA_REDIS_PASSWORD", "redis-password"),
        ("TOA_AMQP_USERNAME", "amqp-username"),
        ("TOA_AMQP_PASSWORD", "amqp-password"),
        // The CA that signed the servers' certificates (`rediss://`, `amqps://`); without
        // it, the public roots.
        (toa_context::tls::CA, "ca.crt"),
        // The store's login and CA (TLS on when given), unless a CloudNativePG cluster's
        // Secrets hold them.
        ("TOA_STORAGE_USERNAME", "storage-username"),
        ("TOA_STORAGE_PASSWORD", "storage-password"),
        (toa_context::tls::STORAGE_CA, "storage-ca.crt"),
    ]
    .into_iter()
    .filter(|(variable, _)| valid.cloud_native_pg.is_none() || !variable.starts_with("TOA_STORAGE"))
    .map(|(variable, key)| from_secret(variable, secret, key, true))
    .collect()
}

/// The variable `name` from the key `key` of the Secret `secret`.
fn from_secret(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: Some(optional),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// The store's login from a CloudNativePG cluster's `<cluster>-app` Secret, and its CA from
/// `<cluster>-ca` (the cluster's server certificates are signed by it: TLS on). Not optional: a
/// pod without them would not reach the store. The operator never reads either Secret.
fn cloud_native_pg(valid: &Valid) -> Vec<EnvVar> {
    let Some(cluster) = &valid.cloud_native_pg else {
        return Vec::new();
    };
    [
        ("TOA_STORAGE_USERNAME", "app", "username"),
        ("TOA_STORAGE_PASSWORD", "app", "password"),
        (toa_context::tls::STORAGE_CA, "ca", "ca.crt"),
    ]
    .into_iter()
    .map(|(variable, secret, key)| {
        from_secret(variable, &format!("{cluster}-{secret}"), key, false)
    })
    .collect()
}

/// `TOA_SECRET_{NAME}` for each secret of component `index`'s configuration, from the
/// credentials Secret's key `NAME` (validation refuses secrets without that Secret). Not
/// optional: a missing key keeps the container from starting rather than have it run without.
fn configuration_secrets(valid: &Valid, index: usize) -> Vec<EnvVar> {
    let Some(secret) = &valid.credentials else {
        return Vec::new();
    };
    valid.secrets[index]
        .iter()
        .map(|name| {
            from_secret(
                &toa_context::placeholders::variable(name),
                secret,
                name,
                false,
            )
        })
        .collect()
}

/// The variable `name` holding the pod's name: the agent and the components of a pod share it as
/// `TOA_INSTANCE`.
fn pod_name(name: &str) -> EnvVar {
    field(name, "metadata.name")
}

/// `name` from the downward API's `path`.
fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// A kubelet hook on the agent's probe port (an `httpGet`: component images need nothing).
fn probe_port_hook(path: String) -> LifecycleHandler {
    LifecycleHandler {
        http_get: Some(HTTPGetAction {
            path: Some(path),
            port: IntOrString::Int(i32::from(PROBE_PORT)),
            ..HTTPGetAction::default()
        }),
        ..LifecycleHandler::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(i32::from(PROBE_PORT)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

/// The pod's part of the restricted Pod Security profile: non-root, the runtime's default
/// seccomp profile, and the volume group the agent reads its token through.
fn pod_security(security: &Security) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        fs_group: Some(security.fs_group),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// A container's part of the restricted profile; `user`/`group` `None`: the image's own.
fn container_security(user: Option<i64>, group: Option<i64>) -> SecurityContext {
    SecurityContext {
        run_as_user: user,
        run_as_group: group,
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests;
