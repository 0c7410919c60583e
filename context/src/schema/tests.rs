use super::*;
use serde_json::json;

/// `levels` nested `properties` objects: 2 levels of JSON each, 1 at the leaf.
fn nested(levels: usize) -> Value {
    (0..levels).fold(
        json!({ "type": "string" }),
        |inner, _| json!({ "properties": { "a": inner } }),
    )
}

#[test]
fn a_schema_up_to_the_limits_compiles_and_checks() {
    // 15 × 2 + 1 = 31 levels.
    let validator = compile(&nested(15)).unwrap();
    let value = (0..15).fold(json!(7), |inner, _| json!({ "a": inner }));
    assert!(!validator.is_valid(&value), "the leaf must be a string");
}

#[test]
fn a_schema_deeper_than_32_levels_is_refused() {
    // 16 × 2 + 1 = 33 levels.
    assert_eq!(compile(&nested(16)).unwrap_err(), SchemaError::TooDeep);
    // The schema object, `enum`'s array, then 30 arrays: 32 levels (the leaf number counts none).
    let array = (0..30).fold(json!(1), |inner, _| json!([inner]));
    assert!(compile(&json!({ "enum": [array] })).is_ok());
    let array = (0..31).fold(json!(1), |inner, _| json!([inner]));
    assert_eq!(
        compile(&json!({ "enum": [array] })).unwrap_err(),
        SchemaError::TooDeep
    );
}

#[test]
fn a_schema_over_64_kib_is_refused_with_its_size() {
    let names: Vec<String> = (0..6_000).map(|i| format!("value-{i:05}")).collect();
    let schema = json!({ "enum": names });
    let size = serde_json::to_vec(&schema).unwrap().len();
    assert!(size > MAX_BYTES);
    assert_eq!(compile(&schema).unwrap_err(), SchemaError::TooLarge(size));
    let schema = json!({ "enum": names[..4_000] });
    assert!(compile(&schema).is_ok());
}

#[test]
fn a_pattern_that_compiles_too_large_is_refused() {
    // Within the regex crate's own 10 MiB default, beyond 1 MiB.
    let schema = json!({ "pattern": "\\w{12000}" });
    assert!(
        jsonschema::validator_for(&schema).is_ok(),
        "the crate's default takes it"
    );
    let error = compile(&schema).unwrap_err();
    assert!(
        matches!(&error, SchemaError::Invalid(message) if message.contains("is not a \"regex\"")),
        "{error}"
    );
    assert!(compile(&json!({ "pattern": "^[a-z]{1,63}$" })).is_ok());
}
