//! The reconcile-time check of a Composition's spec. The CRD schema checks what an API server can,
//! but an object stored before a rule existed keeps its values (CEL ratchets: unchanged values are
//! not judged again), and no schema can say that an address carries credentials or that a
//! manifest is well-formed. So every spec is
//! checked again here, with toa-context's own constructors: the messages are the ones the agent
//! gives for the same input, `Atomicity takes an odd number of addresses, 2 given.` among them.
//!
//! Pure: no I/O, so the controller can call it on every reconcile and write the message into a
//! `Ready=False` condition with reason [`crate::crd::reasons::INVALID_SPEC`]. The controller runs
//! it within a [`budget`]: the schemas it compiles and evaluates are users'.

use crate::crd::{CompositionSpec, HaltSpec, LogsSpec, PodSettings, SecuritySpec, TracesSpec};
use crate::manifest;
use crate::names::{component_container, AGENT_CONTAINER};
use std::sync::Mutex;
use std::time::Duration;
use toa_context::{Context, ContextError, Manifest};

pub mod budget;
mod env;
mod pod;

/// Why a spec was refused: one message naming the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSpec(pub String);

/// A spec that passed, in the types the pods' settings are made from.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid {
    /// The application's context; its `name` is `spec.application`.
    pub context: Context,
    /// The components' manifests, in the spec's order.
    pub components: Vec<Manifest>,
    /// Each component's configuration (JSON, its defaults filled in), in the spec's order.
    pub configurations: Vec<String>,
    /// The secrets each component's configuration holds as `"$NAME"`, in the spec's order: keys
    /// of the credentials Secret, given to the component's container as `TOA_SECRET_{NAME}`.
    pub secrets: Vec<Vec<String>>,
    pub replicas: i32,
    /// How a halt proceeds (`spec.halt` or its defaults).
    pub halt: Halt,
    /// The Secret holding Redis and broker credentials, if any.
    pub credentials: Option<String>,
    /// The CloudNativePG cluster whose `-app` and `-ca` Secrets hold the store's credentials.
    pub cloud_native_pg: Option<String>,
    /// Who the component containers run as.
    pub security: Security,
    /// The agents' logs (`spec.logs`).
    pub logs: LogsSpec,
    /// Where the agents export their spans (`spec.traces`), checked.
    pub traces: Option<TracesSpec>,
    /// Pods a voluntary disruption may take at once (`spec.disruptionBudget`); `None`: the
    /// operator keeps no budget.
    pub max_unavailable: Option<i32>,
    /// What the pods get besides what the operator sets (`spec.pod`).
    pub pod: PodSettings,
}

/// Who the component containers run as, and the pod's volume group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Security {
    /// `None`: the image's own `USER`.
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub fs_group: i64,
}

/// The user and group everything runs as unless the spec says otherwise: the distroless
/// `nonroot` user, which the agent's image runs as.
pub const NONROOT: i64 = 65532;

/// The timings of a halt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Halt {
    /// How long no pod may make or receive a call before the composition is stopped.
    pub quiet_window: Duration,
    /// How long a halt waits for a quiet window before it is called off.
    pub grace: Duration,
}

/// Where a check has got to: the field whose schemas it compiles or evaluates, for a budget that
/// runs out to name.
#[derive(Debug, Default)]
pub struct Progress(Mutex<String>);

impl Progress {
    fn at(&self, field: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = field;
    }

    /// The field the check was last at, or `before` when it reached none.
    pub fn last_or(&self, before: &str) -> String {
        let last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_empty() {
            before
        } else {
            last.as_str()
        }
        .to_owned()
    }
}

/// Checks `spec` field by field, in the spec's order, and reports the first refusal.
pub fn validate(spec: &CompositionSpec) -> Result<Valid, InvalidSpec> {
    validate_noting(spec, &Progress::default())
}

/// [`validate`], noting in `progress` the field whose schemas it is at.
pub fn validate_noting(spec: &CompositionSpec, progress: &Progress) -> Result<Valid, InvalidSpec> {
    application(&spec.application)?;
    image(&spec.image)?;
    if spec.replicas < 0 {
        return Err(invalid(
            "spec.replicas",
            format!("expected 0 or more, got {}", spec.replicas),
        ));
    }
    let components = components(spec, progress)?;
    let credentials = spec
        .credentials
        .as_ref()
        .map(|credentials| secret_name(&credentials.secret_name))
        .transpose()?;
    let (configurations, secrets) =
        configurations(spec, &components, credentials.is_some(), progress)?;
    let context = spec
        .context
        .validate(&spec.application)
        .map_err(in_context)?;
    if context.amqp.is_some() && credentials.is_none() {
        return Err(invalid(
            "spec.context.amqp",
            "a pod's agent logs in to the broker with the credentials Secret's `amqp-username` \
             and `amqp-password`, and `spec.credentials.secretName` names none (guest/guest is \
             for local runs)",
        ));
    }
    let cloud_native_pg = cloud_native_pg(spec)?;
    let halt = halt(spec.halt.as_ref().unwrap_or(&HaltSpec::default()))?;
    let security = security(
        spec.security_context
            .as_ref()
            .unwrap_or(&SecuritySpec::default()),
    )?;
    Ok(Valid {
        context,
        components,
        configurations,
        secrets,
        replicas: spec.replicas,
        halt,
        credentials,
        cloud_native_pg,
        security,
        logs: spec.logs.clone().unwrap_or_default(),
        traces: traces(spec)?,
        max_unavailable: max_unavailable(spec)?,
        pod: pod_settings(spec)?,
    })
}

/// `spec.traces`: an endpoint the agent takes (the agent's own rule) and a printable service name.
fn traces(spec: &CompositionSpec) -> Result<Option<TracesSpec>, InvalidSpec> {
    let Some(traces) = &spec.traces else {
        return Ok(None);
    };
    toa_context::trace::check_endpoint(&traces.endpoint)
        .map_err(|bad| invalid("spec.traces.endpoint", bad.to_string()))?;
    if let Some(name) = &traces.service_name {
        if name.is_empty() || name.len() > 253 || name.chars().any(char::is_control) {
            return Err(invalid(
                "spec.traces.serviceName",
                "expected 1 to 253 characters, none a control character",
            ));
        }
    }
    Ok(Some(traces.clone()))
}

/// The CloudNativePG cluster whose Secrets hold the store's credentials and CA: only with a
/// store to use them for, and a name its Secrets' names (`<cluster>-app`) can be made of.
fn cloud_native_pg(spec: &CompositionSpec) -> Result<Option<String>, InvalidSpec> {
    let Some(cluster) = spec.storage.as_ref().map(|s| &s.cloud_native_pg) else {
        return Ok(None);
    };
    let field = "spec.storage.cloudNativePG";
    if spec.context.storage.is_none() {
        return Err(invalid(
            field,
            "names where the store's credentials come from, and spec.context.storage names no \
             store (the cluster's read-write Service, as postgres://shop-db-rw:5432/app)",
        ));
    }
    let label = !cluster.is_empty()
        && cluster.len() <= 249
        && !cluster.starts_with('-')
        && !cluster.ends_with('-')
        && cluster
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !label {
        return Err(invalid(
            field,
            format!("expected the name of a CloudNativePG Cluster (lowercase letters, digits and '-', at most 249), got {cluster:?}"),
        ));
    }
    Ok(Some(cluster.clone()))
}

/// The restricted Pod Security profile refuses root; the image's user excludes a given one.
fn security(spec: &SecuritySpec) -> Result<Security, InvalidSpec> {
    for (field, id) in [
        ("runAsUser", spec.run_as_user),
        ("runAsGroup", spec.run_as_group),
        ("fsGroup", spec.fs_group),
    ] {
        if let Some(id) = id.filter(|id| *id < 1) {
            return Err(invalid(
                &format!("spec.securityContext.{field}"),
                format!("expected an id of 1 or more (the restricted Pod Security profile refuses root), got {id}"),
            ));
        }
    }
    if spec.image_user && (spec.run_as_user.is_some() || spec.run_as_group.is_some()) {
        return Err(invalid(
            "spec.securityContext.imageUser",
            "expected either imageUser or runAsUser/runAsGroup, got both",
        ));
    }
    Ok(if spec.image_user {
        Security {
            run_as_user: None,
            run_as_group: None,
            fs_group: spec.fs_group.unwrap_or(NONROOT),
        }
    } else {
        Security {
            run_as_user: Some(spec.run_as_user.unwrap_or(NONROOT)),
            run_as_group: Some(spec.run_as_group.unwrap_or(NONROOT)),
            fs_group: spec.fs_group.unwrap_or(NONROOT),
        }
    })
}

fn application(name: &str) -> Result<(), InvalidSpec> {
    // The same rule as `name` in context.toa.yaml.
    toa_context::annotations::check_name(name)
        .map_err(|message| invalid("spec.application", message))
}

fn image(image: &str) -> Result<(), InvalidSpec> {
    if image.is_empty() || image.chars().any(char::is_whitespace) {
        return Err(invalid(
            "spec.image",
            format!(
                "expected an image reference such as registry.example.com/shop:1.0, got {image:?}"
            ),
        ));
    }
    Ok(())
}

fn components(spec: &CompositionSpec, progress: &Progress) -> Result<Vec<Manifest>, InvalidSpec> {
    if spec.components.is_empty() {
        return Err(invalid(
            "spec.components",
            "expected at least one component",
        ));
    }
    let mut manifests: Vec<Manifest> = Vec::with_capacity(spec.components.len());
    for (index, component) in spec.components.iter().enumerate() {
        let origin = format!("spec.components[{index}].manifest");
        progress.at(origin.clone());
        let manifest = manifest::check(&component.manifest, &origin)
            .map_err(|error| InvalidSpec(error.to_string()))?;
        let full_name = manifest.full_name();
        if component.name != full_name {
            return Err(invalid(
                &format!("spec.components[{index}].name"),
                format!(
                    "expected {full_name:?}, the manifest's namespace.name, got {:?}",
                    component.name
                ),
            ));
        }
        if manifests.iter().any(|seen| seen.full_name() == full_name) {
            return Err(invalid(
                &format!("spec.components[{index}].name"),
                format!("expected each component once, {full_name} is listed twice"),
            ));
        }
        container(&manifests, index, &full_name)?;
        env::check(index, &component.env)?;
        if manifest.program.is_none() {
            // The manifest may omit it (the agent checks it only when it starts programs), but in
            // a pod the component's own container runs exactly this command.
            return Err(invalid(
                &format!("spec.components[{index}].manifest.program"),
                format!(
                    "component {full_name} has none; a pod needs the command that starts its program, as [python3, main.py]"
                ),
            ));
        }
        backed(spec, index, &manifest)?;
        manifests.push(manifest);
    }
    Ok(manifests)
}

/// `spec.pod`, checked.
fn pod_settings(spec: &CompositionSpec) -> Result<PodSettings, InvalidSpec> {
    let pod = spec.pod.clone().unwrap_or_default();
    pod::check(&pod)?;
    Ok(pod)
}

/// `spec.disruptionBudget.maxUnavailable`, at least 1 (0 would block every node drain); `None`
/// when the budget is turned off.
fn max_unavailable(spec: &CompositionSpec) -> Result<Option<i32>, InvalidSpec> {
    let budget = spec.disruption_budget.clone().unwrap_or_default();
    if !budget.enabled {
        return Ok(None);
    }
    if budget.max_unavailable < 1 {
        return Err(invalid(
            "spec.disruptionBudget.maxUnavailable",
            format!(
                "expected 1 or more (0 would block every node drain), got {}",
                budget.max_unavailable
            ),
        ));
    }
    Ok(Some(budget.max_unavailable))
}

/// Component `index`'s container name: not the agent's, and not another component's
/// (`a.b-c` and `a-b.c` would both run in `a-b-c`).
fn container(seen: &[Manifest], index: usize, full_name: &str) -> Result<(), InvalidSpec> {
    let field = format!("spec.components[{index}].name");
    let container = component_container(full_name);
    if container == AGENT_CONTAINER {
        return Err(invalid(
            &field,
            format!("{full_name} would run in the container `{AGENT_CONTAINER}`, the agent's: rename the component"),
        ));
    }
    match seen.iter().find(|m| component_container(&m.full_name()) == container) {
        Some(other) => Err(invalid(
            &field,
            format!(
                "{full_name} and {} would both run in the container `{container}` (a component's container is its name with `-` for `.`): rename one",
                other.full_name()
            ),
        )),
        None => Ok(()),
    }
}

/// What a component's manifest needs of the context in a pod: a store for an entity, a broker
/// for events.
fn backed(spec: &CompositionSpec, index: usize, manifest: &Manifest) -> Result<(), InvalidSpec> {
    let full_name = manifest.full_name();
    if manifest.entity.is_some() && spec.context.storage.is_none() {
        // Replicas keeping objects of their own would disagree, and a pod's memory goes with
        // the pod: in pods, objects are PostgreSQL's.
        return Err(invalid(
            &format!("spec.components[{index}].manifest.entity"),
            format!(
                "component {full_name} declares an entity, and spec.context.storage names no \
                 store; pods keep objects in PostgreSQL (postgres://host:5432/database)"
            ),
        ));
    }
    if !manifest.events.is_empty() && spec.context.amqp.is_none() {
        // Events leave through the broker; a pod has no process-local bus to fall back on.
        return Err(invalid(
            &format!("spec.components[{index}].manifest.events"),
            format!(
                "component {full_name} declares events, and spec.context.amqp names no \
                 broker; events leave through RabbitMQ (amqp://host:5672)"
            ),
        ));
    }
    if !manifest.receivers.is_empty() && spec.context.amqp.is_none() {
        // Events reach a pod's receivers only through the broker.
        return Err(invalid(
            &format!("spec.components[{index}].manifest.receivers"),
            format!(
                "component {full_name} receives events, and spec.context.amqp names no \
                 broker; events arrive through RabbitMQ (amqp://host:5672)"
            ),
        ));
    }
    Ok(())
}

/// Each component's configuration checked against its manifest's schema, defaults filled in,
/// and the secrets it holds. The operator reads no Secret: a secret's value is not checked here,
/// and it needs the credentials Secret to come from.
fn configurations(
    spec: &CompositionSpec,
    manifests: &[Manifest],
    has_credentials: bool,
    progress: &Progress,
) -> Result<(Vec<String>, Vec<Vec<String>>), InvalidSpec> {
    let mut configurations = Vec::new();
    let mut secrets = Vec::new();
    for (index, (component, manifest)) in spec.components.iter().zip(manifests).enumerate() {
        let key = format!("spec.components[{index}].configuration");
        progress.at(key.clone());
        let given = component
            .configuration
            .clone()
            .map(serde_json::Value::Object);
        let value = toa_context::configure(manifest, given.as_ref(), toa_context::Secrets::Unknown)
            .map_err(|message| invalid(&key, message))?;
        let mut names: Vec<String> = toa_context::placeholders::placeholders(&value)
            .into_iter()
            .map(|placeholder| placeholder.name)
            .collect();
        names.sort();
        names.dedup();
        if let (false, Some(name)) = (has_credentials, names.first()) {
            return Err(invalid(
                &key,
                format!(
                    "the secret ${name} is read from the credentials Secret (key {name}), and \
                     `spec.credentials.secretName` names none"
                ),
            ));
        }
        configurations.push(value.to_string());
        secrets.push(names);
    }
    Ok((configurations, secrets))
}

fn secret_name(name: &str) -> Result<String, InvalidSpec> {
    let subdomain = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if subdomain {
        Ok(name.to_owned())
    } else {
        Err(invalid(
            "spec.credentials.secretName",
            format!(
                "expected the name of a Secret (lowercase letters, digits, '-', '.'), got {name:?}"
            ),
        ))
    }
}

fn halt(spec: &HaltSpec) -> Result<Halt, InvalidSpec> {
    let seconds = |value: i64, key: &str| match u64::try_from(value) {
        Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
        _ => Err(invalid(
            key,
            format!("expected a positive whole number of seconds, got {value}"),
        )),
    };
    let quiet_window = seconds(spec.quiet_window, "spec.halt.quietWindow")?;
    let grace = seconds(spec.grace, "spec.halt.grace")?;
    if grace < quiet_window {
        return Err(invalid(
            "spec.halt.grace",
            format!(
                "expected at least quietWindow ({} s), since a halt waits that long for quiet, got {} s",
                spec.quiet_window, spec.grace
            ),
        ));
    }
    Ok(Halt {
        quiet_window,
        grace,
    })
}

/// toa-context names keys from the context's root (`atomicity.redis[1]`); here they sit under
/// `spec.context`. The odd-address message stays exactly as toa-context words it.
fn in_context(error: ContextError) -> InvalidSpec {
    match error {
        ContextError::Invalid { key, message } => invalid(&format!("spec.context.{key}"), message),
        other => InvalidSpec(other.to_string()),
    }
}

/// Worded as toa-context words its refusals.
fn invalid(key: &str, message: impl std::fmt::Display) -> InvalidSpec {
    InvalidSpec(format!("`{key}`: {message}"))
}

#[cfg(test)]
mod tests;
