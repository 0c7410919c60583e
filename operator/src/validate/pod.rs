//! `spec.pod`: what users add to the pods, checked before anything is applied so that a bad key
//! is an `InvalidSpec` naming it rather than a Deployment the API server refuses. The keys the
//! operator sets itself — the labels it selects the pods by, the annotations Prometheus and
//! `kubectl logs` read — are refused, so nothing it needs can be changed from the spec; so are
//! the annotations through which a container's AppArmor or seccomp profile could be loosened.
//! Other annotations under Kubernetes' prefixes (`cluster-autoscaler.kubernetes.io/safe-to-evict`,
//! `kubernetes.io/egress-bandwidth`) are the user's to set.

use super::{invalid, InvalidSpec};
use crate::crd::PodSettings;
use crate::names::{self, DEFAULT_CONTAINER_ANNOTATION, SCRAPE_ANNOTATIONS};
use std::collections::BTreeMap;

/// Checks `spec.pod`.
pub fn check(pod: &PodSettings) -> Result<(), InvalidSpec> {
    let own_labels = names::labels("composition");
    labels("spec.pod.labels", &pod.labels, |key| {
        own_labels.contains_key(key)
    })?;
    labels("spec.pod.nodeSelector", &pod.node_selector, |_| false)?;
    for key in pod.annotations.keys() {
        let field = format!("spec.pod.annotations.{key}");
        if !qualified(key) {
            return Err(invalid(&field, NOT_A_KEY));
        }
        if SCRAPE_ANNOTATIONS.contains(&key.as_str()) || key == DEFAULT_CONTAINER_ANNOTATION {
            return Err(invalid(&field, "set by the operator"));
        }
        if PROFILES.iter().any(|prefix| key.starts_with(prefix)) {
            return Err(invalid(
                &field,
                "sets a container's AppArmor or seccomp profile, which the operator keeps at the runtime's default",
            ));
        }
    }
    for (index, secret) in pod.image_pull_secrets.iter().enumerate() {
        if !subdomain(&secret.name) {
            let field = format!("spec.pod.imagePullSecrets[{index}].name");
            return Err(invalid(
                &field,
                format!("expected a Secret's name, got {:?}", secret.name),
            ));
        }
    }
    let named = [
        (
            "spec.pod.priorityClassName",
            "PriorityClass",
            &pod.priority_class_name,
        ),
        (
            "spec.pod.serviceAccountName",
            "ServiceAccount",
            &pod.service_account_name,
        ),
    ];
    for (field, kind, name) in named {
        match name {
            Some(name) if !subdomain(name) => {
                return Err(invalid(
                    field,
                    format!("expected a {kind}'s name, got {name:?}"),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

const NOT_A_KEY: &str = "expected a key of an optional DNS-subdomain prefix and `/`, then 1 to 63 letters, digits, `-`, `_` or `.`, beginning and ending with a letter or digit";

/// Label keys and values (`own`: keys the operator sets, refused).
fn labels(
    field: &str,
    labels: &BTreeMap<String, String>,
    own: impl Fn(&str) -> bool,
) -> Result<(), InvalidSpec> {
    for (key, value) in labels {
        let field = format!("{field}.{key}");
        if !qualified(key) {
            return Err(invalid(&field, NOT_A_KEY));
        }
        if own(key) {
            return Err(invalid(
                &field,
                "set by the operator, which selects the pods by it",
            ));
        }
        if !value.is_empty() && !name(value) {
            return Err(invalid(&field, format!("expected a label value (at most 63 letters, digits, `-`, `_` or `.`, beginning and ending with a letter or digit), got {value:?}")));
        }
    }
    Ok(())
}

/// The annotation prefixes of the (legacy, still honoured) AppArmor and seccomp profiles.
const PROFILES: [&str; 2] = [
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
];

/// A label or annotation key: `[prefix/]name`.
fn qualified(key: &str) -> bool {
    match key.rsplit_once('/') {
        Some((prefix, rest)) => subdomain(prefix) && name(rest),
        None => name(key),
    }
}

/// 1–63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
fn name(text: &str) -> bool {
    spelled(text, 63, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
    })
}

/// A DNS subdomain: at most 253 of `[a-z0-9-.]`, alphanumeric at both ends.
pub(super) fn subdomain(text: &str) -> bool {
    spelled(text, 253, |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.')
    })
}

/// 1 to `max` bytes, each `allowed`, alphanumeric at both ends.
fn spelled(text: &str, max: usize, allowed: impl Fn(u8) -> bool) -> bool {
    let bytes = text.as_bytes();
    (1..=max).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(|b| allowed(*b))
}
