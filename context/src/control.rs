//! The contract between the operator and the agent, written once: the agent's ports, the control
//! endpoint's paths and its status, the control token's derivation and the signed requests.
//!
//! The drain key: the component containers' `preStop` hook is an `httpGet` to the agent's probe
//! port, whose path is written in the pod spec. That request must start a drain, and a program in
//! the pod must not be able to start one (it can reach every port of its pod). So the path
//! carries a random key the operator made for the Composition (kept in its Deployment): the agent
//! is given only its digest ([`drain_digest`]) and compares digests; the program never sees the
//! pod spec; and the key opens nothing else (it is not derived from the control token, so a
//! rotation does not change the pods). The key is in the path, not a header, because kubelets
//! before 1.23 send a lifecycle hook's `httpGet` without its headers (and as `http://ip:port/` +
//! path, so with a doubled slash).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The agent's local API, on loopback only: the component calls it, and so does `preStop`.
pub const LOCAL_PORT: u16 = 7090;
/// The agent's control endpoint on the pod network (halt, resume, status).
pub const CONTROL_PORT: u16 = 7091;
/// The agent's probes and metrics (`/healthz`, `/readyz`, `/metrics`; no token) on the pod
/// network.
pub const PROBE_PORT: u16 = 7092;

/// `GET`: the process's [`Status`].
pub const STATUS_PATH: &str = "/control/status";
/// `POST` a [`HaltRequest`]: pause for the halt; answers the [`Status`].
pub const HALT_PATH: &str = "/control/halt";
/// `POST` a [`HaltRequest`]: resume from the halt; answers the [`Status`].
pub const RESUME_PATH: &str = "/control/resume";

/// The Secret key, and so the mounted file beside the token's, of the previous control token
/// during a rotation: agents take requests signed with either.
pub const PREVIOUS_TOKEN: &str = "previous";

/// The body of a halt or a resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaltRequest {
    pub halt: String,
}

/// What a process reports about itself on [`STATUS_PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub phase: Phase,
    /// The halt the process is paused (or pausing) for; while starting, the halt it will pause
    /// for as soon as its lifecycle is done.
    pub halt: Option<String>,
    pub instance: String,
    pub calls: Calls,
    /// The last halt or resume that failed, until the next one succeeds (agents before it: none).
    #[serde(default)]
    pub failure: Option<Failure>,
    /// The [`key_id`] of the control token the agent has now (agents before rotation: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The lifecycle runs; with a halt, the process pauses for it once the lifecycle is done.
    Starting,
    Running,
    Pausing,
    Paused,
    Resuming,
    Draining,
    /// A phase this side does not know (a newer peer): neither paused nor busy.
    #[serde(other)]
    Unknown,
}

/// Calls made or received by the process's components since its last pause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calls {
    pub since_pause: u64,
    /// Milliseconds since the Unix epoch of the last such call's start or end.
    pub last_at_ms: Option<u64>,
    /// Calls running now (agents before it: 0).
    #[serde(default)]
    pub in_flight: u64,
}

/// A `pause` or `resume` that failed; the process is back where it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub halt: String,
    /// `pause` or `resume`.
    pub command: String,
    pub message: String,
}

/// Where the component containers' `preStop` hook asks the agent to drain, on its probe port:
/// this, a slash and the drain key.
pub const DRAIN_PATH: &str = "/drain";

/// How long the agent's listeners wait for a request's headers, an idle kept-alive connection
/// included: past it they close the connection. A client that keeps connections to an agent (the
/// operator) lets them go sooner, so that it never sends on one the agent is closing.
pub const HEADER_READ: std::time::Duration = std::time::Duration::from_secs(10);

/// The agent's variable holding the node's IPs (the downward API's `status.hostIPs`, comma
/// separated): the kubelet's hooks come from the node.
pub const HOST_IPS: &str = "TOA_HOST_IPS";

/// Where each component container's `postStart` hook tells the agent it started, on its probe
/// port: this, a slash, the container's index, a slash and the drain key. The first time is the
/// pod's start; any later one, a container the kubelet restarted, whose new program gets the
/// lifecycle again.
pub const STARTED_PATH: &str = "/started";

/// The digest of a drain key the agent is given (`--drain-key-sha256`): hex SHA-256 of a fixed
/// label and the key. The key itself is in the component containers' hooks only; the agent
/// compares digests, so its command line opens nothing.
pub fn drain_digest(key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"toa drain key v2\0")
        .chain_update(key.as_bytes())
        .finalize();
    hex(&digest)
}

/// A Composition's control token, derived from the operator's key and the Composition's UID:
/// hex HMAC-SHA256. The operator computes it again whenever it needs it, so it never reads the
/// Secret it writes the token into; a UID is never reused, so a Composition deleted and created
/// again under the same name gets another token.
pub fn derive_token(operator_key: &[u8], composition_uid: &str) -> String {
    use hmac::Mac;
    let mut mac =
        hmac::Hmac::<Sha256>::new_from_slice(operator_key).expect("HMAC takes a key of any length");
    mac.update(b"toa control token v1\0");
    mac.update(composition_uid.as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// A token's key id: the first 12 hex digits of a one-way hash, enough to tell tokens apart in
/// a status or a log without revealing them.
pub fn key_id(token: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"toa key id v1\0")
        .chain_update(token.as_bytes())
        .finalize();
    hex(&digest[..6])
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

/// The scheme of a signed control request's `Authorization` header:
/// `Toa-HMAC-SHA256 pod=<pod name>, ts=<unix seconds>, nonce=<hex>, sig=<hex>`.
///
/// The signature is HMAC-SHA256, keyed by the composition's token, over the method, the path,
/// the pod it is meant for, the time, a random nonce and the SHA-256 of the body. The token
/// itself never travels: a listener that took over a pod's IP learns a signature for that one
/// request, to that pod, within [`SIGNATURE_WINDOW_S`], which the agent of any other pod refuses,
/// and which that pod's agent takes once (it remembers the nonces it took for twice the window).
pub const SIGNATURE_SCHEME: &str = "Toa-HMAC-SHA256";

/// How far a signed request's time may be from the agent's clock, in seconds, either way.
pub const SIGNATURE_WINDOW_S: u64 = 30;

/// One control request, as signed.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub method: &'a str,
    pub path: &'a str,
    /// The pod the request is for (its agent's instance name).
    pub pod: &'a str,
    /// Unix seconds.
    pub ts: u64,
    /// Random, new for every request (16 to 64 hex digits); the verifier reads it from the header.
    pub nonce: &'a str,
    pub body: &'a [u8],
}

impl Signed<'_> {
    fn signature(&self, token: &str) -> String {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(token.as_bytes())
            .expect("HMAC takes a key of any length");
        let body = Sha256::digest(self.body);
        for part in [
            b"toa control v1".as_slice(),
            self.method.as_bytes(),
            self.path.as_bytes(),
            self.pod.as_bytes(),
            self.ts.to_string().as_bytes(),
            self.nonce.as_bytes(),
            body.as_slice(),
        ] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        hex(&mac.finalize().into_bytes())
    }

    /// The `Authorization` header's value.
    pub fn authorization(&self, token: &str) -> String {
        format!(
            "{SIGNATURE_SCHEME} pod={}, ts={}, nonce={}, sig={}",
            self.pod,
            self.ts,
            self.nonce,
            self.signature(token)
        )
    }

    /// Checks `header` against this request as the agent of `self.pod` received it at `self.ts`
    /// (its own clock; `self.nonce` is not used: the header's is); the request's nonce, for the
    /// caller to refuse a replay, or what was wrong, without echoing a secret.
    pub fn verify(&self, header: &str, token: &str) -> Result<String, String> {
        let fields = header
            .strip_prefix(SIGNATURE_SCHEME)
            .and_then(|rest| rest.strip_prefix(' '))
            .ok_or_else(|| {
                format!("expected `Authorization: {SIGNATURE_SCHEME} pod=.., ts=.., sig=..`")
            })?;
        let field = |name: &str| {
            fields
                .split(", ")
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .ok_or_else(|| format!("the signature has no `{name}`"))
        };
        let (pod, ts, sig) = (field("pod")?, field("ts")?, field("sig")?);
        let nonce = field("nonce")?;
        if !(16..=64).contains(&nonce.len()) || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("`nonce`: expected 16 to 64 hex digits".to_owned());
        }
        if pod != self.pod {
            return Err(format!(
                "signed for pod {pod:?}, not this one ({})",
                self.pod
            ));
        }
        let ts: u64 = ts
            .parse()
            .map_err(|_| "`ts`: expected unix seconds".to_owned())?;
        if ts.abs_diff(self.ts) > SIGNATURE_WINDOW_S {
            return Err(format!(
                "signed at {ts}, more than {SIGNATURE_WINDOW_S} s from this agent's clock ({})",
                self.ts
            ));
        }
        let expected = Signed { ts, nonce, ..*self }.signature(token);
        if same_key(sig, &expected) {
            Ok(nonce.to_owned())
        } else {
            Err("the signature does not match this request and the composition's token".to_owned())
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_digest_is_one_way_and_differs_per_key() {
        let digest = drain_digest("key-a");
        assert_eq!(digest.len(), 64);
        assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(digest, drain_digest("key-a"), "the same on both sides");
        assert_ne!(digest, drain_digest("key-b"));
        assert!(!digest.contains("key-a"));
    }

    #[test]
    fn a_token_depends_on_both_the_operator_key_and_the_uid() {
        let token = derive_token(b"operator key one", "uid-1");
        assert_eq!(token.len(), 64);
        assert_eq!(token, derive_token(b"operator key one", "uid-1"));
        assert_ne!(token, derive_token(b"operator key two", "uid-1"));
        assert_ne!(token, derive_token(b"operator key one", "uid-2"));
        // Known answer: HMAC-SHA256 keyed "k" over the label and "u" (Python's hmac module).
        assert_eq!(
            derive_token(b"k", "u"),
            "cbbad4390c571169bc68b66a06d774e8b57e463b0270eca81743e37db90d8a07"
        );
    }

    #[test]
    fn keys_compare_equal_only_when_identical() {
        let key = drain_digest("t");
        assert!(same_key(&key, &key));
        assert!(!same_key(&key[1..], &key));
        assert!(!same_key("", &key));
        let mut other = key.clone().into_bytes();
        other[63] = if other[63] == b'0' { b'1' } else { b'0' };
        assert!(!same_key(std::str::from_utf8(&other).unwrap(), &key));
    }

    #[test]
    fn a_signature_holds_for_its_request_pod_and_window_only() {
        let request = Signed {
            method: "POST",
            path: HALT_PATH,
            pod: "orders-7d9-abc",
            ts: 1_000_000,
            nonce: "0123456789abcdef",
            body: br#"{"halt":"h1"}"#,
        };
        let header = request.authorization("token");
        assert!(!header.contains("token"), "{header}");
        assert_eq!(
            request.verify(&header, "token"),
            Ok("0123456789abcdef".to_owned())
        );
        let other_nonce = header.replace("nonce=0123456789abcdef", "nonce=0123456789abcdee");
        assert!(request
            .verify(&other_nonce, "token")
            .unwrap_err()
            .contains("does not match"));
        let at = |ts: u64| Signed { ts, ..request };
        assert!(at(1_000_030).verify(&header, "token").is_ok());
        assert!(at(999_970).verify(&header, "token").is_ok());
        let late = at(1_000_031).verify(&header, "token").unwrap_err();
        assert!(late.contains("more than 30 s"), "{late}");
        let other_pod = Signed {
            pod: "orders-7d9-xyz",
            ..request
        };
        assert!(other_pod
            .verify(&header, "token")
            .unwrap_err()
            .contains("signed for pod"));
        for changed in [
            Signed {
                method: "GET",
                ..request
            },
            Signed {
                path: RESUME_PATH,
                ..request
            },
            Signed {
                body: br#"{"halt":"h2"}"#,
                ..request
            },
        ] {
            assert!(changed
                .verify(&header, "token")
                .unwrap_err()
                .contains("does not match"));
        }
        assert!(request.verify(&header, "other token").is_err());
        assert!(request.verify("Bearer token", "token").is_err());
        let forged = header.replace("ts=1000000", "ts=1000010");
        assert!(request
            .verify(&forged, "token")
            .unwrap_err()
            .contains("does not match"));
    }
}
