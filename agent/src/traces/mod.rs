//! The spans of the calls this agent carries, in the caller's trace (W3C Trace Context, read and
//! written by [`toa_context::trace`]), exported over OTLP/HTTP ([`otlp`]) when an endpoint is
//! configured (`OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! One call from a program through two agents is four spans in one trace:
//!
//! | span | where | kind |
//! |---|---|---|
//! | `call <component>.<operation>` | the caller's agent, from the program's request to its answer | server |
//! | `receive <component>` | the callee's agent, from the delivery to the reply | consumer |
//! | `operate <component>.<operation>` | the callee's agent, the program's run | client |
//! | (the program's own) | the callee's program, from the request's `traceparent` | |
//! | `lock <component>` | the agent, a lock's wait, from a program's request in its trace | server |
//!
//! A call run in the caller's own process (no broker) has no `receive`; one handed through the
//! local group has `hand` (client) in the caller's process and `run` (server) in the one that
//! runs it, in place of `receive`. The context travels in a
//! task-local ([`within`], [`current`]): the publish ([`crate::calls`]) and the request to the
//! program ([`crate::component`]) read it where they write their headers, so nothing between
//! passes it by hand. Without an endpoint nothing is recorded, and a call passes its caller's
//! context on unchanged, so programs still see one trace.

mod otlp;

pub use otlp::{Settings, SettingsError};

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use toa_context::trace::{TraceContext, TraceParent, SAMPLED};

static EXPORTER: OnceLock<otlp::Exporter> = OnceLock::new();

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

/// Exports the spans this process records from now on, as `settings` say (the first call wins).
/// Needs a tokio runtime: the exporter is a task of it.
pub fn start(settings: Settings) {
    let _ = EXPORTER.set(otlp::Exporter::start(settings));
}

/// The trace the running task's call is in.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// Runs `future` with `context` as its [`current`] trace. Not an `async fn`: one would hold
/// `future` twice (the argument, then the scope it moves into), and the calls' futures are
/// tens of KB, each byte copied on every move (docs/benchmarks.md, "Where a call's cost goes").
pub fn within<F: Future>(
    context: Option<TraceContext>,
    future: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(context, future)
}

/// What a span is to its trace (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Server = 2,
    Client = 3,
    Consumer = 5,
}

/// A span, recorded when it drops (when exporting, and its trace is sampled); its
/// [`context`](Span::context) is what the work it covers passes on.
pub struct Span {
    recorded: Option<Box<otlp::SpanData>>,
    started: Instant,
    context: Option<TraceContext>,
}

impl Span {
    /// Starts a span named `name()` (not even formatted when nothing is recorded) under
    /// `parent`, or as the root of a new trace.
    pub fn start(name: impl FnOnce() -> String, kind: Kind, parent: Option<TraceContext>) -> Self {
        let started = Instant::now();
        let exporting = EXPORTER.get().is_some();
        if !exporting || parent.as_ref().is_some_and(|p| !p.parent.sampled()) {
            return Self {
                recorded: None,
                started,
                context: parent,
            };
        }
        let trace_id = parent
            .as_ref()
            .map_or_else(nonzero::<16>, |p| p.parent.trace_id);
        let span_id = nonzero::<8>();
        let state = parent.as_ref().and_then(|p| p.state.clone());
        let data = otlp::SpanData {
            trace_id,
            span_id,
            parent_id: parent.as_ref().map(|p| p.parent.parent_id),
            state: state.clone(),
            name: name(),
            kind,
            start_ns: now_ns(),
            end_ns: 0,
            attributes: Vec::new(),
            error: None,
        };
        let parent = TraceParent {
            trace_id,
            parent_id: span_id,
            flags: SAMPLED,
        };
        Self {
            recorded: Some(Box::new(data)),
            started,
            context: Some(TraceContext { parent, state }),
        }
    }

    /// The context the covered work passes on: this span's, or the parent's when not recorded.
    pub fn context(&self) -> Option<TraceContext> {
        self.context.clone()
    }

    /// An attribute, when recorded (`value()` is not called otherwise).
    pub fn attribute(&mut self, key: &'static str, value: impl FnOnce() -> String) {
        if let Some(data) = &mut self.recorded {
            data.attributes.push((key, value()));
        }
    }

    /// Marks the span failed (OTLP status `ERROR`), saying why.
    pub fn fail(&mut self, message: impl FnOnce() -> String) {
        if let Some(data) = &mut self.recorded {
            data.error = Some(message());
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let (Some(mut data), Some(exporter)) = (self.recorded.take(), EXPORTER.get()) else {
            return;
        };
        // The wall clock at the start, the monotonic one for the length.
        data.end_ns = data.start_ns + self.started.elapsed().as_nanos() as u64;
        exporter.send(*data);
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// Random bytes, not all zero (an all-zero id is invalid).
fn nonzero<const N: usize>() -> [u8; N] {
    loop {
        let bytes: [u8; N] = rand::random();
        if bytes.iter().any(|b| *b != 0) {
            return bytes;
        }
    }
}
