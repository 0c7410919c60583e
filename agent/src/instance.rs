//! The name of a process (`context.instance`): `TOA_INSTANCE` if set, else generated.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TOA_INSTANCE: expected 1 to 64 ASCII letters, digits, '_', '.', ':' or '-', got {0:?}")]
pub struct InvalidInstance(String);

impl Instance {
    /// `TOA_INSTANCE` when given (validated), else a generated name.
    pub fn from_env(value: Option<String>) -> Result<Self, InvalidInstance> {
        match value {
            Some(name) => Self::parse(&name),
            None => Ok(Self::generate()),
        }
    }

    pub fn parse(name: &str) -> Result<Self, InvalidInstance> {
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidInstance(name.chars().take(80).collect()))
        }
    }

    pub fn generate() -> Self {
        Self(format!(
            "p-{:012x}",
            rand::random::<u64>() & 0xffff_ffff_ffff
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_the_seed_allows_and_refuses_the_rest() {
        for good in ["till-7", "a", "node_1.zone:b", &"x".repeat(64)] {
            assert!(Instance::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "till 7", "tïll", "a/b", &"x".repeat(65)] {
            let error = Instance::parse(bad).unwrap_err().to_string();
            assert!(
                error.starts_with("TOA_INSTANCE: expected 1 to 64 ASCII letters"),
                "{error}"
            );
        }
        assert_ne!(Instance::generate(), Instance::generate());
        assert_eq!(Instance::from_env(None).unwrap().as_str().len(), 14);
    }
}
