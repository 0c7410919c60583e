//! The command line: `render` (a Composition from an application's files) and `run` (the
//! controller).

use crate::render;
use crate::run;
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::net::SocketAddr;
use std::path::PathBuf;
use toa_context::network::{networks, Network};

#[derive(Debug, Parser)]
#[command(
    name = "toa-operator",
    version,
    about = "The Kubernetes operator for toa Compositions."
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub logs: toa_context::logs::LogArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a Composition rendered from context.toa.yaml and component manifests, for
    /// `kubectl apply -f -`.
    Render(RenderArgs),
    /// Run the controller: watch Compositions and run their Deployments, halts and status.
    Run(RunArgs),
    /// Ask a plain-HTTP URL (an operator's /ready) every 2 s until it answers 200; exit 1 when
    /// it has not within the timeout. The chart's `helm test` runs it.
    Probe(ProbeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// `http://HOST:PORT/PATH`.
    pub url: String,
    /// How long to keep asking, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub timeout: u64,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The image holding `toa-agent`, run beside every component.
    #[arg(long, env = "TOA_AGENT_IMAGE", value_name = "IMAGE")]
    pub agent_image: String,
    /// The agent container's requests and limits, as JSON (the chart's `agentResources`).
    #[arg(
        long,
        env = "TOA_AGENT_RESOURCES",
        value_name = "JSON",
        default_value = DEFAULT_AGENT_RESOURCES
    )]
    pub agent_resources: String,
    /// Where /health, /ready and /metrics are served.
    #[arg(
        long,
        env = "TOA_METRICS_LISTEN",
        value_name = "ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_listen: SocketAddr,
    /// Leader election on a Lease; `off` only when a single replica runs.
    #[arg(long, env = "TOA_LEADER_ELECTION", value_enum, default_value_t = OnOff::On)]
    pub leader_election: OnOff,
    /// The Lease's name.
    #[arg(long, env = "TOA_LEASE_NAME", default_value = "toa-operator")]
    pub lease_name: String,
    /// The Lease's namespace [default: the operator's own namespace].
    #[arg(long, env = "TOA_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// This replica's name in the Lease [default: $POD_NAME, else $HOSTNAME].
    #[arg(long, env = "TOA_LEASE_IDENTITY")]
    pub lease_identity: Option<String>,
    /// The operator's pods, `NAMESPACE/KEY=VALUE,KEY=VALUE`: each Composition gets a
    /// NetworkPolicy that lets only them reach its agents' control port. Without it, none.
    #[arg(long, env = "TOA_CONTROL_FROM", value_name = "NAMESPACE/LABELS")]
    pub control_from: Option<String>,
    /// Where the Compositions' pods may connect, as a JSON list of NetworkPolicy egress rules
    /// (`[{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5672}]}]`): with any,
    /// the NetworkPolicy of `--control-from` restricts egress to them and DNS. Without, egress
    /// is not restricted.
    #[arg(long, env = "TOA_EGRESS_RULES", value_name = "JSON")]
    pub egress_rules: Option<String>,
    /// Address ranges the kubelet connects to pods from besides the node's own addresses and
    /// the pod's gateway (`CIDR,CIDR`: OVN-Kubernetes' join subnet, a second network card): the
    /// agents take drain hooks from them too.
    #[arg(long, env = "TOA_NODE_NETWORKS", value_name = "CIDR,CIDR")]
    pub node_networks: Option<String>,
    /// The Secret holding the operator's key (`current`, and `previous` while it rotates), from
    /// which every Composition's control token is derived; created when missing.
    #[arg(long, env = "TOA_KEY_SECRET", default_value = "toa-operator-key")]
    pub key_secret: String,
    /// The key Secret's namespace [default: the operator's own namespace].
    #[arg(long, env = "TOA_KEY_NAMESPACE")]
    pub key_namespace: Option<String>,
    /// Watch only these namespaces' Compositions (a namespaced install, with Roles there);
    /// every namespace when not given.
    #[arg(
        long,
        env = "TOA_WATCH_NAMESPACES",
        value_name = "NS,NS",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,
}

/// The agent's requests and limits unless the chart says otherwise: it idles at about 11 MB and
/// stays under 20 MB under load (docs/benchmarks.md); no CPU limit, which would throttle the
/// lock's and the heartbeats' timing.
pub const DEFAULT_AGENT_RESOURCES: &str =
    r#"{"requests":{"cpu":"50m","memory":"32Mi"},"limits":{"memory":"128Mi"}}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// A `run` setting that was refused: what and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{option}`: expected {expected}, got {given:?}")]
pub struct RunArgsError {
    pub option: &'static str,
    pub expected: &'static str,
    pub given: String,
}

impl RunArgs {
    /// Checks the settings, each by a function of its own; `vars` reads the environment
    /// (`POD_NAME`, `HOSTNAME`).
    pub fn into_config(
        self,
        vars: impl Fn(&str) -> Option<String>,
    ) -> Result<run::Config, RunArgsError> {
        // Destructured so that a new argument that is not passed on fails to compile.
        let Self {
            agent_image,
            agent_resources,
            metrics_listen,
            leader_election,
            lease_name,
            lease_namespace,
            lease_identity,
            control_from,
            egress_rules,
            node_networks,
            key_secret,
            key_namespace,
            watch_namespaces,
        } = self;
        let agent_image = image_of(agent_image)?;
        let agent_resources = resources_of(agent_resources)?;
        let lease = match leader_election {
            OnOff::Off => None,
            OnOff::On => Some(lease_of(lease_name, lease_namespace, lease_identity, vars)?),
        };
        let control_from = control_from.map(control_from_of).transpose()?;
        let egress = egress_of(egress_rules, control_from.is_some())?;
        let node_networks = node_networks_of(node_networks.unwrap_or_default())?;
        let key = run::KeySettings {
            secret: key_secret_of(key_secret)?,
            namespace: key_namespace,
        };
        Ok(run::Config {
            agent_image,
            agent_resources,
            metrics_listen,
            lease,
            control_from,
            egress,
            node_networks,
            key,
            watch_namespaces: namespaces_of(watch_namespaces)?,
        })
    }
}

/// `--agent-image`: an image reference (no blanks).
fn image_of(given: String) -> Result<String, RunArgsError> {
    if given.is_empty() || given.chars().any(char::is_whitespace) {
        return Err(RunArgsError {
            option: "--agent-image",
            expected: "an image reference such as registry.example.com/toa-agent:0.1",
            given,
        });
    }
    Ok(given)
}

/// `--agent-resources`: requests and limits as JSON.
fn resources_of(given: String) -> Result<ResourceRequirements, RunArgsError> {
    resources(&given).ok_or(RunArgsError {
        option: "--agent-resources",
        expected: r#"requests and limits as JSON, e.g. {"requests":{"cpu":"50m","memory":"32Mi"},"limits":{"memory":"128Mi"}}"#,
        given,
    })
}

/// The Lease, with leader election on: its name, and this replica's identity (`--lease-identity`,
/// else `$POD_NAME`, else `$HOSTNAME`).
fn lease_of(
    name: String,
    namespace: Option<String>,
    identity: Option<String>,
    vars: impl Fn(&str) -> Option<String>,
) -> Result<run::LeaseSettings, RunArgsError> {
    let identity = identity
        .or_else(|| vars("POD_NAME"))
        .or_else(|| vars("HOSTNAME"))
        .filter(|identity| !identity.is_empty())
        .ok_or_else(|| RunArgsError {
            option: "--lease-identity",
            expected: "this replica's name (or $POD_NAME or $HOSTNAME set)",
            given: String::new(),
        })?;
    if name.is_empty() {
        return Err(RunArgsError {
            option: "--lease-name",
            expected: "the name of a Lease",
            given: name,
        });
    }
    Ok(run::LeaseSettings {
        name,
        namespace,
        identity,
    })
}

/// `--egress-rules`: a JSON list of NetworkPolicy egress rules, for the policy `--control-from`
/// makes (without it there is none to put them in).
fn egress_of(
    given: Option<String>,
    policy: bool,
) -> Result<Vec<k8s_openapi::api::networking::v1::NetworkPolicyEgressRule>, RunArgsError> {
    let Some(given) = given else {
        return Ok(Vec::new());
    };
    let refused = |expected| RunArgsError {
        option: "--egress-rules",
        expected,
        given: given.clone(),
    };
    if !policy {
        return Err(refused(
            "rules only with --control-from, whose NetworkPolicy they go into",
        ));
    }
    serde_json::from_str(&given).map_err(|_| {
        refused("a JSON list of NetworkPolicy egress rules, [{\"to\": [...], \"ports\": [...]}]")
    })
}

/// `--node-networks`: comma-separated address ranges.
fn node_networks_of(given: String) -> Result<Vec<Network>, RunArgsError> {
    networks(&given).map_err(|_| RunArgsError {
        option: "--node-networks",
        expected: "address ranges such as 100.64.0.0/16,fd98::/64",
        given,
    })
}

/// `--control-from`: `NAMESPACE/KEY=VALUE[,KEY=VALUE...]`.
fn control_from_of(given: String) -> Result<crate::desired::ControlFrom, RunArgsError> {
    parse_control_from(&given).ok_or(RunArgsError {
        option: "--control-from",
        expected: "the operator's namespace and pod labels, NAMESPACE/KEY=VALUE[,KEY=VALUE...]",
        given,
    })
}

/// `--key-secret`: a Secret's name.
fn key_secret_of(given: String) -> Result<String, RunArgsError> {
    if given.is_empty() {
        return Err(RunArgsError {
            option: "--key-secret",
            expected: "the name of the Secret holding the operator's key",
            given,
        });
    }
    Ok(given)
}

/// `--watch-namespaces`: namespace names, each once (a namespace named twice would get two
/// controllers reconciling the same objects).
fn namespaces_of(given: Vec<String>) -> Result<Vec<String>, RunArgsError> {
    let mut seen = std::collections::BTreeSet::new();
    if let Some(bad) = given
        .iter()
        .find(|ns| !is_dns_label(ns) || !seen.insert(ns.as_str()))
    {
        return Err(RunArgsError {
            option: "--watch-namespaces",
            expected: "namespace names, each once, separated by commas",
            given: bad.clone(),
        });
    }
    Ok(given)
}

/// A namespace's name: a DNS label (RFC 1123), 63 characters at most.
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// `NAMESPACE/KEY=VALUE,KEY=VALUE`, each part non-empty and without white space.
fn parse_control_from(text: &str) -> Option<crate::desired::ControlFrom> {
    let (namespace, labels) = text.split_once('/')?;
    let plain = |part: &str| !part.is_empty() && !part.chars().any(char::is_whitespace);
    let pod_labels = labels
        .split(',')
        .map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (plain(key) && plain(value)).then(|| (key.to_owned(), value.to_owned()))
        })
        .collect::<Option<std::collections::BTreeMap<_, _>>>()?;
    plain(namespace).then(|| crate::desired::ControlFrom {
        namespace: namespace.to_owned(),
        pod_labels,
    })
}

/// Requests and limits with only `cpu` and `memory`, each a Kubernetes quantity (`50m`, `32Mi`,
/// `0.5`), no request above its limit: anything else would make every Deployment the operator
/// applies fail.
fn resources(json: &str) -> Option<ResourceRequirements> {
    let parsed: ResourceRequirements = serde_json::from_str(json).ok()?;
    let amounts = |map: &Option<std::collections::BTreeMap<String, Quantity>>| {
        map.iter()
            .flatten()
            .map(|(name, value)| {
                let known = name == "cpu" || name == "memory";
                Some((name.clone(), quantity(&value.0).filter(|_| known)?))
            })
            .collect::<Option<std::collections::BTreeMap<String, f64>>>()
    };
    let requests = amounts(&parsed.requests)?;
    let limits = amounts(&parsed.limits)?;
    let within = requests
        .iter()
        .all(|(name, request)| limits.get(name).is_none_or(|limit| request <= limit));
    (within && parsed.claims.is_none()).then_some(parsed)
}

/// A Kubernetes quantity as a number: decimal (`m`, `k`, `M`, `G`, `T`, `P`, `E`) and binary
/// (`Ki` … `Ei`) suffixes.
fn quantity(text: &str) -> Option<f64> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let factor = match &text[digits.len()..] {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    let number: f64 = digits.parse().ok().filter(|n: &f64| *n >= 0.0)?;
    Some(number * factor)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut all = vec!["toa-operator", "run"];
        all.extend(args);
        match Args::try_parse_from(all)?.command {
            Command::Run(run) => Ok(run),
            other => panic!("parsed as {other:?}"),
        }
    }

    fn no_vars(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn run_takes_its_settings_with_defaults() {
        let config = parse(&["--agent-image", "toa-agent:1", "--lease-identity", "op-0"])
            .unwrap()
            .into_config(no_vars)
            .unwrap();
        assert_eq!(
            config,
            run::Config {
                agent_image: "toa-agent:1".into(),
                agent_resources: serde_json::from_str(DEFAULT_AGENT_RESOURCES).unwrap(),
                metrics_listen: "0.0.0.0:8080".parse().unwrap(),
                lease: Some(run::LeaseSettings {
                    name: "toa-operator".into(),
                    namespace: None,
                    identity: "op-0".into(),
                }),
                control_from: None,
                egress: vec![],
                node_networks: vec![],
                key: run::KeySettings {
                    secret: "toa-operator-key".into(),
                    namespace: None,
                },
                watch_namespaces: vec![],
            }
        );
    }

    #[test]
    fn watched_namespaces_are_a_comma_list_of_names() {
        let config = |value: &str| {
            parse(&["--agent-image", "a:1", "--watch-namespaces", value])
                .unwrap()
                .into_config(|_| Some("op".to_owned()))
        };
        assert_eq!(
            config("shop,billing").unwrap().watch_namespaces,
            ["shop", "billing"]
        );
        let error = config("shop,Billing!").unwrap_err();
        assert_eq!(error.option, "--watch-namespaces");
        assert_eq!(error.given, "Billing!");
        assert_eq!(config("shop,billing,shop").unwrap_err().given, "shop");
    }

    #[test]
    fn node_networks_are_address_ranges() {
        let config = |value: &str| {
            let all = ["--agent-image", "a:1", "--node-networks", value];
            parse(&all).unwrap().into_config(|_| Some("op".to_owned()))
        };
        let networks = config("100.64.0.0/16,fd98::/64").unwrap().node_networks;
        let shown: Vec<String> = networks.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["100.64.0.0/16", "fd98::/64"]);
        let refused = config("100.64.0.0").unwrap_err();
        assert_eq!(refused.option, "--node-networks");
        assert_eq!(refused.given, "100.64.0.0");
    }

    #[test]
    fn egress_rules_are_a_json_list_of_rules_for_the_control_from_policy() {
        let config = |args: &[&str]| {
            let mut all = vec!["--agent-image", "a:1"];
            all.extend(args);
            parse(&all).unwrap().into_config(|_| Some("op".to_owned()))
        };
        let rules = r#"[{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5672}]}]"#;
        let policy = ["--control-from", "ops/app=toa"];
        let egress = config(&[&policy[..], &["--egress-rules", rules]].concat())
            .unwrap()
            .egress;
        assert_eq!(egress.len(), 1);
        let to = egress[0].to.as_ref().unwrap();
        assert_eq!(to[0].ip_block.as_ref().unwrap().cidr, "10.0.0.0/8");
        let refused =
            config(&[&policy[..], &["--egress-rules", "{\"to\": []}"]].concat()).unwrap_err();
        assert_eq!(refused.option, "--egress-rules");
        assert!(refused
            .expected
            .starts_with("a JSON list of NetworkPolicy egress rules"));
        let alone = config(&["--egress-rules", rules]).unwrap_err();
        assert_eq!(
            alone.expected,
            "rules only with --control-from, whose NetworkPolicy they go into"
        );
        assert!(config(&policy).unwrap().egress.is_empty());
    }

    #[test]
    fn control_from_names_the_operators_namespace_and_pod_labels() {
        let config = |value: &str| {
            parse(&["--agent-image", "a:1", "--control-from", value])
                .unwrap()
                .into_config(|_| Some("op".to_owned()))
        };
        let from = config("ops/app.kubernetes.io/name=toa-operator,app.kubernetes.io/instance=t")
            .unwrap()
            .control_from
            .unwrap();
        assert_eq!(from.namespace, "ops");
        assert_eq!(
            from.pod_labels,
            [
                ("app.kubernetes.io/instance".to_owned(), "t".to_owned()),
                (
                    "app.kubernetes.io/name".to_owned(),
                    "toa-operator".to_owned()
                ),
            ]
            .into()
        );
        for bad in ["ops", "ops/", "/a=b", "ops/a", "ops/a=b,", "ops/a =b"] {
            let error = config(bad).unwrap_err();
            assert_eq!(error.option, "--control-from", "{bad}");
        }
    }

    #[test]
    fn the_agents_resources_are_cpu_and_memory_quantities() {
        let config = |json: &str| {
            parse(&["--agent-image", "a:1", "--agent-resources", json])
                .unwrap()
                .into_config(|_| Some("op".to_owned()))
        };
        let taken =
            config(r#"{"requests":{"cpu":"0.1","memory":"40Mi"},"limits":{"memory":"1Gi"}}"#)
                .unwrap()
                .agent_resources;
        assert_eq!(taken.requests.unwrap()["memory"].0, "40Mi");
        assert_eq!(taken.limits.unwrap()["memory"].0, "1Gi");
        assert!(config(r#"{"requests":{"memory":"1Pi"},"limits":{"memory":"1Ei"}}"#).is_ok());
        for refused in [
            "not json",
            r#"{"requests":{"cpu":"lots"}}"#,
            r#"{"requests":{"gpu":"1"}}"#,
            r#"{"limits":{"memory":"-1Mi"}}"#,
            r#"{"limits":{"memory":"12Xi"}}"#,
            r#"{"requests":{"memory":"256Mi"},"limits":{"memory":"128Mi"}}"#,
        ] {
            let error = config(refused).unwrap_err();
            assert_eq!(error.option, "--agent-resources", "{refused}");
            assert_eq!(error.given, refused);
            assert!(
                error.to_string().contains("requests and limits as JSON"),
                "{error}"
            );
        }
    }

    #[test]
    fn the_identity_falls_back_to_the_pod_name_then_the_host_name() {
        let args = || parse(&["--agent-image", "a:1"]).unwrap();
        let config = args()
            .into_config(|name| (name == "HOSTNAME").then(|| "host".to_owned()))
            .unwrap();
        assert_eq!(config.lease.unwrap().identity, "host");
        let config = args()
            .into_config(|name| Some(format!("from-{name}")))
            .unwrap();
        assert_eq!(config.lease.unwrap().identity, "from-POD_NAME");
        let error = args().into_config(no_vars).unwrap_err();
        assert_eq!(error.option, "--lease-identity");
    }

    #[test]
    fn leader_election_off_needs_no_identity() {
        let config = parse(&["--agent-image", "a:1", "--leader-election", "off"])
            .unwrap()
            .into_config(no_vars)
            .unwrap();
        assert_eq!(config.lease, None);
    }

    #[test]
    fn bad_settings_are_refused_naming_the_option() {
        let error = parse(&["--agent-image", "has space", "--leader-election", "off"])
            .unwrap()
            .into_config(no_vars)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "`--agent-image`: expected an image reference such as registry.example.com/toa-agent:0.1, got \"has space\""
        );
        assert!(parse(&["--agent-image", "a:1", "--metrics-listen", "nowhere"]).is_err());
        assert!(parse(&["--agent-image", "a:1", "--leader-election", "maybe"]).is_err());
    }
}
