//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and `tracestate`
//! headers a call carries from the program that makes it, through the agents and the broker, to
//! the program that runs it. One definition for the agent (which reads them from programs and
//! from AMQP messages, and writes them to both) and the Rust clients. A malformed header is
//! ignored, as the recommendation says: the call goes on, in a trace of its own.

/// The header holding the version, trace id, parent span id and flags.
pub const TRACEPARENT: &str = "traceparent";
/// The vendors' header, passed on as it came.
pub const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` passed on (32 list members of the recommendation's usual size).
const MAX_STATE: usize = 512;

/// `traceparent`'s fields (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The span that made the call: the parent of the spans the receiver starts.
    pub parent_id: [u8; 8],
    pub flags: u8,
}

/// The `sampled` flag: the caller records this trace.
pub const SAMPLED: u8 = 0x01;

impl TraceParent {
    /// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, ids not all zero. A later version is read by
    /// its first four fields, as the recommendation asks; version `ff` is invalid.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        // ASCII first: the fields are sliced by byte, and the header may come from anyone.
        if !bytes.is_ascii()
            || bytes.len() < 55
            || (bytes.len() > 55 && (text.starts_with("00") || bytes[55] != b'-'))
        {
            return None;
        }
        let version = hex::<1>(&text[0..2])?;
        if version[0] == 0xff || [2, 35, 52].iter().any(|&at| bytes[at] != b'-') {
            return None;
        }
        let trace_id = hex::<16>(&text[3..35])?;
        let parent_id = hex::<8>(&text[36..52])?;
        // Only the flags this version defines are kept: unknown ones are not passed on.
        let flags = hex::<1>(&text[53..55])?[0] & SAMPLED;
        let zero = |id: &[u8]| id.iter().all(|b| *b == 0);
        (!zero(&trace_id) && !zero(&parent_id)).then_some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            lower_hex(&self.trace_id),
            lower_hex(&self.parent_id),
            self.flags
        )
    }
}

/// A call's trace: where it comes from, and the vendors' state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub parent: TraceParent,
    pub state: Option<String>,
}

impl TraceContext {
    /// From the two headers' raw values; `None` without a valid `traceparent`. A `tracestate`
    /// that is too long or not printable ASCII is dropped, the trace kept.
    pub fn read(parent: Option<&[u8]>, state: Option<&[u8]>) -> Option<Self> {
        let parent = TraceParent::parse(std::str::from_utf8(parent?).ok()?)?;
        let state = state
            .and_then(|value| std::str::from_utf8(value).ok())
            .map(str::trim)
            .filter(|value| {
                !value.is_empty()
                    && value.len() <= MAX_STATE
                    && value.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_owned);
        Some(Self { parent, state })
    }

    /// The headers to send, by name.
    pub fn write(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![(TRACEPARENT, self.parent.to_string())];
        headers.extend(self.state.iter().map(|state| (TRACESTATE, state.clone())));
        headers
    }
}

/// `N` bytes from `2N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        bytes[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(bytes)
}

/// Lowercase hex digits of `bytes`.
pub fn lower_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The variable naming the collector's OTLP/HTTP base URL: spans go to its `/v1/traces`.
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The variable naming the whole traces URL instead.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The variable naming the spans' `service.name`.
pub const SERVICE_VAR: &str = "OTEL_SERVICE_NAME";
/// The longest endpoint taken.
const MAX_ENDPOINT: usize = 2048;

/// What is wrong with an OTLP endpoint. The value itself is not repeated: it may hold a
/// credential, and the message goes to logs and a Composition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadEndpoint {
    #[error("expected an http:// URL (spans go over plain HTTP)")]
    NotHttp,
    #[error("expected a URL with a host, http://host:4318")]
    NoHost,
    #[error("a URL naming a user or password is refused: it would show in logs")]
    Credentials,
    #[error("a URL with a query or fragment is refused")]
    Query,
    #[error("over {MAX_ENDPOINT} bytes")]
    TooLong,
}

/// Checks an OTLP/HTTP endpoint: `http://host[:port][/path]`, nothing more. One rule for the
/// agent (its variables) and the operator (a Composition's `spec.traces.endpoint`).
pub fn check_endpoint(text: &str) -> Result<(), BadEndpoint> {
    if text.len() > MAX_ENDPOINT {
        return Err(BadEndpoint::TooLong);
    }
    let url = url::Url::parse(text).map_err(|_| {
        if text.starts_with("http://") {
            BadEndpoint::NoHost
        } else {
            BadEndpoint::NotHttp
        }
    })?;
    if url.scheme() != "http" {
        return Err(BadEndpoint::NotHttp);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BadEndpoint::Credentials);
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(BadEndpoint::NoHost);
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(BadEndpoint::Query);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_example_reads_back_as_written() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(
            lower_hex(&parent.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(lower_hex(&parent.parent_id), "00f067aa0ba902b7");
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), EXAMPLE);
        let context =
            TraceContext::read(Some(EXAMPLE.as_bytes()), Some(b"congo=t61rcWkgMzE")).unwrap();
        assert_eq!(
            context.write(),
            [
                (TRACEPARENT, EXAMPLE.to_owned()),
                (TRACESTATE, "congo=t61rcWkgMzE".to_owned())
            ]
        );
    }

    #[test]
    fn malformed_parents_are_ignored_and_a_later_version_read_by_its_fields() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?} taken");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-what-comes";
        assert_eq!(TraceParent::parse(later).map(|p| p.flags), Some(SAMPLED));
        // Not ASCII: refused, however it splits (a byte slice inside a character would panic).
        let wide = format!("0é{}", &EXAMPLE[3..]);
        assert_eq!(TraceParent::parse(&wide), None);
        assert_eq!(TraceContext::read(Some(b"\xff"), None), None);
        // A state too long or not printable is dropped, the trace kept.
        let long = "a=".to_owned() + &"b".repeat(600);
        for state in [long.as_bytes(), b"a=\x01"] {
            let context = TraceContext::read(Some(EXAMPLE.as_bytes()), Some(state)).unwrap();
            assert_eq!(context.state, None);
        }
    }

    #[test]
    fn an_endpoint_is_plain_http_to_a_host_and_names_no_user() {
        for good in [
            "http://collector:4318",
            "http://10.0.0.1:4318/otlp/",
            "http://c",
        ] {
            assert_eq!(check_endpoint(good), Ok(()), "{good}");
        }
        let long = format!("http://c/{}", "a".repeat(MAX_ENDPOINT));
        for (bad, said) in [
            ("https://collector:4318", BadEndpoint::NotHttp),
            ("collector:4318", BadEndpoint::NotHttp),
            ("http://", BadEndpoint::NoHost),
            (
                "http://user:secret@collector:4318",
                BadEndpoint::Credentials,
            ),
            ("http://token@collector:4318", BadEndpoint::Credentials),
            ("http://collector:4318/?key=secret", BadEndpoint::Query),
            (long.as_str(), BadEndpoint::TooLong),
        ] {
            assert_eq!(check_endpoint(bad), Err(said), "{bad}");
            assert!(!said.to_string().contains("secret"));
        }
    }
}
