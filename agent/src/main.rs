//! `toa-agent`: the process beside every component.
//!
//!   toa-agent compose DIR...            run components locally
//!   toa-agent call COMPONENT.OPERATION '{ input: {...} }'
//!   toa-agent demo                      the examples' flows, end to end
//!   toa-agent drain                     drain the running composition (the agent's preStop)
//!   toa-agent listening ADDRESS...      wait until the agent's listeners accept (its postStart)

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use toa_agent::compose::{self, Options};
use toa_agent::config::{compose_options, read_token};
use toa_context::control::LOCAL_PORT;

mod call;
mod demo;

/// Exit code for bad usage or configuration (EX_USAGE).
const USAGE: u8 = 64;

#[derive(Parser)]
#[command(
    name = "toa-agent",
    version,
    about = "The agent beside every toa component"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run components locally: start their programs, run their lifecycle, route their calls.
    Compose {
        /// Component directories (each with a manifest.toa.yaml).
        #[arg(required = true)]
        components: Vec<PathBuf>,
        /// The application's context.
        #[arg(long, default_value = "context.toa.yaml", env = "TOA_CONTEXT")]
        context: PathBuf,
        /// The environment chain the context is read for, e.g. `dev` or `staging:production`.
        #[arg(long, default_value = "local", env = "TOA_ENV")]
        environment: String,
        /// Where the local API listens (a free port if taken).
        #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], LOCAL_PORT)), env = "TOA_AGENT_LISTEN")]
        listen: SocketAddr,
        /// Where the operator's control endpoint listens (halt, resume, status); none if not given.
        #[arg(long, env = "TOA_CONTROL_LISTEN", requires = "control_token_file")]
        control_listen: Option<SocketAddr>,
        /// The file holding the token every control request must carry.
        #[arg(long, env = "TOA_CONTROL_TOKEN_FILE")]
        control_token_file: Option<PathBuf>,
        /// Attach to programs started by someone else (a pod's component containers): component
        /// i (in the order given) serves 127.0.0.1:(PORT + i). Without it, compose starts them.
        #[arg(long, value_name = "PORT", env = "TOA_ATTACH")]
        attach: Option<u16>,
        /// Where the probes and metrics (/healthz, /readyz, /metrics; no token) listen on the pod
        /// network.
        #[arg(long, env = "TOA_PROBE_LISTEN")]
        probe_listen: Option<SocketAddr>,
        /// A directory of other components' manifests (`<component>.yaml`), read again when it
        /// changes: calls to them are checked against their declarations.
        #[arg(long, value_name = "DIR", env = "TOA_DECLARATIONS")]
        declarations: Option<PathBuf>,
    },
    /// Call an operation of a running composition: `store.catalog.appraise '{ input: {...} }'`.
    Call {
        /// `namespace.component.operation`.
        target: String,
        /// The request, in JSON or YAML flow syntax: `{ input: { customer: c1 } }`.
        #[arg(default_value = "{}")]
        request: String,
        /// The agent's local API.
        #[arg(long, default_value_t = format!("http://127.0.0.1:{LOCAL_PORT}"), env = "TOA_AGENT")]
        agent: String,
        /// Send it as a task: answered `{"reply": null}` once the broker took it.
        #[arg(long)]
        task: bool,
    },
    /// Compose the examples and run their flows: meter, lock, a pulse with slots, then drain.
    Demo,
    /// Drain the running composition (the agent container's preStop hook): stop taking calls,
    /// run dispose; returns when done.
    Drain {
        /// The agent's local API.
        #[arg(long, default_value_t = format!("http://127.0.0.1:{LOCAL_PORT}"), env = "TOA_AGENT")]
        agent: String,
        /// The control token, from which the drain key a pod's agent asks for is derived.
        #[arg(long, env = "TOA_CONTROL_TOKEN_FILE")]
        control_token_file: Option<PathBuf>,
    },
    /// Wait until every ADDRESS accepts connections: the plain sidecar's
    /// postStart hook, which holds the component containers back until the agent's listeners
    /// are bound.
    Listening {
        #[arg(required = true)]
        addresses: Vec<SocketAddr>,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 60)]
        within: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    toa_agent::telemetry::init();
    let args = Args::parse();
    match args.command {
        Command::Demo => demo::run().await,
        Command::Drain {
            agent,
            control_token_file,
        } => {
            let key = match control_token_file.as_ref().map(read_token).transpose() {
                Ok(token) => token.map(|token| toa_context::control::drain_key(&token)),
                Err(message) => {
                    eprintln!("{message}");
                    return ExitCode::from(USAGE);
                }
            };
            call::drain(&agent, key.as_deref()).await
        }
        Command::Listening { addresses, within } => {
            call::listening(&addresses, std::time::Duration::from_secs(within)).await
        }
        Command::Call {
            target,
            request,
            agent,
            task,
        } => call::run(&target, &request, &agent, task).await,
        Command::Compose {
            components,
            context,
            environment,
            listen,
            control_listen,
            control_token_file,
            attach,
            probe_listen,
            declarations,
        } => {
            let control = match (control_listen, control_token_file) {
                (Some(address), Some(file)) => match read_token(&file) {
                    Ok(token) => Some((address, token)),
                    Err(message) => {
                        eprintln!("{message}");
                        return ExitCode::from(USAGE);
                    }
                },
                _ => None,
            };
            let options = match compose_options(components, &context, &environment, listen, control)
            {
                Ok(options) => Options {
                    attach,
                    probe: probe_listen,
                    declarations,
                    ..options
                },
                Err(message) => {
                    eprintln!("{message}");
                    return ExitCode::from(USAGE);
                }
            };
            match compose::run(options, compose::signals()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "composition failed");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
