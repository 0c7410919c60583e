//! Environment chains and `key@env` resolution.
//!
//! A key written `redis@production` applies in the environment `production`. With the chain
//! `staging:production`, the first suffixed key that matches wins (`redis@staging`, then
//! `redis@production`), and the plain key (`redis`) is the fallback. Resolution applies at every
//! level of the document, so `atomicity@production:` works as well as `redis@production:` inside it.

use crate::ContextError;
use serde_yaml::{Mapping, Value};

/// An ordered list of environment names, most specific first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment(Vec<String>);

impl Environment {
    /// The environment of a local run when nothing else is said.
    pub fn local() -> Self {
        Self(vec!["local".to_owned()])
    }

    /// Parses `staging:production`.
    pub fn parse(chain: &str) -> Result<Self, ContextError> {
        let names: Vec<String> = chain.split(':').map(str::to_owned).collect();
        for name in &names {
            if !valid_name(name) {
                return Err(ContextError::invalid(
                    "environment",
                    format!(
                        "expected names of lowercase letters, digits and '-' separated by ':', got {chain:?}"
                    ),
                ));
            }
        }
        Ok(Self(names))
    }

    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// Resolves every `key@env` in `value` for this chain, recursively.
    pub fn resolve(&self, value: &Value, path: &str) -> Result<Value, ContextError> {
        let Value::Mapping(mapping) = value else {
            return Ok(value.clone());
        };
        // (base key, rank): rank 0..n for the chain's environments, n for the plain key.
        let mut chosen: Vec<(String, usize, &Value)> = Vec::new();
        for (key, item) in mapping {
            let Value::String(key) = key else {
                return Err(ContextError::invalid(
                    path_or_root(path),
                    format!("expected string keys, got {key:?}"),
                ));
            };
            let (base, rank) = match key.split_once('@') {
                None => (key.as_str(), self.0.len()),
                Some((base, env)) => {
                    if base.is_empty() || !valid_name(env) {
                        return Err(ContextError::invalid(
                            join(path, key),
                            "expected `key` or `key@environment`",
                        ));
                    }
                    match self.0.iter().position(|name| name == env) {
                        Some(rank) => (base, rank),
                        None => continue, // another environment's value
                    }
                }
            };
            match chosen.iter_mut().find(|(b, _, _)| b == base) {
                Some(entry) if rank < entry.1 => *entry = (base.to_owned(), rank, item),
                Some(_) => {}
                None => chosen.push((base.to_owned(), rank, item)),
            }
        }
        let mut resolved = Mapping::new();
        for (base, _, item) in chosen {
            let inner = self.resolve(item, &join(path, &base))?;
            resolved.insert(Value::String(base), inner);
        }
        Ok(Value::Mapping(resolved))
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn path_or_root(path: &str) -> &str {
    if path.is_empty() {
        "(root)"
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(chain: &str, yaml: &str) -> Value {
        let value: Value = serde_yaml::from_str(yaml).unwrap();
        Environment::parse(chain)
            .unwrap()
            .resolve(&value, "")
            .unwrap()
    }

    #[test]
    fn first_suffixed_match_wins_then_plain_key() {
        let yaml = "redis: a\nredis@production: b\nredis@staging: c\nother@production: d\n";
        assert_eq!(
            resolve("staging:production", yaml),
            serde_yaml::from_str::<Value>("redis: c\nother: d\n").unwrap()
        );
        assert_eq!(
            resolve("production", yaml),
            serde_yaml::from_str::<Value>("redis: b\nother: d\n").unwrap()
        );
        assert_eq!(
            resolve("local", yaml),
            serde_yaml::from_str::<Value>("redis: a\n").unwrap()
        );
    }

    #[test]
    fn resolves_nested_sections() {
        let yaml = "atomicity@production:\n  interval@production: 1\n  interval: 2\natomicity:\n  interval: 3\n";
        assert_eq!(
            resolve("production", yaml),
            serde_yaml::from_str::<Value>("atomicity:\n  interval: 1\n").unwrap()
        );
    }

    #[test]
    fn refuses_malformed_names() {
        assert!(Environment::parse("Prod").is_err());
        assert!(Environment::parse("a::b").is_err());
        let value: Value = serde_yaml::from_str("redis@: x").unwrap();
        let error = Environment::local().resolve(&value, "").unwrap_err();
        assert_eq!(
            error.to_string(),
            "`redis@`: expected `key` or `key@environment`"
        );
    }
}
