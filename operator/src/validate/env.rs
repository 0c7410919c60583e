//! `spec.components[].env`: the variables users give a component's program, checked before
//! anything is applied so that a bad one is an `InvalidSpec` naming it rather than a Deployment
//! the API server refuses. The runtime's own variables (`TOA_…`: the program's port, token,
//! configuration and instance) cannot be set or shadowed from the spec.

use super::pod::subdomain;
use super::{invalid, InvalidSpec};
use crate::crd::{ComponentEnv, ComponentEnvSource, KeyRef};

/// The runtime's prefix: the program reads its port, token and configuration under it.
pub const RESERVED_PREFIX: &str = "TOA_";

/// Checks the variables of the component at `index`.
pub fn check(index: usize, env: &[ComponentEnv]) -> Result<(), InvalidSpec> {
    for (at, var) in env.iter().enumerate() {
        let field = format!("spec.components[{index}].env[{at}]");
        if !variable_name(&var.name) {
            return Err(invalid(
                &format!("{field}.name"),
                format!(
                    "{:?} is not a variable name: letters, digits, '_', '-' and '.', not starting with a digit",
                    var.name
                ),
            ));
        }
        if var.name.starts_with(RESERVED_PREFIX) {
            return Err(invalid(
                &format!("{field}.name"),
                format!(
                    "{} is the runtime's: names starting with {RESERVED_PREFIX} are refused",
                    var.name
                ),
            ));
        }
        if env[..at].iter().any(|seen| seen.name == var.name) {
            return Err(invalid(
                &format!("{field}.name"),
                format!("{} is listed twice", var.name),
            ));
        }
        source(&field, var)?;
    }
    Ok(())
}

/// Exactly one of `value` and `valueFrom`, and in `valueFrom` exactly one reference.
fn source(field: &str, var: &ComponentEnv) -> Result<(), InvalidSpec> {
    let reference = match (&var.value, &var.value_from) {
        (Some(_), None) => return Ok(()),
        (None, Some(from)) => from,
        _ => {
            return Err(invalid(
                field,
                format!("{} needs exactly one of value and valueFrom", var.name),
            ))
        }
    };
    let (kind, key_ref) = match reference {
        ComponentEnvSource {
            secret_key_ref: Some(key_ref),
            config_map_key_ref: None,
        } => ("secretKeyRef", key_ref),
        ComponentEnvSource {
            secret_key_ref: None,
            config_map_key_ref: Some(key_ref),
        } => ("configMapKeyRef", key_ref),
        _ => {
            return Err(invalid(
                &format!("{field}.valueFrom"),
                "expected exactly one of secretKeyRef and configMapKeyRef",
            ))
        }
    };
    key_reference(&format!("{field}.valueFrom.{kind}"), key_ref)
}

fn key_reference(field: &str, key_ref: &KeyRef) -> Result<(), InvalidSpec> {
    if !subdomain(&key_ref.name) {
        return Err(invalid(
            &format!("{field}.name"),
            format!("{:?} is not an object name (a DNS subdomain)", key_ref.name),
        ));
    }
    // The keys a Secret's or ConfigMap's data may have.
    let key = key_ref.key.as_bytes();
    if key.is_empty()
        || key.len() > 253
        || !key
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(invalid(
            &format!("{field}.key"),
            format!(
                "{:?} is not a key: 1–253 letters, digits, '-', '_' or '.'",
                key_ref.key
            ),
        ));
    }
    Ok(())
}

/// A C-like identifier that may also hold '-' and '.', as Kubernetes took them for years.
fn variable_name(name: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
    name.len() <= 253
        && name.bytes().next().is_some_and(|b| !b.is_ascii_digit())
        && name.bytes().all(allowed)
}
