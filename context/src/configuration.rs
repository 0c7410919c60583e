//! A component's configuration (`context.configuration` in the seeds): the manifest declares it as
//! a JSON Schema with defaults, `context.toa.yaml` gives the values per environment, and what the
//! program gets is the values with the defaults filled in, checked against the schema.
//!
//! ```yaml
//! # manifest.toa.yaml
//! configuration:
//!   type: object
//!   properties:
//!     provider: { type: string, default: "https://mail.example.com" }
//!     batch: { type: integer, minimum: 1, default: 50 }
//!
//! # context.toa.yaml
//! configuration:
//!   notifications:
//!     batch: 10
//!   notifications@production:
//!     provider: https://mail.shop.example
//! ```
//!
//! The agent passes the result to a program it starts as `TOA_CONFIGURATION` (JSON); the operator
//! renders it into the Composition and passes it to the component's container the same way.
//! Secrets (`api-key: $STRIPE_API_KEY`) stay placeholders there; see [`crate::placeholders`].

use crate::placeholders::{placeholders, reveal, Placeholder};
use crate::{ContextError, Environment, Manifest};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The variable the program reads its configuration from (JSON).
pub const VARIABLE: &str = "TOA_CONFIGURATION";

/// The `configuration` section of a `context.toa.yaml` for the environment chain `env`:
/// component's full name → its values (an object). Empty without the section.
pub fn read(yaml: &str, env: &Environment) -> Result<BTreeMap<String, Value>, ContextError> {
    let raw: serde_yaml::Value =
        serde_yaml::from_str(yaml).map_err(|error| ContextError::Yaml(error.to_string()))?;
    let resolved = env.resolve(&raw, "")?;
    let Some(section) = resolved.get("configuration") else {
        return Ok(BTreeMap::new());
    };
    let serde_yaml::Value::Mapping(section) = section else {
        return Err(ContextError::invalid(
            "configuration",
            "expected a mapping of component names to their values",
        ));
    };
    let mut values = BTreeMap::new();
    for (component, value) in section {
        let serde_yaml::Value::String(component) = component else {
            return Err(ContextError::invalid(
                "configuration",
                format!("expected component names as keys, got {component:?}"),
            ));
        };
        let key = format!("configuration.{component}");
        let value: Value = serde_json::to_value(value)
            .map_err(|error| ContextError::invalid(&key, error.to_string()))?;
        if !value.is_object() {
            return Err(ContextError::invalid(
                key,
                format!("expected the component's values as a mapping, got {value}"),
            ));
        }
        values.insert(component.clone(), value);
    }
    Ok(values)
}

/// Where the values of a configuration's secrets (`$NAME`, [`crate::placeholders`]) are known.
pub enum Secrets<'a> {
    /// Here (a local run: the agent's environment): they are checked like any value, and the
    /// refusals do not repeat them.
    Known(&'a dyn Fn(&str) -> Option<String>),
    /// Not here (the operator, which reads no Secret): a placeholder is checked only for being
    /// a string, as every secret is.
    Unknown,
}

/// The configuration `component` runs with: `given` (from the context) with the schema's
/// defaults filled in, checked; secrets stay placeholders. `Err` names the component and every
/// value refused.
pub fn configure(
    manifest: &Manifest,
    given: Option<&Value>,
    secrets: Secrets<'_>,
) -> Result<Value, String> {
    let name = manifest.full_name();
    let Some(schema) = &manifest.configuration else {
        return match given {
            None => Ok(Value::Object(Map::new())),
            Some(_) => Err(format!(
                "{name}: the context configures it, but its manifest declares no `configuration` schema"
            )),
        };
    };
    let validator = crate::schema::compile(schema)
        .map_err(|error| format!("{name}: `configuration` in the manifest: {error}"))?;
    let mut value = given.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    fill_defaults(schema, &mut value);
    let secret_at = placeholders(&value);
    let checked = match secrets {
        Secrets::Known(lookup) => reveal(&value, lookup).map_err(|missing| {
            format!(
                "{name}: configuration{}: the secret ${} has no value: set the environment variable {}",
                missing.pointer, missing.name, missing.name
            )
        })?,
        Secrets::Unknown => value.clone(),
    };
    let problems: Vec<String> = validator
        .iter_errors(&checked)
        .filter_map(|error| problem(&error, &secret_at, &secrets))
        .collect();
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(format!("{name}: {}", problems.join("; ")))
    }
}

/// Rules over an object or array that do not look at its values: they hold whatever the
/// secrets inside turn out to be.
const STRUCTURAL: [&str; 9] = [
    "type",
    "required",
    "additionalProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "minItems",
    "maxItems",
    "dependentRequired",
];

/// What a refusal says, if anything. Where the value is or holds a known secret, the rule it
/// fails without the value (an `anyOf` over the whole configuration would print all of it).
/// Where secrets are unknown, a rule that looks at the secret's value cannot be checked, except
/// that a secret is a string.
fn problem(
    error: &jsonschema::ValidationError<'_>,
    secret_at: &[Placeholder],
    secrets: &Secrets<'_>,
) -> Option<String> {
    let at = error.instance_path().to_string();
    let keyword = error.kind().keyword();
    let this = secret_at.iter().find(|p| p.pointer == at);
    let holds = secret_at
        .iter()
        .any(|p| p.pointer.starts_with(&format!("{at}/")));
    match (secrets, this) {
        (Secrets::Known(_), Some(secret)) => {
            let value = format!("the value of ${}", secret.name);
            Some(format!("configuration{at}: {}", error.masked_with(value)))
        }
        (Secrets::Known(_), None) if holds => Some(format!(
            "configuration{at}: {}",
            error.masked_with("the value (holding secrets)")
        )),
        (Secrets::Unknown, Some(secret)) => (keyword == "type").then(|| {
            format!(
                "configuration{at}: ${} is a secret, always a string, and the schema takes another type",
                secret.name
            )
        }),
        (Secrets::Unknown, None) if holds && !STRUCTURAL.contains(&keyword) => None,
        _ => Some(format!("configuration{at}: {error}")),
    }
}

/// Fills in `default`s of the schema's `properties`, recursively, where the value has none.
fn fill_defaults(schema: &Value, value: &mut Value) {
    let (Some(properties), Value::Object(object)) = (schema.get("properties"), value) else {
        return;
    };
    let Some(properties) = properties.as_object() else {
        return;
    };
    for (key, property) in properties {
        if !object.contains_key(key) {
            if let Some(default) = property.get("default") {
                object.insert(key.clone(), default.clone());
            } else if property.get("properties").is_some() {
                // A nested object without a value still gets its own defaults.
                object.insert(key.clone(), Value::Object(Map::new()));
                fill_defaults(property, object.get_mut(key).expect("just inserted"));
                if object[key].as_object().is_some_and(Map::is_empty) {
                    object.remove(key);
                }
                continue;
            } else {
                continue;
            }
        }
        fill_defaults(property, object.get_mut(key).expect("present"));
    }
}

#[cfg(test)]
mod tests;
