//! The command line. `render` is the only command so far; the controller's `run` comes with it.

use crate::render;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "toa-operator",
    version,
    about = "The Kubernetes operator for toa Compositions."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a Composition rendered from context.toa.yaml and component manifests, for
    /// `kubectl apply -f -`.
    Render(RenderArgs),
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// The application's context file.
    #[arg(long, value_name = "PATH", default_value = "context.toa.yaml")]
    pub context: PathBuf,
    /// The environment chain, most specific first (`staging:production`); selects `key@env`.
    #[arg(long, short = 'e', value_name = "ENV")]
    pub environment: String,
    /// The image that runs the components.
    #[arg(long, value_name = "IMAGE")]
    pub image: String,
    /// A component directory holding manifest.toa.yaml (or the manifest file); repeatable.
    #[arg(long = "component", value_name = "DIR", required = true, num_args = 1..)]
    pub components: Vec<PathBuf>,
    /// The Composition's name [default: the application's name].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The Composition's namespace [default: kubectl's current namespace].
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// How many pods run the composition.
    #[arg(long, default_value_t = crate::crd::DEFAULT_REPLICAS)]
    pub replicas: i32,
    /// A Secret holding redis-username, redis-password, amqp-username, amqp-password.
    #[arg(long, value_name = "SECRET")]
    pub credentials: Option<String>,
}

impl RenderArgs {
    pub fn into_options(self) -> render::Options {
        // Destructured so that a new argument that is not passed on fails to compile.
        let Self {
            context,
            environment,
            image,
            components,
            name,
            namespace,
            replicas,
            credentials,
        } = self;
        render::Options {
            context,
            environment,
            image,
            components,
            name,
            namespace,
            replicas,
            credentials,
        }
    }
}
