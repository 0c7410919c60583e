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
//! | `limits.operation`     | `TOA_LIMIT_OPERATION`    | 60000 ms: a program's answer to an ordinary call |
//! | `limits.runCommand`    | `TOA_LIMIT_RUN_COMMAND`  | 60000 ms: one run command |
//! | `limits.drain`         | `TOA_LIMIT_DRAIN`        | 25000 ms: the drain's wait for calls in flight |
//! | `limits.queue`         | `TOA_LIMIT_QUEUE`        | 100000 calls in a shared queue |
//! | `limits.deliveries`    | `TOA_LIMIT_DELIVERIES`   | 5 deliveries of one call, then dead-lettered |
//! | `limits.idempotency`   | `TOA_LIMIT_IDEMPOTENCY`  | 600000 ms: how long a call's idempotency key is remembered |

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
    pub limits: Limits,
}

/// The limits every process of the application keeps (docs/calls.md, "Limits").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// How long a program may take to answer an ordinary call or a task.
    pub operation: Duration,
    /// How long one run command may take.
    pub run_command: Duration,
    /// How long the drain waits for the calls in flight before `dispose`.
    pub drain: Duration,
    /// The most calls a component's shared queue holds; a call beyond is refused `UNAVAILABLE`.
    pub queue: u32,
    /// How many times one call is delivered before it is dead-lettered.
    pub deliveries: u32,
    /// How long the outcome of a call given an idempotency key answers its repeats.
    pub idempotency: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            operation: Duration::from_secs(60),
            run_command: Duration::from_secs(60),
            drain: Duration::from_secs(25),
            queue: 100_000,
            deliveries: 5,
            idempotency: Duration::from_secs(600),
        }
    }
}

impl Limits {
    /// The longest a process takes to stop: the drain's wait, `dispose`, and 5 s to stop the
    /// programs. A pod's `terminationGracePeriodSeconds` is this, in whole seconds.
    pub fn stop(&self) -> Duration {
        self.drain + self.run_command + Duration::from_secs(5)
    }
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
        only_keys(
            root,
            "",
            // `configuration` is the components' own: crate::configuration reads it.
            &[
                "name",
                "atomicity",
                "addressed",
                "amqp",
                "limits",
                "configuration",
            ],
        )?;
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
        let limits = match root.get("limits") {
            None => Limits::default(),
            Some(value) => {
                let section = mapping(value, "limits")?;
                only_keys(
                    section,
                    "limits",
                    &[
                        "operation",
                        "runCommand",
                        "drain",
                        "queue",
                        "deliveries",
                        "idempotency",
                    ],
                )?;
                let defaults = Limits::default();
                Limits {
                    operation: millis(section.get("operation"), "limits.operation")?
                        .unwrap_or(defaults.operation),
                    run_command: millis(section.get("runCommand"), "limits.runCommand")?
                        .unwrap_or(defaults.run_command),
                    drain: millis(section.get("drain"), "limits.drain")?.unwrap_or(defaults.drain),
                    queue: count(section.get("queue"), "limits.queue")?.unwrap_or(defaults.queue),
                    deliveries: count(section.get("deliveries"), "limits.deliveries")?
                        .unwrap_or(defaults.deliveries),
                    idempotency: millis(section.get("idempotency"), "limits.idempotency")?
                        .unwrap_or(defaults.idempotency),
                }
            }
        };
        Self::validated(name, atomicity, addressed, amqp, limits)
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
        let number = |key: &str| -> Result<Option<u32>, ContextError> {
            vars.get(key)
                .map(|text| parse_count(&text, key))
                .transpose()
        };
        let defaults = Limits::default();
        let limits = Limits {
            operation: ms("TOA_LIMIT_OPERATION")?.unwrap_or(defaults.operation),
            run_command: ms("TOA_LIMIT_RUN_COMMAND")?.unwrap_or(defaults.run_command),
            drain: ms("TOA_LIMIT_DRAIN")?.unwrap_or(defaults.drain),
            queue: number("TOA_LIMIT_QUEUE")?.unwrap_or(defaults.queue),
            deliveries: number("TOA_LIMIT_DELIVERIES")?.unwrap_or(defaults.deliveries),
            idempotency: ms("TOA_LIMIT_IDEMPOTENCY")?.unwrap_or(defaults.idempotency),
        };
        Self::validated(name, atomicity, addressed, amqp, limits)
    }

    /// The `TOA_*` variables that [`Context::from_vars`] reads back into this context.
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut vars = vec![("TOA_APPLICATION", self.name.clone())];
        if let Some(atomicity) = &self.atomicity {
            let redis: Vec<String> = atomicity.redis.iter().map(ToString::to_string).collect();
            vars.push(("TOA_ATOMICITY_REDIS", redis.join(",")));
            vars.push(("TOA_ATOMICITY_INTERVAL", ms(atomicity.interval)));
            vars.push(("TOA_ATOMICITY_TTL", ms(atomicity.ttl)));
        }
        vars.push(("TOA_ADDRESSED_TIMEOUT", ms(self.addressed.timeout)));
        if let Some(amqp) = &self.amqp {
            vars.push(("TOA_AMQP", amqp.to_string()));
        }
        vars.push(("TOA_LIMIT_OPERATION", ms(self.limits.operation)));
        vars.push(("TOA_LIMIT_RUN_COMMAND", ms(self.limits.run_command)));
        vars.push(("TOA_LIMIT_DRAIN", ms(self.limits.drain)));
        vars.push(("TOA_LIMIT_QUEUE", self.limits.queue.to_string()));
        vars.push(("TOA_LIMIT_DELIVERIES", self.limits.deliveries.to_string()));
        vars.push(("TOA_LIMIT_IDEMPOTENCY", ms(self.limits.idempotency)));
        vars
    }

    fn validated(
        name: String,
        atomicity: Option<Atomicity>,
        addressed: Addressed,
        amqp: Option<AmqpAddress>,
        limits: Limits,
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
            limits,
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

fn count(value: Option<&Value>, key: &str) -> Result<Option<u32>, ContextError> {
    match value {
        None => Ok(None),
        Some(Value::Number(n)) => parse_count(&n.to_string(), key).map(Some),
        Some(other) => Err(expected(key, "a positive whole number", other)),
    }
}

fn parse_count(text: &str, key: &str) -> Result<u32, ContextError> {
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ContextError::invalid(
            key,
            format!("expected a whole number from 1 to {}, got {text}", u32::MAX),
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
            ("name: a\nfoo: 1\n", "`foo`: unknown key; expected one of: name, atomicity, addressed, amqp, limits, configuration"),
            ("name: a\nlimits:\n  queue: 0\n", "`limits.queue`: expected a whole number from 1 to 4294967295, got 0"),
            ("name: a\nlimits:\n  deliveries: many\n", "`limits.deliveries`: expected a positive whole number, got many"),
            ("name: a\nlimits:\n  drain: -1\n", "`limits.drain`: expected a positive whole number of milliseconds, got -1"),
            ("name: a\nlimits:\n  run_command: 5\n", "`limits.run_command`: unknown key; expected one of: operation, runCommand, drain, queue, deliveries, idempotency"),
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

    #[test]
    fn limits_are_read_with_their_defaults() {
        let context = parse("name: a\n").unwrap();
        assert_eq!(context.limits, Limits::default());
        assert_eq!(context.limits.stop(), Duration::from_secs(90));
        let context =
            parse("name: a\nlimits:\n  operation: 1500\n  runCommand: 2000\n  drain: 3000\n  queue: 10\n  deliveries: 2\n")
                .unwrap();
        assert_eq!(
            context.limits,
            Limits {
                operation: Duration::from_millis(1500),
                run_command: Duration::from_secs(2),
                drain: Duration::from_secs(3),
                queue: 10,
                deliveries: 2,
                idempotency: Duration::from_secs(600),
            }
        );
        assert_eq!(context.limits.stop(), Duration::from_secs(10));
    }

    #[test]
    fn a_context_reads_back_from_the_variables_it_writes() {
        let documents = [
            "name: a\n",
            "name: shop\natomicity:\n  redis: [redis://r0, redis://r1:6380/2, redis://r2]\n  interval: 700\n  ttl: 9000\naddressed:\n  timeout: 1234\namqp: amqp://broker:5673/vh\nlimits:\n  operation: 5\n  runCommand: 6\n  drain: 7\n  queue: 8\n  deliveries: 9\n  idempotency: 10\n",
        ];
        for document in documents {
            let context = parse(document).unwrap();
            let vars: HashMap<String, String> = context
                .to_vars()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            assert_eq!(Context::from_vars(&vars).unwrap(), context, "{document}");
        }
    }

    mod generated {
        use super::*;
        use proptest::prelude::*;

        fn millis() -> impl Strategy<Value = Duration> {
            (1u64..10_000_000).prop_map(Duration::from_millis)
        }

        fn context() -> impl Strategy<Value = Context> {
            let name = "[a-z][a-z0-9-]{0,20}";
            let host = "[a-z][a-z0-9]{0,8}";
            let redis = prop::sample::select(vec![1usize, 3, 5])
                .prop_flat_map(move |n| prop::collection::btree_set((host, 1u16..u16::MAX), n..=n));
            let atomicity = prop::option::of((redis, millis(), millis()));
            let amqp = prop::option::of((host, 1u16..u16::MAX, "[a-z]{0,6}"));
            let limits = (millis(), millis(), millis(), 1u32.., 1u32.., millis());
            (name, atomicity, millis(), amqp, limits).prop_map(
                |(name, atomicity, timeout, amqp, limits)| {
                    let atomicity = atomicity.map(|(servers, interval, ttl)| {
                        let redis: Vec<String> = servers
                            .iter()
                            .map(|(host, port)| format!("redis://{host}:{port}"))
                            .collect();
                        Atomicity::new(&redis, Some(interval), Some(ttl)).unwrap()
                    });
                    let amqp = amqp.map(|(host, port, vhost)| {
                        AmqpAddress::parse(&format!("amqp://{host}:{port}/{vhost}"), "amqp")
                            .unwrap()
                    });
                    let (operation, run_command, drain, queue, deliveries, idempotency) = limits;
                    Context {
                        name,
                        atomicity,
                        addressed: Addressed { timeout },
                        amqp,
                        limits: Limits {
                            operation,
                            run_command,
                            drain,
                            queue,
                            deliveries,
                            idempotency,
                        },
                    }
                },
            )
        }

        proptest! {
            #[test]
            fn from_vars_reads_back_what_to_vars_writes(context in context()) {
                let vars: HashMap<String, String> = context
                    .to_vars()
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect();
                prop_assert_eq!(Context::from_vars(&vars).unwrap(), context);
            }
        }
    }
}
