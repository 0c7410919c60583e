//! What a TLS connection to Redis or the broker (`rediss://`, `amqps://`) trusts: the public
//! roots (bundled, since the agent's image has no system store), or CA certificates, PEM, for
//! servers whose certificates a private CA signed (the common case in a cluster: cert-manager's
//! `ca.crt`). They come inline in `TOA_TLS_CA` (in a pod, the credentials Secret's key `ca.crt`)
//! or from the file `TOA_TLS_CA_FILE` names (a local run).
//!
//! The store (PostgreSQL) has CAs of its own, `TOA_STORAGE_CA` or `TOA_STORAGE_CA_FILE` (in a pod,
//! a CloudNativePG cluster's `<cluster>-ca` Secret, or the credentials Secret's `storage-ca.crt`):
//! a store's server is often signed by another CA than Redis's and the broker's, and one variable
//! cannot hold two Secrets' keys. Given, they turn TLS on for the store.

use crate::annotations::Vars;
use crate::ContextError;

/// The variable holding CA certificates, PEM.
pub const CA: &str = "TOA_TLS_CA";
/// The variable naming a PEM file of CA certificates.
pub const CA_FILE: &str = "TOA_TLS_CA_FILE";
/// The store's CA certificates, PEM, and the variable naming a file of them.
pub const STORAGE_CA: &str = "TOA_STORAGE_CA";
pub const STORAGE_CA_FILE: &str = "TOA_STORAGE_CA_FILE";

/// A CA file larger than this is refused: a bundle of every public root is about 200 KiB.
const MAX_BYTES: u64 = 1024 * 1024;

/// The CA certificates servers' certificates are checked against; `None`: the public roots.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Roots {
    pem: Option<String>,
}

impl std::fmt::Debug for Roots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let certificates = self.pem.as_deref().map(count);
        f.debug_struct("Roots")
            .field("certificates", &certificates)
            .finish()
    }
}

/// How many certificates a PEM text holds.
fn count(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

impl Roots {
    /// The certificates in [`CA`], or in the file [`CA_FILE`] names; neither: the public roots.
    /// Both, a file that cannot be read, more than 1 MiB, or no PEM certificate in it is refused
    /// naming the variable.
    pub fn from_vars(vars: &dyn Vars) -> Result<Self, ContextError> {
        Self::from_pair(vars, CA, CA_FILE)
    }

    /// The store's: the certificates in [`STORAGE_CA`], or in the file [`STORAGE_CA_FILE`]
    /// names; `None` when neither is set (the store is then reached without TLS).
    pub fn storage_from_vars(vars: &dyn Vars) -> Result<Option<Self>, ContextError> {
        let roots = Self::from_pair(vars, STORAGE_CA, STORAGE_CA_FILE)?;
        Ok(roots.pem.is_some().then_some(roots))
    }

    /// The certificates in the variable `ca`, or in the file the variable `ca_file` names.
    fn from_pair(
        vars: &dyn Vars,
        ca: &'static str,
        ca_file: &'static str,
    ) -> Result<Self, ContextError> {
        let set = |name: &str| vars.get(name).filter(|value| !value.is_empty());
        let (pem, key) = match (set(ca), set(ca_file)) {
            (Some(_), Some(_)) => {
                let message = format!("expected either {ca} or {ca_file}, not both");
                return Err(ContextError::invalid(ca, message));
            }
            (None, None) => return Ok(Self::default()),
            (Some(pem), None) => (pem, ca),
            (None, Some(path)) => (read(&path, ca_file)?, ca_file),
        };
        let refused = |message: String| ContextError::invalid(key, message);
        if pem.len() as u64 > MAX_BYTES {
            let size = pem.len();
            return Err(refused(format!(
                "expected at most {MAX_BYTES} bytes, got {size}"
            )));
        }
        if count(&pem) == 0 {
            return Err(refused(
                "expected PEM certificates (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        Ok(Self { pem: Some(pem) })
    }

    /// The CA certificates, PEM; `None` for the public roots.
    pub fn pem(&self) -> Option<&str> {
        self.pem.as_deref()
    }
}

/// The file at `path`, at most a byte over [`MAX_BYTES`] of it.
fn read(path: &str, key: &'static str) -> Result<String, ContextError> {
    use std::io::Read;
    let refused = |error: std::io::Error| {
        ContextError::invalid(key, format!("cannot read {path:?}: {error}"))
    };
    let file = std::fs::File::open(path).map_err(refused)?;
    let mut text = String::new();
    file.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(refused)?;
    Ok(text)
}

#[cfg(test)]
mod tests;
