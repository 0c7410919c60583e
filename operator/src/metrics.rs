//! The operator's metrics, served as OpenMetrics text on `/metrics` ([`crate::http`]):
//!
//! | metric | what |
//! |---|---|
//! | `toa_operator_reconciles_total` | reconciles started |
//! | `toa_operator_reconcile_errors_total{error}` | reconciles that failed, by [`crate::Error::metric_label`] |
//! | `toa_operator_reconcile_duration_seconds` | how long reconciles took (every exit path) |
//! | `toa_operator_leader` | 1 while this replica holds the lease |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

/// Cheap to clone: every field shares its value.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
    pub leader: Gauge,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        let reconciles = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        // 1 ms to about 16 s: a reconcile waits at most a few 2 s agent timeouts.
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let leader = Gauge::default();
        let mut registry = Registry::with_prefix("toa_operator");
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by kind of error",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took",
            duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the lease and reconciles",
            leader.clone(),
        );
        Self {
            reconciles,
            errors,
            duration,
            leader,
            registry: Arc::new(registry),
        }
    }
}

impl Metrics {
    /// Counts a reconcile and measures it until the returned guard drops.
    pub fn reconcile(&self) -> Measure {
        self.reconciles.inc();
        Measure {
            start: Instant::now(),
            histogram: self.duration.clone(),
        }
    }

    pub fn error(&self, label: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                error: label.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

/// Records the time since its creation when dropped, so every exit path of a reconcile counts.
pub struct Measure {
    start: Instant,
    histogram: Histogram,
}

impl Drop for Measure {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reconciles_errors_and_durations() {
        let metrics = Metrics::default();
        drop(metrics.reconcile());
        metrics.error("kube");
        metrics.error("kube");
        let text = metrics.encode();
        assert!(text.contains("toa_operator_reconciles_total 1"), "{text}");
        assert!(
            text.contains("toa_operator_reconcile_errors_total{error=\"kube\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("toa_operator_reconcile_duration_seconds_count 1"),
            "{text}"
        );
    }
}
