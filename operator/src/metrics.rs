//! The operator's metrics, served as OpenMetrics text on `/metrics` ([`crate::http`]):
//!
//! | metric | what |
//! |---|---|
//! | `toa_operator_reconciles_total` | reconciles started |
//! | `toa_operator_reconcile_errors_total{error}` | reconciles that failed, by [`crate::Error::metric_label`] |
//! | `toa_operator_reconcile_duration_seconds` | how long reconciles took (every exit path) |
//! | `toa_operator_leader` | 1 while this replica holds the lease |
//! | `toa_operator_composition_condition{namespace, composition, type, status, reason}` | 1 for each condition every watched Composition's status holds; the leader's only |
//!
//! The condition series are read from the controllers' caches at each scrape, so they are the
//! API server's status as last seen and a deleted Composition's series go with it. Only the
//! leader exports them: a replica waiting for the lease sees the same objects, and two replicas'
//! series would count every Composition twice in a `sum`.

use crate::crd::Stored;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
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
    conditions: Arc<Conditions>,
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
        let conditions = Arc::new(Conditions {
            stores: Mutex::default(),
            leader: leader.clone(),
        });
        registry.register_collector(Box::new(conditions.clone()));
        Self {
            reconciles,
            errors,
            duration,
            leader,
            conditions,
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

    /// Exports the conditions of the Compositions in `store` (a controller's cache).
    pub fn watch(&self, store: Store<Stored>) {
        self.conditions
            .stores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store);
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

/// `toa_operator_composition_condition`, from the controllers' caches at each scrape.
struct Conditions {
    stores: Mutex<Vec<Store<Stored>>>,
    leader: Gauge,
}

impl std::fmt::Debug for Conditions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conditions").finish_non_exhaustive()
    }
}

impl Collector for Conditions {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.leader.get() != 1 {
            return Ok(());
        }
        let stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        let one = ConstGauge::new(1i64);
        let mut metric = encoder.encode_descriptor(
            "composition_condition",
            "1 for each condition a Composition's status holds, by type, status and reason",
            None,
            one.metric_type(),
        )?;
        for stored in stores.iter().flat_map(Store::state) {
            let Some(status) = stored.status() else {
                continue;
            };
            let namespace = stored.namespace().unwrap_or_default();
            for condition in &status.conditions {
                let labels = [
                    ("namespace", namespace.as_str()),
                    ("composition", stored.name_any().as_str()),
                    ("type", condition.type_.as_str()),
                    ("status", condition.status.as_str()),
                    ("reason", condition.reason.as_str()),
                ]
                .map(|(key, value)| (key, value.to_owned()));
                one.encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
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

    fn stored(name: &str, conditions: serde_json::Value) -> Stored {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "toa.io/v1alpha1",
            "kind": "Composition",
            "metadata": { "name": name, "namespace": "shop", "uid": name },
            "spec": { "image": "shop:1", "components": [{ "name": "orders" }] },
            "status": { "conditions": conditions },
        }))
        .unwrap()
    }

    #[test]
    fn the_leader_exports_each_watched_compositions_conditions() {
        use kube::runtime::{reflector, watcher::Event};
        let metrics = Metrics::default();
        let (store, mut writer) = reflector::store();
        metrics.watch(store);
        let condition = |type_: &str, status: &str, reason: &str| {
            serde_json::json!({ "type": type_, "status": status, "reason": reason, "message": "",
                "lastTransitionTime": "2026-12-03T10:00:00Z" })
        };
        let orders = stored(
            "orders",
            serde_json::json!([
                condition("Ready", "False", "RollingOut"),
                condition("Halted", "False", "HaltCalledOff"),
            ]),
        );
        writer.apply_watcher_event(&Event::Apply(orders.clone()));
        writer.apply_watcher_event(&Event::Apply(stored(
            "mail",
            serde_json::json!([condition("Ready", "True", "RolledOut")]),
        )));
        let series = |text: &str| {
            text.lines()
                .filter(|line| line.starts_with("toa_operator_composition_condition{"))
                .count()
        };
        // A replica waiting for the lease exports none.
        assert_eq!(series(&metrics.encode()), 0);
        metrics.leader.set(1);
        let text = metrics.encode();
        assert_eq!(series(&text), 3, "{text}");
        assert!(
            text.contains(
                "toa_operator_composition_condition{namespace=\"shop\",composition=\"orders\",\
                 type=\"Halted\",status=\"False\",reason=\"HaltCalledOff\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("composition=\"mail\",type=\"Ready\",status=\"True\""),
            "{text}"
        );
        // A deleted Composition's series go with it.
        writer.apply_watcher_event(&Event::Delete(orders));
        assert_eq!(series(&metrics.encode()), 1);
    }
}
