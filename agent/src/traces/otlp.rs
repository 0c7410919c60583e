//! OTLP/HTTP with protobuf bodies (<https://opentelemetry.io/docs/specs/otlp/>): the spans, in
//! batches, `POST`ed to the collector's `/v1/traces`. Configured by the OpenTelemetry SDKs'
//! variables, so a cluster's setting for its other services fits. The body is encoded here: the
//! few messages a span needs are stable, and the generated crates would bring protobuf and gRPC
//! code (prost, tonic) into an agent that needs 200 lines of it.
//!
//! Spans are handed over without waiting: the queue holds [`QUEUE`] of them, and a span that
//! finds it full is dropped (a debug line) rather than slowing a call. Spans still queued when
//! the process ends are lost: at most [`Settings::delay`]'s worth. A collector that fails is
//! logged at most once a minute; the spans of the failed batch are dropped.

use super::Kind;
use std::time::Duration;
use toa_context::trace;
use tokio::sync::mpsc;

/// Spans waiting for the exporter; beyond, dropped.
const QUEUE: usize = 2048;
/// The most spans in one request.
const BATCH: usize = 512;
/// How long one request may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);
/// How often a failing collector is logged.
const COMPLAIN_EVERY: Duration = Duration::from_secs(60);

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The traces URL, `http://host:port/v1/traces`.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service: String,
    /// The resource's `service.instance.id`: this process.
    pub instance: String,
    /// The resource's `toa.application`.
    pub application: String,
    /// The longest a finished span waits to be sent (`OTEL_BSP_SCHEDULE_DELAY`).
    pub delay: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{0}: {1}")]
    Endpoint(&'static str, trace::BadEndpoint),
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL: this agent sends http/protobuf only, got {0:?}")]
    Protocol(String),
    #[error("OTEL_BSP_SCHEDULE_DELAY: expected milliseconds, 1 to 60000, got {0:?}")]
    Delay(String),
}

impl Settings {
    /// From the OpenTelemetry variables (`var` reads one): `None` without an endpoint or with
    /// `OTEL_SDK_DISABLED=true`.
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        instance: &str,
        application: &str,
    ) -> Result<Option<Self>, SettingsError> {
        let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let endpoint = match (set(trace::TRACES_ENDPOINT_VAR), set(trace::ENDPOINT_VAR)) {
            (Some(traces), _) => (trace::TRACES_ENDPOINT_VAR, traces),
            (None, Some(base)) => (trace::ENDPOINT_VAR, base),
            (None, None) => return Ok(None),
        };
        // The value as given, by the rule the operator checks a Composition's with.
        trace::check_endpoint(&endpoint.1)
            .map_err(|bad| SettingsError::Endpoint(endpoint.0, bad))?;
        let endpoint = match endpoint.0 {
            trace::ENDPOINT_VAR => format!("{}/v1/traces", endpoint.1.trim_end_matches('/')),
            _ => endpoint.1,
        };
        if let Some(protocol) = set("OTEL_EXPORTER_OTLP_PROTOCOL").filter(|p| p != "http/protobuf")
        {
            return Err(SettingsError::Protocol(protocol));
        }
        let delay = match set("OTEL_BSP_SCHEDULE_DELAY") {
            None => Duration::from_millis(1000),
            Some(text) => match text.trim().parse::<u64>() {
                Ok(ms @ 1..=60_000) => Duration::from_millis(ms),
                _ => return Err(SettingsError::Delay(text)),
            },
        };
        Ok(Some(Self {
            endpoint,
            service: set(trace::SERVICE_VAR).unwrap_or_else(|| "toa-agent".to_owned()),
            instance: instance.to_owned(),
            application: application.to_owned(),
            delay,
        }))
    }
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_id: Option<[u8; 8]>,
    pub state: Option<String>,
    pub name: String,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(&'static str, String)>,
    /// Status `ERROR` with this message; `None`: unset (OTLP's default, "ok").
    pub error: Option<String>,
}

/// The queue to the exporting task.
pub struct Exporter {
    spans: mpsc::Sender<SpanData>,
}

impl Exporter {
    /// Starts the exporting task.
    pub fn start(settings: Settings) -> Self {
        let (spans, queue) = mpsc::channel(QUEUE);
        tokio::spawn(export(settings, queue));
        Self { spans }
    }

    /// Hands `span` over, or drops it when the queue is full.
    pub fn send(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            tracing::debug!("the span queue is full: a span was dropped");
        }
    }
}

/// Sends the spans in batches: each batch leaves [`Settings::delay`] after its first span at
/// the latest, or once it holds [`BATCH`].
async fn export(settings: Settings, mut queue: mpsc::Receiver<SpanData>) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_LIMIT)
        .build()
        .expect("a client without TLS or proxies builds");
    let mut complained: Option<tokio::time::Instant> = None;
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + settings.delay;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, queue.recv()).await {
                Ok(Some(span)) => batch.push(span),
                _ => break,
            }
        }
        let body = request(&settings, &batch);
        let sent = http
            .post(&settings.endpoint)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        if let Err(error) = sent {
            let now = tokio::time::Instant::now();
            if complained.is_none_or(|at| now >= at + COMPLAIN_EVERY) {
                tracing::warn!(endpoint = %settings.endpoint, %error, spans = batch.len(), "cannot export spans");
                complained = Some(now);
            }
        }
    }
}

/// `ExportTraceServiceRequest` holding `spans` of this process.
pub fn request(settings: &Settings, spans: &[SpanData]) -> Vec<u8> {
    let resource = message(|out| {
        for (key, value) in [
            ("service.name", settings.service.as_str()),
            ("service.instance.id", settings.instance.as_str()),
            ("toa.application", settings.application.as_str()),
        ] {
            field_message(out, 1, |kv| key_value(kv, key, value));
        }
    });
    let scope_spans = message(|out| {
        field_message(out, 1, |scope| {
            field_bytes(scope, 1, b"toa-agent");
            field_bytes(scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
        });
        for span in spans {
            field_message(out, 2, |out| encode_span(out, span));
        }
    });
    message(|out| {
        field_message(out, 1, |resource_spans| {
            field_bytes(resource_spans, 1, &resource);
            field_bytes(resource_spans, 2, &scope_spans);
        });
    })
}

fn encode_span(out: &mut Vec<u8>, span: &SpanData) {
    field_bytes(out, 1, &span.trace_id);
    field_bytes(out, 2, &span.span_id);
    if let Some(state) = &span.state {
        field_bytes(out, 3, state.as_bytes());
    }
    if let Some(parent) = &span.parent_id {
        field_bytes(out, 4, parent);
    }
    field_bytes(out, 5, span.name.as_bytes());
    tag(out, 6, VARINT);
    varint(out, span.kind as u64);
    tag(out, 7, FIXED64);
    out.extend_from_slice(&span.start_ns.to_le_bytes());
    tag(out, 8, FIXED64);
    out.extend_from_slice(&span.end_ns.to_le_bytes());
    for (key, value) in &span.attributes {
        field_message(out, 9, |kv| key_value(kv, key, value));
    }
    if let Some(error) = &span.error {
        field_message(out, 15, |status| {
            field_bytes(status, 2, error.as_bytes());
            // STATUS_CODE_ERROR
            tag(status, 3, VARINT);
            varint(status, 2);
        });
    }
}

/// `KeyValue{key, value: AnyValue{string_value}}`.
fn key_value(out: &mut Vec<u8>, key: &str, value: &str) {
    field_bytes(out, 1, key.as_bytes());
    field_message(out, 2, |any| field_bytes(any, 1, value.as_bytes()));
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH: u8 = 2;

fn tag(out: &mut Vec<u8>, field: u64, wire: u8) {
    varint(out, field << 3 | u64::from(wire));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    tag(out, field, LENGTH);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn field_message(out: &mut Vec<u8>, field: u64, write: impl FnOnce(&mut Vec<u8>)) {
    let inner = message(write);
    field_bytes(out, field, &inner);
}

fn message(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_endpoint_comes_from_the_opentelemetry_variables() {
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")];
        let settings = Settings::from_env(vars(&base), "p-1", "shop")
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(
            (settings.service.as_str(), settings.delay),
            ("toa-agent", Duration::from_secs(1))
        );
        let traces = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://tempo:4318/otlp/v1/traces",
            ),
            ("OTEL_SERVICE_NAME", "shop"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ];
        let settings = Settings::from_env(vars(&traces), "p-1", "shop")
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "http://tempo:4318/otlp/v1/traces");
        assert_eq!(
            (settings.service.as_str(), settings.delay),
            ("shop", Duration::from_millis(100))
        );
        assert_eq!(Settings::from_env(vars(&[]), "p", "a"), Ok(None));
        let disabled = [base[0], ("OTEL_SDK_DISABLED", "true")];
        assert_eq!(Settings::from_env(vars(&disabled), "p", "a"), Ok(None));
        for (bad, said) in [
            (
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
                "OTEL_EXPORTER_OTLP_ENDPOINT: expected an http:// URL",
            ),
            (
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://user:secret@collector:4318/v1/traces",
                ),
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: a URL naming a user",
            ),
            (
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                "http/protobuf only",
            ),
            (("OTEL_BSP_SCHEDULE_DELAY", "soon"), "expected milliseconds"),
        ] {
            // The bad value first: `vars` reads the first pair of a name.
            let pairs = [bad, ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
            let error = Settings::from_env(vars(&pairs), "p", "a").unwrap_err();
            assert!(error.to_string().contains(said), "{error}");
            assert!(!error.to_string().contains("secret"), "{error}");
        }
    }

    #[test]
    fn varints_and_fields_are_protobufs() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02], "the protobuf documentation's example");
        let kv = message(|out| key_value(out, "a", "b"));
        // key: field 1, length 1, "a"; value: field 2, length 3, AnyValue{1: "b"}.
        assert_eq!(kv, [0x0a, 1, b'a', 0x12, 3, 0x0a, 1, b'b']);
    }
}
