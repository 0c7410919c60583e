//! Which object a call works on (DESIGN 17, seed 003): `{"query": {"id", "version"}}` beside a
//! call's input, one definition for the agents that check and carry it and the SDKs' protocol.

use serde::{Deserialize, Serialize};

/// Which object a call works on, and the version the caller saw (DESIGN 17).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// 1 to 64 of `[A-Za-z0-9._-]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A write is refused (`PRECONDITION_FAILED`) when the object is at another version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// The longest object id.
pub const MAX_ID: usize = 64;

/// An object's id: 1 to 64 letters, digits, `.`, `_` or `-`.
pub fn check_id(id: &str) -> Result<(), String> {
    let fits = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if (1..=MAX_ID).contains(&id.len()) && id.bytes().all(fits) {
        return Ok(());
    }
    let given: String = id.chars().take(80).collect();
    Err(format!(
        "`query.id`: expected 1 to {MAX_ID} letters, digits, '.', '_' or '-', got {given:?}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_1_to_64_of_the_alphabet() {
        for good in [
            "a",
            "c0ffee00c0ffee00c0ffee00c0ffee00",
            "w-1.b_2",
            &"x".repeat(64),
        ] {
            assert_eq!(check_id(good), Ok(()), "{good}");
        }
        for bad in ["", "a/b", "é", "a b", &"x".repeat(65)] {
            let error = check_id(bad).unwrap_err();
            assert!(
                error.starts_with("`query.id`: expected 1 to 64 letters"),
                "{error}"
            );
        }
        let unknown = serde_json::from_str::<Query>(r#"{"id": "a", "owner": "b"}"#);
        assert!(unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `owner`"));
    }
}
