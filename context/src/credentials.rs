//! Credentials for Redis and the broker, from the environment or from a mounted Secret file.
//! They are kept apart from addresses and never printed: [`Secret`]'s `Debug` shows `***`.

use crate::{annotations::Vars, ContextError};
use std::fmt;

/// A value that must not reach logs, errors or status.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A user name and a password, either optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: Option<Secret>,
}

impl Credentials {
    /// Reads `{PREFIX}_USERNAME`, and `{PREFIX}_PASSWORD` or the file named by
    /// `{PREFIX}_PASSWORD_FILE` (a mounted Secret). Giving both password forms is refused.
    pub fn from_vars(vars: &dyn Vars, prefix: &str) -> Result<Self, ContextError> {
        let username = vars.get(&format!("{prefix}_USERNAME"));
        let inline = vars.get(&format!("{prefix}_PASSWORD"));
        let file_key = format!("{prefix}_PASSWORD_FILE");
        let file = vars.get(&file_key);
        let password = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(ContextError::invalid(
                    format!("{prefix}_PASSWORD"),
                    format!("expected either {prefix}_PASSWORD or {file_key}, not both"),
                ))
            }
            (Some(password), None) => Some(Secret(password)),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path).map_err(|error| {
                    ContextError::invalid(
                        file_key.clone(),
                        format!("expected a readable file, {path:?} gave: {error}"),
                    )
                })?;
                Some(Secret(text.trim_end_matches(['\n', '\r']).to_owned()))
            }
            (None, None) => None,
        };
        Ok(Self { username, password })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn reads_inline_or_file_never_both() {
        let dir = std::env::temp_dir().join(format!("toa-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "from-file\n").unwrap();
        let path = file.to_str().unwrap().to_owned();

        let vars: HashMap<String, String> =
            [("TOA_REDIS_PASSWORD_FILE".into(), path.clone())].into();
        let credentials = Credentials::from_vars(&vars, "TOA_REDIS").unwrap();
        assert_eq!(credentials.password.unwrap().expose(), "from-file");

        let vars: HashMap<String, String> = [
            ("TOA_REDIS_PASSWORD_FILE".into(), path),
            ("TOA_REDIS_PASSWORD".into(), "inline".into()),
        ]
        .into();
        let error = Credentials::from_vars(&vars, "TOA_REDIS").unwrap_err();
        assert!(error.to_string().contains("not both"), "{error}");
        assert!(!error.to_string().contains("inline"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn debug_hides_the_password() {
        let credentials = Credentials {
            username: Some("app".into()),
            password: Some(Secret::new("hunter2")),
        };
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }
}
