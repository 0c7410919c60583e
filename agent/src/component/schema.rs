//! Input checks against an operation's declared JSON Schema (the `jsonschema` crate: a complete,
//! maintained implementation; writing our own subset would refuse schemas users expect to work),
//! compiled within toa-context's bounds ([`toa_context::schema`]).

use serde_json::Value;
use toa_context::schema::SchemaError;

pub struct InputSchema(jsonschema::Validator);

impl InputSchema {
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        toa_context::schema::compile(schema).map(Self)
    }

    /// `Err` with every violation, each naming where in the input it is.
    pub fn check(&self, input: &Value) -> Result<(), Violations> {
        let problems: Vec<String> = self
            .0
            .iter_errors(input)
            .map(|error| {
                let at = error.instance_path().to_string();
                if at.is_empty() {
                    format!("input: {error}")
                } else {
                    format!("input{at}: {error}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Violations(problems))
        }
    }
}

/// Every violation of an input, each naming where in the input it is, in one line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct Violations(Vec<String>);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_each_violation() {
        let schema = InputSchema::compile(&json!({
            "type": "object",
            "properties": {"customer": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["customer"],
            "additionalProperties": false
        }))
        .unwrap();
        assert!(schema
            .check(&json!({"customer": "c1", "amount": 3}))
            .is_ok());
        let problems = schema
            .check(&json!({"amount": "x", "extra": 1}))
            .unwrap_err()
            .to_string();
        assert!(
            problems.contains("\"customer\" is a required property"),
            "{problems}"
        );
        assert!(problems.contains("input/amount"), "{problems}");
        assert!(problems.contains("extra"), "{problems}");
        assert!(InputSchema::compile(&json!({"type": "nonsense"})).is_err());
    }
}
