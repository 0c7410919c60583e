//! Secrets in a configuration. A string value of the form `$NAME` (an uppercase letter, then
//! uppercase letters, digits and `_`) is the place of the secret `NAME`, as in the original
//! runtime: `api-key: $STRIPE_API_KEY`. Its value never passes through the context, the
//! Composition or `TOA_CONFIGURATION`, which keep the placeholder: a program gets it as
//! `TOA_SECRET_NAME` ([`variable`]) and puts it in place (the SDKs do).

use serde_json::Value;

/// Where a secret goes in a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The JSON pointer of the value (`/mailer/password`), as the schema's errors name it.
    pub pointer: String,
    /// The secret's name, without the `$`.
    pub name: String,
}

/// What the environment variable of a secret starts with.
pub const PREFIX: &str = "TOA_SECRET_";

/// The environment variable a program reads the secret `name` from.
pub fn variable(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// The secret's name if `text` is a placeholder.
pub fn secret_name(text: &str) -> Option<&str> {
    let name = text.strip_prefix('$')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    (first.is_ascii_uppercase()
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
    .then_some(name)
}

/// Every placeholder in `value`, in document order.
pub fn placeholders(value: &Value) -> Vec<Placeholder> {
    let mut found = Vec::new();
    collect(value, &mut String::new(), &mut found);
    found
}

fn collect(value: &Value, pointer: &mut String, found: &mut Vec<Placeholder>) {
    let step = |pointer: &mut String, key: &str, value: &Value, found: &mut Vec<Placeholder>| {
        let length = pointer.len();
        pointer.push('/');
        pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
        collect(value, pointer, found);
        pointer.truncate(length);
    };
    match value {
        Value::String(text) => {
            if let Some(name) = secret_name(text) {
                found.push(Placeholder {
                    pointer: pointer.clone(),
                    name: name.to_owned(),
                });
            }
        }
        Value::Object(map) => map
            .iter()
            .for_each(|(key, value)| step(pointer, key, value, found)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(index, value)| step(pointer, &index.to_string(), value, found)),
        _ => {}
    }
}

/// `value` with every placeholder replaced by its secret's value from `lookup`; `Err` is the
/// first placeholder without one.
pub fn reveal(
    value: &Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Value, Placeholder> {
    let mut revealed = value.clone();
    for placeholder in placeholders(value) {
        let secret = lookup(&placeholder.name).ok_or_else(|| placeholder.clone())?;
        *revealed
            .pointer_mut(&placeholder.pointer)
            .expect("a placeholder's pointer") = Value::String(secret);
    }
    Ok(revealed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uppercase_dollar_names_are_secrets_and_nothing_else_is() {
        for text in ["$KEY", "$STRIPE_API_KEY", "$K2"] {
            assert_eq!(secret_name(text), Some(&text[1..]), "{text}");
        }
        for text in [
            "$", "$key", "$_KEY", "$2KEY", "KEY", "$KEY-1", " $KEY", "$Key", "$$KEY",
        ] {
            assert_eq!(secret_name(text), None, "{text}");
        }
    }

    #[test]
    fn placeholders_are_found_anywhere_with_their_pointers() {
        let value = json!({
            "provider": "https://mail.example.com",
            "api-key": "$MAIL_KEY",
            "a/b": {"c~d": "$NESTED"},
            "list": [1, "$IN_LIST", "$lower"],
            "count": 3
        });
        let found = placeholders(&value);
        let pairs: Vec<(&str, &str)> = found
            .iter()
            .map(|p| (p.pointer.as_str(), p.name.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("/a~1b/c~0d", "NESTED"),
                ("/api-key", "MAIL_KEY"),
                ("/list/1", "IN_LIST")
            ]
        );
        for placeholder in &found {
            assert!(
                value.pointer(&placeholder.pointer).is_some(),
                "{placeholder:?}"
            );
        }
    }

    #[test]
    fn reveal_puts_every_value_in_place_or_names_the_missing_one() {
        let value = json!({"key": "$MAIL_KEY", "list": ["$MAIL_KEY", "$OTHER"], "n": 1});
        let lookup = |name: &str| (name != "ABSENT").then(|| format!("<{name}>"));
        assert_eq!(
            reveal(&value, &lookup).unwrap(),
            json!({"key": "<MAIL_KEY>", "list": ["<MAIL_KEY>", "<OTHER>"], "n": 1})
        );
        let missing = reveal(&json!({"a": "$ABSENT"}), &lookup).unwrap_err();
        assert_eq!(
            (missing.pointer.as_str(), missing.name.as_str()),
            ("/a", "ABSENT")
        );
    }
}
