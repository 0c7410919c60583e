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
    let validator = jsonschema::validator_for(schema).map_err(|error| {
        format!("{name}: `configuration` in the manifest is not a valid JSON Schema: {error}")
    })?;
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
mod tests {
    use super::*;
    use serde_json::json;
    use Secrets::Unknown;

    fn manifest(configuration: Option<Value>) -> Manifest {
        let mut manifest = Manifest::parse("name: notifications\n", "test").unwrap();
        manifest.configuration = configuration;
        manifest
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "provider": {"type": "string", "default": "https://mail.example.com"},
                "batch": {"type": "integer", "minimum": 1, "default": 50},
                "retry": {"type": "object", "properties": {"times": {"type": "integer", "default": 3}}}
            },
            "additionalProperties": false
        })
    }

    #[test]
    fn the_context_gives_values_per_environment() {
        let yaml = "name: shop\nconfiguration:\n  notifications:\n    batch: 10\n  notifications@production:\n    batch: 99\n";
        let local = read(yaml, &Environment::local()).unwrap();
        assert_eq!(local["notifications"], json!({"batch": 10}));
        let production = read(yaml, &Environment::parse("production").unwrap()).unwrap();
        assert_eq!(production["notifications"], json!({"batch": 99}));
        assert!(read("name: shop\n", &Environment::local())
            .unwrap()
            .is_empty());
        let error = read(
            "name: shop\nconfiguration:\n  notifications: 5\n",
            &Environment::local(),
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("`configuration.notifications`"),
            "{error}"
        );
        // The context itself takes the section.
        crate::Context::parse(yaml, &Environment::local()).unwrap();
    }

    #[test]
    fn defaults_fill_what_the_context_leaves_out() {
        let configured = configure(
            &manifest(Some(schema())),
            Some(&json!({"batch": 10})),
            Unknown,
        )
        .unwrap();
        assert_eq!(
            configured,
            json!({"provider": "https://mail.example.com", "batch": 10, "retry": {"times": 3}})
        );
        let defaults = configure(&manifest(Some(schema())), None, Unknown).unwrap();
        assert_eq!(defaults["batch"], json!(50));
    }

    #[test]
    fn a_bad_value_is_refused_naming_it() {
        let error = configure(
            &manifest(Some(schema())),
            Some(&json!({"batch": 0, "provdier": "x"})),
            Unknown,
        )
        .unwrap_err();
        assert!(error.starts_with("notifications: "), "{error}");
        assert!(error.contains("configuration/batch"), "{error}");
        assert!(error.contains("provdier"), "{error}");
    }

    #[test]
    fn values_without_a_schema_are_refused_and_none_is_empty() {
        assert_eq!(
            configure(&manifest(None), None, Unknown).unwrap(),
            json!({})
        );
        let error = configure(&manifest(None), Some(&json!({"a": 1})), Unknown).unwrap_err();
        assert!(error.contains("declares no `configuration`"), "{error}");
        let error =
            configure(&manifest(Some(json!({"type": "nonsense"}))), None, Unknown).unwrap_err();
        assert!(error.contains("not a valid JSON Schema"), "{error}");
    }

    fn secret_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 12},
                "port": {"type": "integer"},
                "batch": {"type": "integer", "minimum": 1, "default": 50}
            }
        })
    }

    #[test]
    fn a_secret_stays_a_placeholder_and_is_checked_where_its_value_is_known() {
        let manifest = manifest(Some(secret_schema()));
        let given = json!({"key": "$MAIL_KEY"});
        let lookup = |name: &str| (name == "MAIL_KEY").then(|| "long-enough-value".to_owned());
        // Known: checked with its value, handed on as the placeholder.
        let configured = configure(&manifest, Some(&given), Secrets::Known(&lookup)).unwrap();
        assert_eq!(configured, json!({"key": "$MAIL_KEY", "batch": 50}));
        // Unknown (the operator): "$MAIL_KEY" itself would fail minLength; not checked.
        assert_eq!(
            configure(&manifest, Some(&given), Unknown).unwrap(),
            configured
        );
    }

    #[test]
    fn a_refused_or_missing_secret_is_named_and_its_value_never_repeated() {
        let manifest = manifest(Some(secret_schema()));
        let given = json!({"key": "$MAIL_KEY"});
        let short = |_: &str| Some("hunter2".to_owned());
        let error = configure(&manifest, Some(&given), Secrets::Known(&short)).unwrap_err();
        assert!(error.contains("configuration/key"), "{error}");
        assert!(
            error.contains("the value of $MAIL_KEY is shorter than 12 characters"),
            "{error}"
        );
        assert!(!error.contains("hunter2"), "the value leaked: {error}");

        let none = |_: &str| None;
        let error = configure(&manifest, Some(&given), Secrets::Known(&none)).unwrap_err();
        assert!(
            error.starts_with("notifications: configuration/key"),
            "{error}"
        );
        assert!(
            error.contains("set the environment variable MAIL_KEY"),
            "{error}"
        );

        // Nor where a rule over the whole configuration fails, which would print all of it.
        let mut strict = secret_schema();
        strict["anyOf"] = json!([{"required": ["port"]}]);
        let error = configure(
            &self::manifest(Some(strict)),
            Some(&json!({"key": "$MAIL_KEY"})),
            Secrets::Known(&|_: &str| Some("long-enough-hunter2".to_owned())),
        )
        .unwrap_err();
        assert!(
            error.contains("configuration: the value (holding secrets) is not valid under any"),
            "{error}"
        );
        assert!(!error.contains("hunter2"), "the value leaked: {error}");

        // A secret is a string: where the schema takes a number, the operator refuses it too.
        let error = configure(&manifest, Some(&json!({"port": "$PORT"})), Unknown).unwrap_err();
        assert!(
            error.contains("configuration/port: $PORT is a secret, always a string"),
            "{error}"
        );
        // Where a rule over the whole looks at the secret's value, the operator cannot check it;
        // a rule about the structure it still checks.
        let mut chosen = secret_schema();
        chosen["oneOf"] = json!([{"properties": {"key": {"pattern": "^sk_live_"}}}]);
        chosen["additionalProperties"] = json!(false);
        let operator =
            |given: Value| configure(&self::manifest(Some(chosen.clone())), Some(&given), Unknown);
        operator(json!({"key": "$MAIL_KEY"})).unwrap();
        let error = operator(json!({"key": "$MAIL_KEY", "kye": 1})).unwrap_err();
        assert!(error.contains("'kye' was unexpected"), "{error}");
        let error = operator(json!({"batch": {"of": "$MAIL_KEY"}})).unwrap_err();
        assert!(
            error.contains("configuration/batch") && error.contains("integer"),
            "{error}"
        );

        // A key with `/` or `~` holding a secret: the refusal is still found at the secret.
        let odd =
            json!({"type": "object", "properties": {"a/b~c": {"type": "string", "minLength": 30}}});
        let error = configure(
            &self::manifest(Some(odd)),
            Some(&json!({"a/b~c": "$ODD"})),
            Secrets::Known(&|_: &str| Some("hunter2".to_owned())),
        )
        .unwrap_err();
        assert!(
            error.contains("configuration/a~1b~0c: the value of $ODD is shorter"),
            "{error}"
        );
        assert!(!error.contains("hunter2"), "the value leaked: {error}");

        // And a plain value next to a secret is still checked.
        let error = configure(&manifest, Some(&json!({"key": "$K", "batch": 0})), Unknown);
        assert!(error.unwrap_err().contains("configuration/batch"));
    }
}
