//! Renders a Composition from an application's files: `context.toa.yaml` resolved for one
//! environment chain (`key@env`, with toa-context) and each component's `manifest.toa.yaml`. The
//! result is checked exactly as the operator checks it at reconcile time, so what renders applies.

use crate::crd::{ComponentSpec, Composition, CompositionSpec, ContextSpec, CredentialsSpec};
use crate::manifest::{self, ReadError};
use crate::validate::{validate, InvalidSpec};
use std::path::{Path, PathBuf};
use toa_context::{Context, ContextError, Environment};

/// What to render.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The application's `context.toa.yaml`.
    pub context: PathBuf,
    /// The environment chain, most specific first: `staging:production`.
    pub environment: String,
    pub image: String,
    /// Component directories (each holding `manifest.toa.yaml`) or manifest files.
    pub components: Vec<PathBuf>,
    /// `metadata.name`; the application's name when absent.
    pub name: Option<String>,
    /// `metadata.namespace`; left out when absent, so `kubectl` uses its current namespace.
    pub namespace: Option<String>,
    pub replicas: i32,
    /// `spec.credentials.secretName`.
    pub credentials: Option<String>,
}

/// Why nothing was rendered. Each names the file or option at fault and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{0}")]
    Environment(#[source] ContextError),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Context {
        path: PathBuf,
        #[source]
        source: ContextError,
    },
    #[error("expected at least one component (--component DIR)")]
    NoComponents,
    #[error(transparent)]
    Manifest(#[from] ReadError),
    #[error("`{option}`: expected {expected}, got {given:?}")]
    Option {
        option: &'static str,
        expected: &'static str,
        given: String,
    },
    #[error("the Composition would be refused: {0}")]
    Invalid(#[source] InvalidSpec),
}

/// Reads the files and builds the Composition.
pub fn render(options: &Options) -> Result<Composition, RenderError> {
    let environment = Environment::parse(&options.environment).map_err(RenderError::Environment)?;
    let context = read_context(&options.context, &environment)?;
    if options.components.is_empty() {
        return Err(RenderError::NoComponents);
    }
    let configuration = read_configuration(&options.context, &environment)?;
    let components = options
        .components
        .iter()
        .map(|path| {
            let read = manifest::read(path)?;
            let name = read.manifest.full_name();
            Ok(ComponentSpec {
                configuration: configuration
                    .get(&name)
                    .and_then(|values| values.as_object().cloned()),
                name,
                manifest: read.object,
                resources: None,
                env: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, RenderError>>()?;
    let spec = CompositionSpec {
        application: context.name.clone(),
        image: options.image.clone(),
        replicas: options.replicas,
        resources: None,
        components,
        context: ContextSpec::from(&context),
        credentials: options
            .credentials
            .as_ref()
            .map(|secret_name| CredentialsSpec {
                secret_name: secret_name.clone(),
            }),
        storage: None,
        halted: false,
        halt: None,
        security_context: None,
        logs: None,
        traces: None,
        disruption_budget: None,
        pod: None,
    };
    validate(&spec).map_err(RenderError::Invalid)?;

    let name = options.name.clone().unwrap_or_else(|| context.name.clone());
    dns_name(&name, "--name", Dns::Subdomain)?;
    if let Some(namespace) = &options.namespace {
        dns_name(namespace, "--namespace", Dns::Label)?;
    }
    let mut composition = Composition::new(&name, spec);
    composition.metadata.namespace = options.namespace.clone();
    Ok(composition)
}

/// The Composition as YAML for `kubectl apply -f -`, with a comment saying where it came from.
pub fn to_yaml(composition: &Composition, options: &Options) -> String {
    let body = serde_yaml::to_string(composition).expect("a Composition serializes to YAML");
    format!(
        "# Rendered by `toa-operator render` from {} for the environment {}.\n{body}",
        options.context.display(),
        options.environment
    )
}

fn read_context(path: &Path, environment: &Environment) -> Result<Context, RenderError> {
    let yaml = std::fs::read_to_string(path).map_err(|source| RenderError::Read {
        path: path.to_owned(),
        source,
    })?;
    Context::parse(&yaml, environment).map_err(|source| RenderError::Context {
        path: path.to_owned(),
        source,
    })
}

/// The context's `configuration` section (read again: [`read_context`] has just read the file).
fn read_configuration(
    path: &Path,
    environment: &Environment,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, RenderError> {
    let yaml = std::fs::read_to_string(path).map_err(|source| RenderError::Read {
        path: path.to_owned(),
        source,
    })?;
    toa_context::configuration::read(&yaml, environment).map_err(|source| RenderError::Context {
        path: path.to_owned(),
        source,
    })
}

/// Kubernetes' rules for object names (subdomains) and namespaces (labels).
enum Dns {
    Subdomain,
    Label,
}

fn dns_name(text: &str, option: &'static str, rule: Dns) -> Result<(), RenderError> {
    let label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let (valid, expected) = match rule {
        Dns::Subdomain => (
            text.len() <= 253 && text.split('.').all(label),
            "a DNS subdomain: lowercase letters, digits, '-' and '.'",
        ),
        Dns::Label => (
            label(text),
            "a DNS label: at most 63 lowercase letters, digits and '-'",
        ),
    };
    if valid {
        Ok(())
    } else {
        Err(RenderError::Option {
            option,
            expected,
            given: text.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
