//! Each component's own token for the local API. Every program in a pod reaches the local API
//! on loopback; a component's coordination routes (`/v1/{component}/lock`, `slots`, `onassigned`
//! and its listeners, `meter`) answer only a request carrying that component's token, so one
//! component cannot take another's locks, charge its meters or fail its listeners. Calls stay
//! open to every program (calling other components is the contract).
//!
//! A program gets its token as `TOA_AGENT_TOKEN` when the agent starts it (a local run, where the
//! routes do not ask for it: the agent started every process there), or, in a pod, in the file
//! `TOA_AGENT_TOKEN_FILE` names: the operator mounts a small in-memory volume per component into
//! the agent (`--component-tokens DIR`, `DIR/<index>/token`) and into that component's container
//! only. The agent writes a new random token there at every start, before it binds anything: a
//! program that took the local API's port while the agent container restarted, and collected
//! other programs' tokens meanwhile, holds nothing the restarted agent takes. Programs read the
//! file for each request (or again on a 401).

use axum::http::HeaderMap;
use rand::RngCore;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use toa_context::control::same_key;

/// The tokens of a process's components, by full name.
#[derive(Default)]
pub struct ComponentTokens {
    tokens: HashMap<String, String>,
    /// Whether the routes ask for them (a pod).
    enforced: bool,
}

/// Never the tokens.
impl std::fmt::Debug for ComponentTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentTokens")
            .field("components", &self.tokens.len())
            .field("enforced", &self.enforced)
            .finish()
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl ComponentTokens {
    /// A local run: a token per component, given to the programs the agent starts, not asked for.
    pub fn local(names: &[String]) -> Self {
        Self {
            tokens: names
                .iter()
                .map(|name| (name.clone(), random_token()))
                .collect(),
            enforced: false,
        }
    }

    /// A pod: component `i`'s new token written into `dir/<i>/token` (readable by the pod's
    /// group only), asked for on its routes.
    pub fn in_pod(dir: &Path, names: &[String]) -> Result<Self, ComponentTokenError> {
        let mut tokens = HashMap::new();
        for (index, name) in names.iter().enumerate() {
            let file = dir.join(index.to_string()).join("token");
            let token = random_token();
            write_token(&file, &token)
                .map_err(|error| ComponentTokenError::Unwritable { file, error })?;
            tokens.insert(name.clone(), token);
        }
        Ok(Self {
            tokens,
            enforced: true,
        })
    }

    /// What the program of `component` is given.
    pub fn token(&self, component: &str) -> Option<&str> {
        self.tokens.get(component).map(String::as_str)
    }

    /// Whether a request for `component`'s routes may go on: `Authorization: Bearer <its token>`
    /// in a pod; anything in a local run. Refused: why, for a 401.
    pub fn check(&self, component: &str, headers: &HeaderMap) -> Result<(), ComponentTokenError> {
        if !self.enforced {
            return Ok(());
        }
        let presented = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        match self.tokens.get(component) {
            Some(token) if same_key(presented, token) => Ok(()),
            // An unknown component is the route's own 404.
            None => Ok(()),
            Some(_) => Err(ComponentTokenError::Refused {
                component: component.to_owned(),
            }),
        }
    }
}

/// A token file that cannot be written (the agent does not start), or a request refused (401).
#[derive(Debug, thiserror::Error)]
pub enum ComponentTokenError {
    #[error("--component-tokens: cannot write {}: {error}", file.display())]
    Unwritable {
        file: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{component}'s routes take {component}'s token only: `Authorization: Bearer` and the token \
         its program was given (TOA_AGENT_TOKEN, or the file TOA_AGENT_TOKEN_FILE names)"
    )]
    Refused { component: String },
}

/// Writes `token` into `file` (0640: the agent, and the pod's group, which the component's
/// container shares through the pod's fsGroup).
fn write_token(file: &Path, token: &str) -> std::io::Result<()> {
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let partial = file.with_extension("partial");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o640)
        .open(&partial)?;
    out.write_all(token.as_bytes())?;
    out.sync_all()?;
    // Renamed into place: a program never reads half a token.
    std::fs::rename(partial, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        headers
    }

    #[test]
    fn in_a_pod_each_component_takes_its_own_token_only() {
        let dir = std::env::temp_dir().join(format!("toa-ctokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let names = vec!["a.one".to_owned(), "a.two".to_owned()];
        let tokens = ComponentTokens::in_pod(&dir, &names).unwrap();
        let one = std::fs::read_to_string(dir.join("0/token")).unwrap();
        let two = std::fs::read_to_string(dir.join("1/token")).unwrap();
        assert_ne!(one, two);
        assert!(tokens.check("a.one", &bearer(&one)).is_ok());
        assert!(
            tokens.check("a.one", &bearer(&two)).is_err(),
            "another's token"
        );
        assert!(
            tokens.check("a.one", &HeaderMap::new()).is_err(),
            "no token"
        );
        assert!(tokens.check("a.two", &bearer(&two)).is_ok());
        // An agent started again in the same pod writes new ones: what a program collected while
        // the agent was away opens nothing.
        let again = ComponentTokens::in_pod(&dir, &names).unwrap();
        assert!(again.check("a.one", &bearer(&one)).is_err());
        let renewed = std::fs::read_to_string(dir.join("0/token")).unwrap();
        assert!(again.check("a.one", &bearer(&renewed)).is_ok());
        let mode = std::fs::metadata(dir.join("0/token")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o640);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_local_run_gives_tokens_but_does_not_ask_for_them() {
        let tokens = ComponentTokens::local(&["a.one".to_owned()]);
        assert_eq!(tokens.token("a.one").map(str::len), Some(64));
        assert!(tokens.check("a.one", &HeaderMap::new()).is_ok());
        assert!(!format!("{tokens:?}").contains(tokens.token("a.one").unwrap()));
    }
}
