//! The agent's command line, written once: the operator turns these structs into a container's
//! `command` (and its hooks'), the agent parses them with clap. A flag renamed on one side is a
//! compile error on the other, and `from(to_args(a)) == a` is tested.

use crate::control::LOCAL_PORT;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The agent's executable in its image.
pub const AGENT: &str = "toa-agent";

/// Where a local run reads its context.
pub const DEFAULT_CONTEXT: &str = "context.toa.yaml";
/// The environment a local run reads the context for.
pub const DEFAULT_ENVIRONMENT: &str = "local";

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], LOCAL_PORT))
}

/// The port component `index` (in the order of the agent's component arguments) serves when the
/// agent attaches from `first` (`--attach`): `first + index`, at most 65535.
pub fn attach_port(first: u16, index: usize) -> u16 {
    first.saturating_add(u16::try_from(index).unwrap_or(u16::MAX))
}

/// `toa-agent compose`: run components, start their programs (or attach to them), run their
/// lifecycle, route their calls.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct ComposeArgs {
    /// Component directories (each with a manifest.toa.yaml).
    #[arg(required = true)]
    pub components: Vec<PathBuf>,
    /// The application's context.
    #[arg(long, default_value = DEFAULT_CONTEXT, env = "TOA_CONTEXT")]
    pub context: PathBuf,
    /// The environment chain the context is read for, e.g. `dev` or `staging:production`.
    #[arg(long, default_value = DEFAULT_ENVIRONMENT, env = "TOA_ENV")]
    pub environment: String,
    /// Where the local API listens (a free port if taken, in a local run).
    #[arg(long, default_value_t = default_listen(), env = "TOA_AGENT_LISTEN")]
    pub listen: SocketAddr,
    /// Where the operator's control endpoint listens (halt, resume, status); none if not given.
    #[arg(long, env = "TOA_CONTROL_LISTEN", requires = "control_token_file")]
    pub control_listen: Option<SocketAddr>,
    /// The file holding the token every control request must carry.
    #[arg(long, env = "TOA_CONTROL_TOKEN_FILE")]
    pub control_token_file: Option<PathBuf>,
    /// Attach to programs started by someone else (a pod's component containers): component
    /// i (in the order given) serves 127.0.0.1:(PORT + i) ([`attach_port`]). Without it, compose
    /// starts them.
    #[arg(long, value_name = "PORT", env = "TOA_ATTACH")]
    pub attach: Option<u16>,
    /// Where the probes and metrics (/healthz, /readyz, /metrics; no token) listen on the pod
    /// network.
    #[arg(long, env = "TOA_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// A directory of other components' manifests (`<component>.yaml`), read again when it
    /// changes: calls to them are checked against their declarations.
    #[arg(long, value_name = "DIR", env = "TOA_DECLARATIONS")]
    pub declarations: Option<PathBuf>,
    /// In a pod: the digest ([`crate::control::drain_digest`]) of the drain key the kubelet's
    /// hooks present on the probe port. With it, only those hooks start the drain; the local
    /// API does not.
    #[arg(long, value_name = "HEX", env = "TOA_DRAIN_KEY_SHA256")]
    pub drain_key_sha256: Option<String>,
    /// In a pod: where each component's local API token goes (`DIR/<index>/token`, a volume
    /// mounted into that component's container only); its routes then take only that token.
    #[arg(long, value_name = "DIR", env = "TOA_COMPONENT_TOKENS")]
    pub component_tokens: Option<PathBuf>,
    /// A local run without `atomicity`: coordinate in this process only, apart from the other
    /// processes of the application on this machine (which otherwise form a group). Also
    /// `TOA_ALONE=true` (read by the agent's configuration, not here: a parsed command line
    /// stays what it says).
    #[arg(long)]
    pub alone: bool,
}

impl ComposeArgs {
    /// Only the components, every flag at its default.
    pub fn new(components: Vec<PathBuf>) -> Self {
        Self {
            components,
            context: PathBuf::from(DEFAULT_CONTEXT),
            environment: DEFAULT_ENVIRONMENT.to_owned(),
            listen: default_listen(),
            control_listen: None,
            control_token_file: None,
            attach: None,
            probe_listen: None,
            declarations: None,
            drain_key_sha256: None,
            component_tokens: None,
            alone: false,
        }
    }

    /// The command line, `toa-agent compose ...`: the listeners always (a pod's ports must not
    /// move with an agent's defaults), the rest where they differ from their defaults.
    pub fn command(&self) -> Vec<String> {
        let mut line = vec![AGENT.to_owned(), "compose".to_owned()];
        line.extend(self.components.iter().map(|dir| text(dir)));
        if self.context.as_os_str() != DEFAULT_CONTEXT {
            flag(&mut line, "--context", text(&self.context));
        }
        if self.environment != DEFAULT_ENVIRONMENT {
            flag(&mut line, "--environment", self.environment.clone());
        }
        flag(&mut line, "--listen", self.listen.to_string());
        optional(&mut line, "--control-listen", &self.control_listen);
        let token_file = self.control_token_file.as_deref().map(text);
        optional(&mut line, "--control-token-file", &token_file);
        optional(&mut line, "--attach", &self.attach);
        optional(&mut line, "--probe-listen", &self.probe_listen);
        let declarations = self.declarations.as_deref().map(text);
        optional(&mut line, "--declarations", &declarations);
        optional(&mut line, "--drain-key-sha256", &self.drain_key_sha256);
        let component_tokens = self.component_tokens.as_deref().map(text);
        optional(&mut line, "--component-tokens", &component_tokens);
        if self.alone {
            line.push("--alone".to_owned());
        }
        line
    }
}

fn text(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

fn flag(line: &mut Vec<String>, name: &str, value: String) {
    line.push(name.to_owned());
    line.push(value);
}

fn optional<T: ToString>(line: &mut Vec<String>, name: &str, value: &Option<T>) {
    if let Some(value) = value {
        flag(line, name, value.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{FromArgMatches, Parser, Subcommand};
    use proptest::prelude::*;

    /// The agent's parser, as far as these commands go.
    #[derive(Parser, Debug)]
    struct Agent {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Subcommand, Debug, PartialEq)]
    enum Command {
        Compose(ComposeArgs),
    }

    fn parse(line: &[String]) -> Command {
        let matches = <Agent as clap::CommandFactory>::command()
            .try_get_matches_from(line)
            .unwrap_or_else(|e| panic!("{line:?}: {e}"));
        Agent::from_arg_matches(&matches).unwrap().command
    }

    fn path() -> impl Strategy<Value = PathBuf> {
        "/[a-z][a-z0-9._-]{0,12}(/[a-z0-9][a-z0-9._-]{0,8}){0,2}".prop_map(PathBuf::from)
    }

    fn address() -> impl Strategy<Value = SocketAddr> {
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port)))
    }

    fn compose() -> impl Strategy<Value = ComposeArgs> {
        (
            prop::collection::vec(path(), 1..4),
            prop::option::of(path()),
            prop::option::of("[a-z]{1,8}(:[a-z]{1,8})?"),
            prop::option::of(address()),
            prop::option::of((address(), path())),
            prop::option::of(any::<u16>()),
            prop::option::of(address()),
            prop::option::of(path()),
            (
                prop::option::of("[0-9a-f]{64}"),
                prop::option::of(path()),
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    components,
                    context,
                    environment,
                    listen,
                    control,
                    attach,
                    probe,
                    decl,
                    (digest, tokens, alone),
                )| {
                    let mut args = ComposeArgs::new(components);
                    args.context = context.unwrap_or(args.context);
                    args.environment = environment.unwrap_or(args.environment);
                    args.listen = listen.unwrap_or(args.listen);
                    args.control_listen = control.as_ref().map(|(address, _)| *address);
                    args.control_token_file = control.map(|(_, file)| file);
                    args.attach = attach;
                    args.probe_listen = probe;
                    args.declarations = decl;
                    args.drain_key_sha256 = digest;
                    args.component_tokens = tokens;
                    args.alone = alone;
                    args
                },
            )
    }

    proptest! {
        #[test]
        fn compose_reads_back_what_the_operator_writes(args in compose()) {
            prop_assert_eq!(parse(&args.command()), Command::Compose(args));
        }
    }

    #[test]
    fn the_defaults_are_left_out() {
        let args = ComposeArgs::new(vec![PathBuf::from("/components/a")]);
        assert_eq!(
            args.command(),
            [
                "toa-agent",
                "compose",
                "/components/a",
                "--listen",
                "127.0.0.1:7090"
            ]
        );
    }
}
