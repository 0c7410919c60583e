//! Keys belong to the application and the component: every Redis key the primitives touch starts
//! with `toa:{application}:{component}:`, so two components, or two applications sharing one
//! Redis, never meet. In a pod the application is named with its Kubernetes namespace
//! (`toa:{namespace}/{application}:{component}:`, [`toa_context::annotations::shared_name`]), so
//! two namespaces running one application name do not meet either.

use super::AtomError;
use toa_context::annotations::shared_name;

/// Whose keys these are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub application: String,
    /// The component's full name, `namespace.name` (or `name` without a namespace).
    pub component: String,
    /// In a pod, its Kubernetes namespace.
    pub kubernetes_namespace: Option<String>,
}

impl Scope {
    pub fn new(application: impl Into<String>, component: impl Into<String>) -> Self {
        Self {
            application: application.into(),
            component: component.into(),
            kubernetes_namespace: None,
        }
    }

    /// This scope in a pod of the Kubernetes namespace `namespace` (none: a local run).
    pub fn in_namespace(mut self, namespace: Option<String>) -> Self {
        self.kubernetes_namespace = namespace;
        self
    }

    /// The prefix of every Redis key of this scope.
    pub fn prefix(&self) -> String {
        let application = shared_name(&self.application, self.kubernetes_namespace.as_deref());
        format!("toa:{application}:{}:", self.component)
    }
}

/// One key, or several held (or charged) together.
pub trait IntoKeys {
    fn into_keys(self) -> Vec<String>;
}

impl IntoKeys for &str {
    fn into_keys(self) -> Vec<String> {
        vec![self.to_owned()]
    }
}

impl IntoKeys for String {
    fn into_keys(self) -> Vec<String> {
        vec![self]
    }
}

impl IntoKeys for Vec<String> {
    fn into_keys(self) -> Vec<String> {
        self
    }
}

impl IntoKeys for &[String] {
    fn into_keys(self) -> Vec<String> {
        self.to_vec()
    }
}

impl IntoKeys for &[&str] {
    fn into_keys(self) -> Vec<String> {
        self.iter().map(|key| (*key).to_owned()).collect()
    }
}

impl<const N: usize> IntoKeys for [&str; N] {
    fn into_keys(self) -> Vec<String> {
        self.iter().map(|key| (*key).to_owned()).collect()
    }
}

/// The longest key accepted, in bytes.
pub const MAX_KEY: usize = 512;

/// The most keys one call takes (held or charged together).
pub const MAX_KEYS: usize = 64;

/// Refuses empty lists, empty or overlong keys, control characters and repeated keys.
pub fn validate(keys: Vec<String>) -> Result<Vec<String>, AtomError> {
    if keys.is_empty() {
        return Err(AtomError::InvalidKey {
            key: String::new(),
            reason: "expected at least one key",
        });
    }
    if keys.len() > MAX_KEYS {
        return Err(AtomError::TooManyKeys(keys.len()));
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for key in &keys {
        let reason = if key.is_empty() {
            Some("expected a non-empty string")
        } else if key.len() > MAX_KEY {
            Some("expected at most 512 bytes")
        } else if key.chars().any(char::is_control) {
            Some("expected no control characters")
        } else if !seen.insert(key.as_str()) {
            Some("given twice")
        } else {
            None
        };
        if let Some(reason) = reason {
            let mut key = key.clone();
            key.truncate(64);
            return Err(AtomError::InvalidKey { key, reason });
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_separate_components_and_applications() {
        let a = Scope::new("shop", "store.orders").prefix();
        let b = Scope::new("shop", "billing.wallets").prefix();
        let c = Scope::new("bank", "store.orders").prefix();
        assert_eq!(a, "toa:shop:store.orders:");
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn in_a_pod_the_prefix_carries_the_kubernetes_namespace() {
        let of = |namespace: &str| {
            Scope::new("shop", "store.orders")
                .in_namespace(Some(namespace.to_owned()))
                .prefix()
        };
        assert_eq!(of("prod"), "toa:prod/shop:store.orders:");
        assert_ne!(of("prod"), of("staging"));
        assert_ne!(of("prod"), Scope::new("shop", "store.orders").prefix());
    }

    #[test]
    fn refuses_bad_keys() {
        let refused = |keys: Vec<&str>| {
            validate(keys.into_iter().map(str::to_owned).collect())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(vec![]),
            "invalid key \"\": expected at least one key"
        );
        assert_eq!(
            refused(vec![""]),
            "invalid key \"\": expected a non-empty string"
        );
        assert_eq!(refused(vec!["a", "a"]), "invalid key \"a\": given twice");
        assert_eq!(
            refused(vec!["a\nb"]),
            "invalid key \"a\\nb\": expected no control characters"
        );
        let long = "x".repeat(513);
        assert!(refused(vec![&long]).contains("expected at most 512 bytes"));
        assert!(validate(vec!["settlement".into(), "customer:42".into()]).is_ok());
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| i.to_string()).collect();
        assert_eq!(
            validate(many).unwrap_err().to_string(),
            "keys: expected at most 64 keys in one call, got 65"
        );
        assert!(validate((0..MAX_KEYS).map(|i| i.to_string()).collect()).is_ok());
    }
}
