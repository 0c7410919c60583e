//! `toa-agent`: the process beside every component.
//!
//!   toa-agent compose DIR...            run components locally
//!   toa-agent call COMPONENT.OPERATION '{ input: {...} }'
//!   toa-agent demo                      the examples' flows, end to end
//!   toa-agent drain                     drain a local composition: dispose, then exit
//!   toa-agent storage ddl --application NAME DIR...   the entities' tables, as SQL
//!   toa-agent requeue COMPONENT         dead-lettered events back to their receivers

// Functions stay short (clippy.toml: at most 60 lines): each says one step.
#![warn(clippy::too_many_lines)]

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use toa_agent::compose;
use toa_context::agent_args::ComposeArgs;
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
    #[command(flatten)]
    logs: toa_context::logs::LogArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run components locally: start their programs, run their lifecycle, route their calls.
    Compose(ComposeArgs),
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
    /// Drain a composition running locally: stop taking calls, run dispose; returns when done.
    /// (In a pod the kubelet's hooks drain it.)
    Drain {
        /// The agent's local API.
        #[arg(long, default_value_t = format!("http://127.0.0.1:{LOCAL_PORT}"), env = "TOA_AGENT")]
        agent: String,
    },
    /// Send the events a receiving component dead-lettered back to its receivers' queue.
    Requeue {
        /// The receiving component: `namespace.name`.
        component: String,
        /// The application's context (in a pod: its `TOA_*` variables instead).
        #[arg(long, default_value = toa_context::agent_args::DEFAULT_CONTEXT, env = "TOA_CONTEXT")]
        context: std::path::PathBuf,
        /// The environment chain the context is read for.
        #[arg(long, default_value = toa_context::agent_args::DEFAULT_ENVIRONMENT, env = "TOA_ENV")]
        environment: String,
    },
    /// The entities' store (PostgreSQL).
    Storage {
        #[command(subcommand)]
        command: StorageCommand,
    },
}

#[derive(Subcommand)]
enum StorageCommand {
    /// Print the SQL that makes the tables of the components' entities (the agent runs it at
    /// start; a DBA or a Job runs it where the agent's role may not create tables).
    Ddl {
        /// The application's name (the context's `name`).
        #[arg(long)]
        application: String,
        /// In a pod: the Kubernetes namespace, which the application's shared name carries.
        #[arg(long)]
        namespace: Option<String>,
        /// The components' directories.
        #[arg(required = true)]
        components: Vec<std::path::PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    args.logs.init();
    match args.command {
        Command::Demo => demo::run().await,
        Command::Drain { agent } => call::drain(&agent).await,
        Command::Call {
            target,
            request,
            agent,
            task,
        } => call::run(&target, &request, &agent, task).await,
        Command::Compose(args) => compose(args).await,
        Command::Requeue {
            component,
            context,
            environment,
        } => match toa_agent::requeue::run(&component, &context, &environment).await {
            Ok(moved) => {
                println!("{moved} events of {component} sent back to its receivers");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("{message}");
                ExitCode::FAILURE
            }
        },
        Command::Storage {
            command:
                StorageCommand::Ddl {
                    application,
                    namespace,
                    components,
                },
        } => {
            let shared = toa_context::annotations::shared_name(&application, namespace.as_deref());
            match toa_agent::storage_ddl(&shared, &components) {
                Ok(sql) => {
                    print!("{sql}");
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    eprintln!("{message}");
                    ExitCode::from(USAGE)
                }
            }
        }
    }
}

/// Configuration first (exit 64 naming what is wrong, before anything starts), then the run.
async fn compose(args: ComposeArgs) -> ExitCode {
    let options = match toa_agent::config::options(args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(USAGE);
        }
    };
    // Spans, when an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT).
    let traces = toa_agent::traces::Settings::from_env(
        |name| std::env::var(name).ok(),
        options.instance.as_str(),
        &options.context.name,
    );
    match traces {
        Ok(Some(settings)) => toa_agent::traces::start(settings),
        Ok(None) => {}
        Err(error) => {
            eprintln!("toa-agent compose: {error}");
            return ExitCode::from(USAGE);
        }
    }
    match compose::run(options, compose::signals()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "composition failed");
            ExitCode::FAILURE
        }
    }
}
