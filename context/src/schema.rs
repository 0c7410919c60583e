//! The JSON Schemas users declare (a manifest's `configuration` and each operation's `input`),
//! compiled within bounds, in one place for the agent, the operator and `render`.
//!
//! A schema comes from whoever writes a manifest, and the operator evaluates it inline for every
//! tenant's Composition: one schema must not cost the others their reconciles. So a schema is at
//! most [`MAX_BYTES`] as JSON and [`MAX_DEPTH`] levels deep (real ones are a few KiB and under
//! ten), its `pattern`s compile to at most [`PATTERN_BYTES`] each, and a pattern that needs
//! backtracking (lookarounds, backreferences) gives up after [`BACKTRACK_LIMIT`] steps (a refusal
//! of the value) instead of running for minutes.

use serde_json::Value;

/// The largest schema, as compact JSON.
pub const MAX_BYTES: usize = 64 * 1024;
/// The deepest schema, counting each object and array.
pub const MAX_DEPTH: usize = 32;
/// The largest compiled `pattern` (the regex crate's size limit; its own default is 10 MiB) and
/// the largest cache of its lazy DFA.
pub const PATTERN_BYTES: usize = 1 << 20;
/// Backtracking steps of one match before it fails (fancy-regex's default: 1,000,000).
pub const BACKTRACK_LIMIT: usize = 100_000;

/// Why a declared schema is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("the schema is {0} bytes as JSON; at most {MAX_BYTES}")]
    TooLarge(usize),
    #[error("the schema nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("not a valid JSON Schema: {0}")]
    Invalid(String),
}

/// `schema` compiled, or why it is refused.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, SchemaError> {
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |text| text.len());
    if bytes > MAX_BYTES {
        return Err(SchemaError::TooLarge(bytes));
    }
    if deeper_than(schema, MAX_DEPTH) {
        return Err(SchemaError::TooDeep);
    }
    let patterns = jsonschema::PatternOptions::fancy_regex()
        .size_limit(PATTERN_BYTES)
        .dfa_size_limit(PATTERN_BYTES)
        .backtrack_limit(BACKTRACK_LIMIT);
    jsonschema::options()
        .with_pattern_options(patterns)
        .build(schema)
        .map_err(|error| SchemaError::Invalid(error.to_string()))
}

/// Whether `value` nests more than `levels` objects and arrays; stops looking at the first level
/// too many.
fn deeper_than(value: &Value, levels: usize) -> bool {
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Object(map) => Box::new(map.values()),
        Value::Array(items) => Box::new(items.iter()),
        _ => return false,
    };
    levels == 0
        || children
            .into_iter()
            .any(|child| deeper_than(child, levels - 1))
}

#[cfg(test)]
mod tests;
