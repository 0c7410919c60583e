//! The operator's key, from which every Composition's control token is derived
//! ([`toa_context::control::derive_token`] over the Composition's UID), so the operator never
//! reads a Composition's Secret back: it writes the tokens it computes, and needs only `create`
//! and `patch` on Secrets in the Compositions' namespaces.
//!
//! The key is the Secret `--key-secret` in the operator's own namespace: `current` (at least 32
//! bytes) and, while it rotates, `previous`. The operator creates it with a random `current` when
//! it is missing and reads it again every [`REREAD`], so a rotation needs no restart: moving
//! `current` to `previous` and writing a new `current` (docs/composition.md) makes every
//! Composition's Secret hold the new token and the previous one, and the operator signs with the
//! new one and again with the previous one where an agent has not read its Secret yet.

use crate::agent_client::Keys;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;
use rand::RngCore;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

/// How often the key Secret is read again.
pub const REREAD: Duration = Duration::from_secs(10);
/// The shortest key taken.
pub const MIN_KEY_BYTES: usize = 32;
/// The Secret's entries.
pub const CURRENT: &str = "current";
pub const PREVIOUS: &str = "previous";

/// The operator's key, and the previous one during a rotation.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyRing {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
}

/// Never the keys themselves.
impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("previous", &self.previous.is_some())
            .finish_non_exhaustive()
    }
}

/// Why the key Secret cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the operator's key Secret {0}: {1}")]
    Invalid(String, String),
    #[error("reading or creating the operator's key Secret {0}: {1}")]
    Kube(String, #[source] kube::Error),
}

impl KeyRing {
    /// `current`, and `previous` when rotating.
    pub fn new(current: &[u8], previous: Option<&[u8]>) -> Self {
        Self {
            current: current.to_vec(),
            previous: previous.map(<[u8]>::to_vec),
        }
    }

    /// The control tokens of the Composition whose UID is `uid`.
    pub fn keys_for(&self, uid: &str) -> Keys {
        use toa_context::control::derive_token;
        Keys {
            current: derive_token(&self.current, uid),
            previous: self.previous.as_deref().map(|key| derive_token(key, uid)),
        }
    }

    /// The key ring a Secret's data holds; `name` for the message.
    pub fn from_secret(name: &str, secret: &Secret) -> Result<Self, KeyError> {
        let invalid = |message: String| KeyError::Invalid(name.to_owned(), message);
        let data = secret.data.as_ref();
        let entry = |key: &str| {
            data.and_then(|data| data.get(key))
                .map(|bytes| bytes.0.as_slice())
        };
        let checked = |key: &str, bytes: &[u8]| {
            if bytes.len() < MIN_KEY_BYTES {
                Err(invalid(format!(
                    "`{key}` holds {} bytes, expected at least {MIN_KEY_BYTES}",
                    bytes.len()
                )))
            } else {
                Ok(())
            }
        };
        let current = entry(CURRENT).ok_or_else(|| invalid(format!("no `{CURRENT}` entry")))?;
        checked(CURRENT, current)?;
        // An empty `previous` is none: what is left after a rotation that blanked it.
        let previous = entry(PREVIOUS).filter(|bytes| !bytes.is_empty());
        if let Some(previous) = previous {
            checked(PREVIOUS, previous)?;
        }
        Ok(Self::new(current, previous))
    }
}

/// Reads the key Secret `name`, creating it with a random `current` when it is missing (a
/// conflict means another replica created it first: it is read again).
pub async fn load_or_create(api: &Api<Secret>, name: &str) -> Result<KeyRing, KeyError> {
    let kube = |error| KeyError::Kube(name.to_owned(), error);
    for _ in 0..2 {
        if let Some(secret) = api.get_opt(name).await.map_err(kube)? {
            return KeyRing::from_secret(name, &secret);
        }
        match api.create(&PostParams::default(), &new_secret(name)).await {
            Ok(secret) => {
                tracing::info!(secret = name, "created the operator's key");
                return KeyRing::from_secret(name, &secret);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(kube(error)),
        }
    }
    Err(KeyError::Invalid(
        name.to_owned(),
        "created and deleted again while being read".to_owned(),
    ))
}

/// A new key Secret: 32 random bytes, as 64 hex digits (readable, and pasted as they are).
fn new_secret(name: &str) -> Secret {
    let mut bytes = [0u8; MIN_KEY_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                crate::names::MANAGER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            CURRENT.to_owned(),
            ByteString(hex.into_bytes()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

/// Loads the key ring into `ring` and reads it again every [`REREAD`], for as long as anyone
/// holds a receiver; a failed read keeps the ring as it was (logged at each failure: until the
/// first read, every reconcile waits on it).
pub async fn keep_reading(api: Api<Secret>, name: String, ring: watch::Sender<Option<KeyRing>>) {
    // Named with its namespace in every message.
    let label = format!("{}/{name}", api.namespace().unwrap_or_default());
    loop {
        match load_or_create(&api, &name).await {
            Ok(read) => {
                ring.send_if_modified(|held| {
                    let changed = held.as_ref() != Some(&read);
                    if changed {
                        tracing::info!(previous = read.previous.is_some(), "operator key read");
                        *held = Some(read);
                    }
                    changed
                });
            }
            Err(error) => {
                let error = error.to_string().replacen(&name, &label, 1);
                tracing::warn!(%error, "cannot read the operator's key; keeping the one read before, if any");
            }
        }
        if ring.is_closed() {
            return;
        }
        tokio::time::sleep(REREAD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(entries: &[(&str, &[u8])]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), ByteString(value.to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn tokens_are_derived_per_composition_and_the_previous_key_gives_the_previous_token() {
        let old = [1u8; 32];
        let new = [2u8; 32];
        let before = KeyRing::new(&old, None).keys_for("uid-1");
        let rotating = KeyRing::new(&new, Some(&old)).keys_for("uid-1");
        assert_eq!(rotating.previous.as_deref(), Some(before.current.as_str()));
        assert_ne!(rotating.current, before.current);
        assert_ne!(
            KeyRing::new(&old, None).keys_for("uid-2").current,
            before.current
        );
    }

    #[test]
    fn a_short_or_missing_key_is_refused_naming_the_entry() {
        let short = KeyRing::from_secret("ns/key", &secret(&[(CURRENT, b"short")]));
        let message = short.unwrap_err().to_string();
        assert!(
            message.contains("`current` holds 5 bytes, expected at least 32"),
            "{message}"
        );
        let missing = KeyRing::from_secret("ns/key", &secret(&[]))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("no `current`"), "{missing}");
        let long = [7u8; 40];
        let bad_previous =
            KeyRing::from_secret("ns/key", &secret(&[(CURRENT, &long), (PREVIOUS, b"x")]));
        assert!(bad_previous.unwrap_err().to_string().contains("`previous`"));
        let blank_previous =
            KeyRing::from_secret("ns/key", &secret(&[(CURRENT, &long), (PREVIOUS, b"")])).unwrap();
        assert_eq!(blank_previous, KeyRing::new(&long, None));
    }

    #[test]
    fn a_new_key_is_64_hex_digits_and_never_the_same() {
        let read = |s: &Secret| s.data.as_ref().unwrap()[CURRENT].0.clone();
        let (a, b) = (read(&new_secret("k")), read(&new_secret("k")));
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(u8::is_ascii_hexdigit));
        assert_ne!(a, b);
        assert!(format!("{:?}", KeyRing::new(&a, None))
            .find("KeyRing")
            .is_some());
        assert!(!format!("{:?}", KeyRing::new(&a, None)).contains(std::str::from_utf8(&a).unwrap()));
    }
}
