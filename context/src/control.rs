//! What the operator and the agent derive from a Composition's control token, so both sides
//! compute it the same way.
//!
//! The drain key: the component containers' `preStop` hook is an `httpGet` to the agent's probe
//! port, whose path is written in the pod spec. That request must start a drain, and a program in
//! the pod must not be able to start one (it can reach every port of its pod). So the path
//! carries a one-way derivation of the control token: the agent (which reads the token from its
//! own mount) recomputes it, the program (which never sees the token or the pod spec) cannot, and
//! whoever reads the pod spec learns nothing that opens the control endpoint. The key is in the
//! path, not a header, because kubelets before 1.23 send a lifecycle hook's `httpGet` without
//! its headers (and as `http://ip:port/` + path, so with a doubled slash).

use sha2::{Digest, Sha256};

/// Where the component containers' `preStop` hook asks the agent to drain, on its probe port:
/// this, a slash and the drain key.
pub const DRAIN_PATH: &str = "/drain";

/// Where each component container's `postStart` hook tells the agent it started, on its probe
/// port: this, a slash, the container's index, a slash and the drain key. The first time is the
/// pod's start; any later one, a container the kubelet restarted, whose new program gets the
/// lifecycle again.
pub const STARTED_PATH: &str = "/started";

/// The header a drain request to the local API (`toa-agent drain`) carries the drain key in.
pub const DRAIN_HEADER: &str = "x-toa-drain";

/// The drain key for a control token: hex SHA-256 of a fixed label and the token.
pub fn drain_key(token: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"toa drain key v1\0")
        .chain_update(token.as_bytes())
        .finalize();
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Compares a presented key or token with the expected one in time that does not depend on
/// where they differ (the control endpoint's bearer token too).
pub fn same_key(presented: &str, expected: &str) -> bool {
    presented.len() == expected.len()
        && presented
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_derived_one_way_and_differs_per_token() {
        let key = drain_key("token-a");
        assert_eq!(key.len(), 64);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(key, drain_key("token-a"), "the same on both sides");
        assert_ne!(key, drain_key("token-b"));
        assert!(!key.contains("token-a"));
    }

    #[test]
    fn keys_compare_equal_only_when_identical() {
        let key = drain_key("t");
        assert!(same_key(&key, &key));
        assert!(!same_key(&key[1..], &key));
        assert!(!same_key("", &key));
        let mut other = key.clone().into_bytes();
        other[63] = if other[63] == b'0' { b'1' } else { b'0' };
        assert!(!same_key(std::str::from_utf8(&other).unwrap(), &key));
    }
}
