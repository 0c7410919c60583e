//! Configuration first: every flag and `TOA_*` variable of `toa-agent compose` is read and
//! checked here, into [`Options`], before anything binds or starts; `main` exits 64 (EX_USAGE)
//! with the message when something is wrong, before any program runs.

use crate::calls::broker::{BrokerError, Tuning};
use crate::control::tokens::{TokenFileError, Tokens};
use crate::coordination::atom::Mode;
use crate::instance::{Instance, InvalidInstance};
use crate::process::compose::{BrokerConfig, Control, Options};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use toa_context::agent_args::ComposeArgs;
use toa_context::annotations::shared_name;
use toa_context::tls::Roots;
use toa_context::{Context, ContextError, Credentials, Environment, ProcessVars};

/// What is wrong with `compose`'s configuration: printed as it is, and the process exits 64.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    ControlTokens(#[from] TokenFileError),
    #[error("--drain-key-sha256: expected 64 hex digits (a SHA-256), got {length} characters")]
    DrainDigest { length: usize },
    #[error("TOA_ALONE: expected true or false, got {0:?}")]
    Alone(String),
    /// The environment, the context from `TOA_*` variables, or the credentials.
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("{}: {error}", path.display())]
    ContextFileUnreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {error}", path.display())]
    ContextFile { path: PathBuf, error: ContextError },
    #[error(transparent)]
    Instance(#[from] InvalidInstance),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(
        "`TOA_AMQP_USERNAME`, `TOA_AMQP_PASSWORD`: in a pod the broker takes the credentials \
         Secret's `amqp-username` and `amqp-password` (spec.credentials.secretName), and one of \
         them is missing; guest/guest is for local runs"
    )]
    BrokerCredentials,
    #[error(
        "`TOA_KUBERNETES_NAMESPACE`: in a pod the operator sets it to the pod's namespace (the \
         downward API), which the application's queues and Redis keys carry so that two \
         namespaces never meet; it is missing or empty"
    )]
    KubernetesNamespace,
}

/// `toa-agent compose`'s flags and the process's `TOA_*` variables, every one checked before
/// anything starts.
pub fn options(args: ComposeArgs) -> Result<Options, ConfigError> {
    let control = match (args.control_listen, &args.control_token_file) {
        (Some(address), Some(file)) => Some(Control {
            address,
            tokens: Tokens::read(file)?,
            file: file.clone(),
        }),
        _ => None,
    };
    let mut options = compose_options(
        args.components,
        &args.context,
        &args.environment,
        args.listen,
        control,
    )?;
    options.attach = args.attach;
    options.probe = args.probe_listen;
    options.declarations = args.declarations;
    options.drain_digest = args.drain_key_sha256.map(drain_digest).transpose()?;
    options.component_tokens = args.component_tokens;
    let alone = args.alone || alone_from_env()?;
    options.group = local_group(&options, &args.context, alone);
    Ok(options)
}

/// `TOA_ALONE`: `true`/`1`/`yes` or `false`/`0`/`no` (unset or empty: false).
fn alone_from_env() -> Result<bool, ConfigError> {
    let value = std::env::var("TOA_ALONE").unwrap_or_default();
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" | "" => Ok(false),
        _ => Err(ConfigError::Alone(value)),
    }
}

/// A local run without `atomicity` joins its application's local group (docs/context.md):
/// `TOA_LOCAL_GROUP` names it, else the application's name and the context file's absolute path
/// (one project's processes meet, another checkout's do not). None `--alone`, in a pod, or with
/// `atomicity` (Redis is shared already).
fn local_group(options: &Options, context: &std::path::Path, alone: bool) -> Option<String> {
    if alone || options.mode != Mode::Local || options.context.atomicity.is_some() {
        return None;
    }
    if let Some(name) = std::env::var("TOA_LOCAL_GROUP")
        .ok()
        .filter(|n| !n.is_empty())
    {
        return Some(name);
    }
    let path = std::path::absolute(context).unwrap_or_else(|_| context.to_path_buf());
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    Some(format!("{} {}", options.context.name, path.display()))
}

/// `--drain-key-sha256`: 64 hex digits.
fn drain_digest(text: String) -> Result<String, ConfigError> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(ConfigError::DrainDigest { length: text.len() })
    }
}

fn compose_options(
    components: Vec<PathBuf>,
    path: &PathBuf,
    environment: &str,
    listen: SocketAddr,
    control: Option<Control>,
) -> Result<Options, ConfigError> {
    let environment = Environment::parse(environment)?;
    // In a pod the operator gives the context as `TOA_*` variables (docs/context.md): they are the
    // whole context, and the process is a pod (no in-process coordination without atomicity).
    // In a pod the operator gives each component container its configuration itself.
    let (context, mode, configuration) = if std::env::var_os("TOA_APPLICATION").is_some() {
        let context = Context::from_vars(&ProcessVars)?;
        (context, Mode::Pod, Default::default())
    } else {
        let (context, configuration) = context_file(path, &environment)?;
        (context, Mode::Local, configuration)
    };
    let credentials = Credentials::from_vars(&ProcessVars, "TOA_REDIS")?;
    let instance = Instance::from_env(std::env::var("TOA_INSTANCE").ok())?;
    // What `rediss://` and `amqps://` trust.
    let roots = Roots::from_vars(&ProcessVars)?;
    let kubernetes_namespace = kubernetes_namespace(mode)?;
    let shared = shared_name(&context.name, kubernetes_namespace.as_deref());
    let storage = storage(&context, &shared)?;
    let broker = broker(&context, mode, (shared, &roots))?;
    Ok(Options {
        broker,
        context,
        credentials,
        components,
        listen,
        instance,
        on_ready: None,
        control,
        attach: None,
        probe: None,
        declarations: None,
        drain_digest: None,
        component_tokens: None,
        group: None,
        mode,
        configuration,
        kubernetes_namespace,
        roots,
        storage,
    })
}

/// The store the context names (`storage`), with `TOA_STORAGE_USERNAME` and
/// `TOA_STORAGE_PASSWORD` (or `..._FILE`); its objects under the application's shared name.
fn storage(
    context: &Context,
    application: &str,
) -> Result<Option<crate::entities::backend::Storage>, ConfigError> {
    let Some(address) = &context.storage else {
        return Ok(None);
    };
    let credentials = Credentials::from_vars(&ProcessVars, "TOA_STORAGE")?;
    let roots = Roots::storage_from_vars(&ProcessVars)?;
    Ok(Some(crate::entities::backend::Storage {
        address: crate::entities::postgres::Address {
            host: address.host.clone(),
            port: address.port,
            database: address.database.clone(),
            username: credentials.username,
            password: credentials.password,
            ca: roots.and_then(|roots| roots.pem().map(str::to_owned)),
        },
        application: application.to_owned(),
    }))
}

/// In a pod, its Kubernetes namespace (required); in a local run, none.
fn kubernetes_namespace(mode: Mode) -> Result<Option<String>, ConfigError> {
    if mode == Mode::Local {
        return Ok(None);
    }
    let namespace = std::env::var(toa_context::annotations::KUBERNETES_NAMESPACE).ok();
    match namespace.filter(|namespace| !namespace.is_empty()) {
        Some(namespace) => Ok(Some(namespace)),
        None => Err(ConfigError::KubernetesNamespace),
    }
}

/// A local run's context file: the context and its `configuration` section.
fn context_file(
    path: &PathBuf,
    environment: &Environment,
) -> Result<(Context, BTreeMap<String, Value>), ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        // Without a context file, a local application named `local` with nothing configured;
        // said, so that a file in another directory than the one meant is noticed.
        Err(error)
            if error.kind() == std::io::ErrorKind::NotFound
                && path.as_os_str() == "context.toa.yaml" =>
        {
            let here = std::env::current_dir().map(|dir| dir.display().to_string());
            let here = here.unwrap_or_default();
            tracing::warn!(directory = %here, "no context.toa.yaml here: the application is named `local`, with the embedded coordination and store, no broker, and the limits' defaults (--context names another file)");
            "name: local\n".to_owned()
        }
        Err(error) => {
            return Err(ConfigError::ContextFileUnreadable {
                path: path.clone(),
                error,
            })
        }
    };
    let in_file = |error| ConfigError::ContextFile {
        path: path.clone(),
        error,
    };
    let context = Context::parse(&text, environment).map_err(in_file)?;
    let configuration = toa_context::configuration::read(&text, environment).map_err(in_file)?;
    Ok((context, configuration))
}

/// The broker's credentials and tuning, only when there is a broker. In a pod both credentials
/// are required: without them the client would log in as guest/guest, which a local RabbitMQ
/// takes and a shared one must not (a local run keeps that default).
fn broker(
    context: &Context,
    mode: Mode,
    (application, roots): (String, &Roots),
) -> Result<Option<BrokerConfig>, ConfigError> {
    let Some(_) = context.amqp else {
        return Ok(None);
    };
    let credentials = Credentials::from_vars(&ProcessVars, "TOA_AMQP")?;
    if mode == Mode::Pod && (credentials.username.is_none() || credentials.password.is_none()) {
        return Err(ConfigError::BrokerCredentials);
    }
    Ok(Some(BrokerConfig {
        application,
        credentials,
        roots: roots.clone(),
        tuning: Tuning::from_env()?,
    }))
}
