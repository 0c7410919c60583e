//! The typed context: `name`, `atomicity`, `addressed` and `amqp`, read from `context.toa.yaml`
//! for one environment, or from `TOA_*` environment variables (how a pod receives them).
//!
//! | annotation             | environment variable     | default        |
//! |------------------------|--------------------------|----------------|
//! | `name`                 | `TOA_APPLICATION`        | required       |
//! | `atomicity.redis`      | `TOA_ATOMICITY_REDIS` (addresses separated by `,`) | none: no atomicity |
//! | `atomicity.interval`   | `TOA_ATOMICITY_INTERVAL` | 5000 ms        |
//! | `atomicity.ttl`        | `TOA_ATOMICITY_TTL`      | 10000 ms       |
//! | `addressed.timeout`    | `TOA_ADDRESSED_TIMEOUT`  | 5000 ms        |
//! | `amqp`                 | `TOA_AMQP`               | none: in-process calls (local runs) |

use crate::address::{AmqpAddress, RedisAddress};
use crate::environment::{join, Environment};
use crate::ContextError;
use serde_yaml::{Mapping, Value};
use std::collections::HashMap;
use std::time::Duration;

/// Where environment variables come from: the process, or a map in tests.
pub trait Vars {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessVars;

impl Vars for ProcessVars {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Vars for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// The application context for one environment, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The application's name; keys in Redis and queues in the broker are namespaced by it.
    pub name: String,
    /// Coordination across replicas; `None` when the annotation is absent.
    pub atomicity: Option<Atomicity>,
    pub addressed: Addressed,
    /// The broker; `None` when the annotation is absent.
    pub amqp: Option<AmqpAddress>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Atomicity {
    /// One or an odd number of independent servers. Slots and meter use the first.
    pub redis: Vec<RedisAddress>,
    /// The heartbeat interval of slots.
    pub interval: Duration,
    /// How long a lock outlives a holder that stopped extending it.
    pub ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addressed {
    /// How long a call to one named process waits for its reply by default.
    pub timeout: Duration,
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5000);
pub const DEFAULT_TTL: Duration = Duration::from_millis(10_000);
pub const DEFAULT_ADDRESSED_TIMEOUT: Duration = Duration::from_millis(5000);

impl Default for Addressed {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_ADDRESSED_TIMEOUT,
        }
    }
}

impl Context {
    /// Reads a `context.toa.yaml` document for the environment chain `env`.
    pub fn parse(yaml: &str, env: &Environment) -> Result<Self, ContextError> {
        let raw: Value =
            serde_yaml::from_str(yaml).map_err(|error| ContextError::Yaml(error.to_string()))?;
        let resolved = env.resolve(&raw, "")?;
        let root = mapping(&resolved, "(root)")?;
        only_keys(root, "", &["name", "atomicity", "addressed", "amqp"])?;
        let name = match root.get("name") {
            Some(Value::String(name)) => name.clone(),
            Some(other) => return Err(expected("name", "a string", other)),
            None => {
                return Err(ContextError::invalid(
                    "name",
                    "expected the application's name",
                ))
            }
        };
        let atomicity = root
            .get("atomicity")
            .map(|value| {
                let section = mapping(value, "atomicity")?;
                only_keys(section, "atomicity", &["redis", "interval", "ttl"])?;
                let redis = match section.get("redis") {
                    None => {
                        return Err(ContextError::invalid(
                            "atomicity.redis",
                            "expected one address or a list of them",
                        ))
                    }
                    Some(Value::String(one)) => vec![one.clone()],
                    Some(Value::Sequence(items)) => items
                        .iter()
                        .enumerate()
                        .map(|(index, item)| match item {
                            Value::String(text) => Ok(text.clone()),
                            other => Err(expected(
                                &format!("atomicity.redis[{index}]"),
                                "an address",
                                other,
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(other) => {
                        return Err(expected(
                            "atomicity.redis",
                            "one address or a list of them",
                            other,
                        ))
                    }
                };
                Atomicity::new(
                    &redis,
                    millis(section.get("interval"), "atomicity.interval")?,
                    millis(section.get("ttl"), "atomicity.ttl")?,
                )
            })
            .transpose()?;
        let addressed = match root.get("addressed") {
            None => Addressed::default(),
            Some(value) => {
                let section = mapping(value, "addressed")?;
                only_keys(section, "addressed", &["timeout"])?;
                Addressed {
                    timeout: millis(section.get("timeout"), "addressed.timeout")?
                        .unwrap_or(DEFAULT_ADDRESSED_TIMEOUT),
                }
            }
        };
        let amqp = match root.get("amqp") {
            None => None,
            Some(Value::String(text)) => Some(AmqpAddress::parse(text, "amqp")?),
            Some(other) => return Err(expected("amqp", "an address", other)),
        };
        Self::validated(name, atomicity, addressed, amqp)
    }

    /// Reads the `TOA_*` variables listed in the module documentation.
    pub fn from_vars(vars: &dyn Vars) -> Result<Self, ContextError> {
        let name = vars.get("TOA_APPLICATION").ok_or_else(|| {
            ContextError::invalid("TOA_APPLICATION", "expected the application's name")
        })?;
        let ms = |key: &str| -> Result<Option<Duration>, ContextError> {
            vars.get(key)
                .map(|text| parse_millis(&text, key))
                .transpose()
        };
        let atomicity = match vars.get("TOA_ATOMICITY_REDIS") {
            None => {
                for key in ["TOA_ATOMICITY_INTERVAL", "TOA_ATOMICITY_TTL"] {
                    if vars.get(key).is_some() {
                        return Err(ContextError::invalid(
                            key,
                            "expected TOA_ATOMICITY_REDIS to be set as well",
                        ));
                    }
                }
                None
            }
            Some(list) => {
                let redis: Vec<String> = list.split(',').map(|s| s.trim().to_owned()).collect();
                Some(Atomicity::new(
                    &redis,
                    ms("TOA_ATOMICITY_INTERVAL")?,
                    ms("TOA_ATOMICITY_TTL")?,
                )?)
            }
        };
        let addressed = Addressed {
            timeout: ms("TOA_ADDRESSED_TIMEOUT")?.unwrap_or(DEFAULT_ADDRESSED_TIMEOUT),
        };
        let amqp = vars
            .get("TOA_AMQP")
            .map(|text| AmqpAddress::parse(&text, "TOA_AMQP"))
            .transpose()?;
        Self::validated(name, atomicity, addressed, amqp)
    }

    fn validated(
        name: String,
        atomicity: Option<Atomicity>,
        addressed: Addressed,
        amqp: Option<AmqpAddress>,
    ) -> Result<Self, ContextError> {
        let valid_name = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_name {
            return Err(ContextError::invalid(
                "name",
                format!("expected 1 to 63 lowercase letters, digits or '-', got {name:?}"),
            ));
        }
        Ok(Self {
            name,
            atomicity,
            addressed,
            amqp,
        })
    }
}

impl Atomicity {
    /// Validates a list of address texts and the optional timings.
    pub fn new(
        redis: &[String],
        interval: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Result<Self, ContextError> {
        if redis.is_empty() || redis.iter().all(String::is_empty) {
            return Err(ContextError::invalid(
                "atomicity.redis",
                "expected one address or a list of them",
            ));
        }
        if redis.len().is_multiple_of(2) {
            return Err(ContextError::EvenAddresses(redis.len()));
        }
        let addresses = redis
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let key = if redis.len() == 1 {
                    "atomicity.redis".to_owned()
                } else {
                    format!("atomicity.redis[{index}]")
                };
                RedisAddress::parse(text, &key)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (index, address) in addresses.iter().enumerate() {
            if addresses[..index].contains(address) {
                return Err(ContextError::invalid(
                    format!("atomicity.redis[{index}]"),
                    format!("expected independent servers, {address} is listed twice"),
                ));
            }
        }
        Ok(Self {
            redis: addresses,
            interval: interval.unwrap_or(DEFAULT_INTERVAL),
            ttl: ttl.unwrap_or(DEFAULT_TTL),
        })
    }
}

fn mapping<'a>(value: &'a Value, key: &str) -> Result<&'a Mapping, ContextError> {
    match value {
        Value::Mapping(mapping) => Ok(mapping),
        other => Err(expected(key, "a mapping", other)),
    }
}

fn only_keys(mapping: &Mapping, path: &str, known: &[&str]) -> Result<(), ContextError> {
    for key in mapping.keys() {
        let key = key.as_str().unwrap_or_default();
        if !known.contains(&key) {
            return Err(ContextError::invalid(
                join(path, key),
                format!("unknown key; expected one of: {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}

fn millis(value: Option<&Value>, key: &str) -> Result<Option<Duration>, ContextError> {
    match value {
        None => Ok(None),
        Some(Value::Number(n)) => parse_millis(&n.to_string(), key).map(Some),
        Some(other) => Err(expected(
            key,
            "a positive whole number of milliseconds",
            other,
        )),
    }
}

fn parse_millis(text: &str, key: &str) -> Result<Duration, ContextError> {
    match text.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(ContextError::invalid(
            key,
            format!("expected a positive whole number of milliseconds, got {text}"),
        )),
    }
}

fn expected(key: &str, what: &str, got: &Value) -> ContextError {
    let got = serde_yaml::to_string(got).unwrap_or_default();
    ContextError::invalid(key, format!("expected {what}, got {}", got.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Context, ContextError> {
        Context::parse(yaml, &Environment::local())
    }

    fn refused(yaml: &str) -> String {
        parse(yaml).unwrap_err().to_string()
    }

    #[test]
    fn reads_the_example_context_of_the_repository() {
        let yaml = include_str!("../../context.toa.yaml");
        let local = Context::parse(yaml, &Environment::local()).unwrap();
        assert_eq!((local.atomicity, local.amqp), (None, None));
        let dev = Context::parse(yaml, &Environment::parse("dev").unwrap()).unwrap();
        assert_eq!(dev.atomicity.unwrap().redis.len(), 1);
        let production = Context::parse(yaml, &Environment::parse("production").unwrap()).unwrap();
        let atomicity = production.atomicity.unwrap();
        assert_eq!(atomicity.redis.len(), 3);
        assert_eq!(atomicity.interval, Duration::from_millis(5000));
    }

    #[test]
    fn defaults() {
        let context = parse("name: shop\natomicity:\n  redis: redis://localhost\n").unwrap();
        let atomicity = context.atomicity.unwrap();
        assert_eq!(atomicity.interval, DEFAULT_INTERVAL);
        assert_eq!(atomicity.ttl, DEFAULT_TTL);
        assert_eq!(context.addressed.timeout, DEFAULT_ADDRESSED_TIMEOUT);
        assert_eq!(context.amqp, None);
        assert_eq!(parse("name: shop\n").unwrap().atomicity, None);
    }

    #[test]
    fn an_even_number_of_addresses_is_refused_with_the_count() {
        assert_eq!(
            refused("name: a\natomicity:\n  redis: [redis://a, redis://b]\n"),
            "Atomicity takes an odd number of addresses, 2 given."
        );
        assert_eq!(
            refused("name: a\natomicity:\n  redis: [redis://a, redis://b, redis://c, redis://d]\n"),
            "Atomicity takes an odd number of addresses, 4 given."
        );
    }

    #[test]
    fn refused_annotations_name_the_key_and_what_was_expected() {
        let cases = [
            ("name: a\nfoo: 1\n", "`foo`: unknown key; expected one of: name, atomicity, addressed, amqp"),
            ("name: a\natomicity:\n  redis: redis://a\n  intervl: 5\n", "`atomicity.intervl`: unknown key; expected one of: redis, interval, ttl"),
            ("name: a\natomicity:\n  redis: redis://a\n  interval: 0\n", "`atomicity.interval`: expected a positive whole number of milliseconds, got 0"),
            ("name: a\natomicity:\n  redis: redis://a\n  interval: -5\n", "`atomicity.interval`: expected a positive whole number of milliseconds, got -5"),
            ("name: a\natomicity:\n  redis: redis://a\n  ttl: 1.5\n", "`atomicity.ttl`: expected a positive whole number of milliseconds, got 1.5"),
            ("name: a\naddressed:\n  timeout: 0\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got 0"),
            ("name: a\naddressed:\n  timeout: -100\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got -100"),
            ("name: a\natomicity:\n  redis: redis://a\n  ttl: -1\n", "`atomicity.ttl`: expected a positive whole number of milliseconds, got -1"),
            ("name: a\naddressed:\n  timeout: soon\n", "`addressed.timeout`: expected a positive whole number of milliseconds, got soon"),
            ("name: a\natomicity:\n  interval: 5\n", "`atomicity.redis`: expected one address or a list of them"),
            ("name: a\natomicity:\n  redis: [redis://a, 5, redis://c]\n", "`atomicity.redis[1]`: expected an address, got 5"),
            ("name: a\natomicity:\n  redis: [redis://a, redis://a, redis://c]\n", "`atomicity.redis[1]`: expected independent servers, redis://a:6379 is listed twice"),
            ("name: a\natomicity:\n  redis: localhost\n", "`atomicity.redis`: expected an address like redis://host:6379, got \"localhost\""),
            ("name: a\namqp: [x]\n", "`amqp`: expected an address, got - x"),
            ("name: Shop\n", "`name`: expected 1 to 63 lowercase letters, digits or '-', got \"Shop\""),
            ("atomicity: {redis: redis://a}\n", "`name`: expected the application's name"),
        ];
        for (yaml, message) in cases {
            assert_eq!(refused(yaml), message, "{yaml}");
        }
        assert!(refused("name: [").starts_with("context is not valid YAML"));
    }

    #[test]
    fn credentials_in_an_address_are_refused_and_not_repeated() {
        let message = refused("name: a\natomicity:\n  redis: redis://admin:s3cret@redis:6379\n");
        assert!(message.contains("carries credentials"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn environment_variables_give_the_same_settings() {
        let vars: HashMap<String, String> = [
            ("TOA_APPLICATION", "shop"),
            ("TOA_ATOMICITY_REDIS", "redis://a, redis://b,redis://c"),
            ("TOA_ATOMICITY_INTERVAL", "250"),
            ("TOA_ADDRESSED_TIMEOUT", "100"),
            ("TOA_AMQP", "amqp://broker"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let context = Context::from_vars(&vars).unwrap();
        let atomicity = context.atomicity.unwrap();
        assert_eq!(atomicity.redis.len(), 3);
        assert_eq!(atomicity.interval, Duration::from_millis(250));
        assert_eq!(atomicity.ttl, DEFAULT_TTL);
        assert_eq!(context.addressed.timeout, Duration::from_millis(100));
        assert_eq!(context.amqp.unwrap().host, "broker");

        let mut even = vars.clone();
        even.insert("TOA_ATOMICITY_REDIS".into(), "redis://a,redis://b".into());
        assert_eq!(
            Context::from_vars(&even).unwrap_err().to_string(),
            "Atomicity takes an odd number of addresses, 2 given."
        );
        let mut zero = vars.clone();
        zero.insert("TOA_ATOMICITY_TTL".into(), "0".into());
        assert_eq!(
            Context::from_vars(&zero).unwrap_err().to_string(),
            "`TOA_ATOMICITY_TTL`: expected a positive whole number of milliseconds, got 0"
        );
    }
}
