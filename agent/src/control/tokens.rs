//! The control tokens a pod's agent accepts: the current one and, during a rotation, the previous
//! one, read from the mounted Secret (`token`, and `previous` beside it) and read again when they
//! change (the kubelet updates a mounted Secret within its sync period, about a minute), so a
//! rotation needs no restart. Control requests signed with either are taken; drain keys derived
//! from either open the drain. `/control/status` reports the current token's key id, so the
//! operator knows when every pod has the new one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use toa_context::control::{key_id, PREVIOUS_TOKEN};

/// How often the token files are read again.
pub const RELOAD: Duration = Duration::from_secs(5);

/// The tokens accepted now, the current one first.
#[derive(Clone)]
pub struct Tokens(Arc<RwLock<Vec<String>>>);

/// Key ids only: a token never reaches a log through `{:?}`.
impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self
            .0
            .read()
            .expect("tokens")
            .iter()
            .map(|t| key_id(t))
            .collect();
        f.debug_tuple("Tokens").field(&ids).finish()
    }
}

impl Tokens {
    /// The tokens read from `file` and its `previous` sibling (which may be missing).
    pub fn read(file: &Path) -> Result<Self, TokenFileError> {
        Ok(Self(Arc::new(RwLock::new(read_all(file)?))))
    }

    /// One token that never changes (tests, and runs without a mounted Secret).
    pub fn fixed(token: &str) -> Self {
        Self(Arc::new(RwLock::new(vec![token.to_owned()])))
    }

    /// Reads the files again every [`RELOAD`] while `self` is used; a file that cannot be read
    /// keeps the tokens as they were (logged).
    pub fn keep_reading(&self, file: PathBuf) {
        let weak = Arc::downgrade(&self.0);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RELOAD).await;
                let Some(tokens) = weak.upgrade() else { return };
                match read_all(&file) {
                    Ok(read) => {
                        let mut current = tokens.write().expect("tokens");
                        if *current != read {
                            tracing::info!(key = %key_id(&read[0]), previous = read.len() > 1, "control token changed");
                            *current = read;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the control token again; keeping the one read before")
                    }
                }
            }
        });
    }

    /// Whether any accepted token satisfies `check`.
    pub fn any(&self, mut check: impl FnMut(&str) -> bool) -> bool {
        self.0
            .read()
            .expect("tokens")
            .iter()
            .any(|token| check(token))
    }

    /// The current token.
    pub fn current(&self) -> String {
        self.0.read().expect("tokens")[0].clone()
    }

    /// The current token's key id.
    pub fn key_id(&self) -> String {
        key_id(&self.current())
    }
}

/// Why a token file cannot be used: the flag that named it, the file, the reason.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("--control-token-file {}: {error}", path.display())]
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--control-token-file {}: expected a token, the file is empty", path.display())]
    Empty { path: PathBuf },
}

fn read_all(file: &Path) -> Result<Vec<String>, TokenFileError> {
    let mut tokens = vec![read_token(file)?];
    let previous = file.with_file_name(PREVIOUS_TOKEN);
    if previous.exists() {
        tokens.push(read_token(&previous)?);
    }
    Ok(tokens)
}

/// A token file's content without surrounding white space, never empty.
fn read_token(path: &Path) -> Result<String, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|error| TokenFileError::Unreadable {
        path: path.to_owned(),
        error,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(token.to_owned())
}
