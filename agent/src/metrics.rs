//! Prometheus metrics, in the text format, through `prometheus-client` (the maintained crate of
//! the Prometheus project). Names follow Prometheus conventions; the seed's names map as:
//!
//! | seed          | here                         | kind      |
//! |---------------|------------------------------|-----------|
//! | `lock.wait`   | `toa_lock_wait_seconds`      | histogram |
//! | locks held    | `toa_locks_held`             | gauge     |
//! | slots owned   | `toa_slots_assigned`, `toa_slots_replicas` (`i` of `n`, 0 of 0 while none) | gauges |
//! | meter calls   | `toa_meter_calls_total`      | counter   |
//! | (events)      | `toa_events_waiting_seconds`: how long the oldest event not yet published has waited (0: none) | gauge |
//! | (receivers)   | `toa_events_dead_lettered_total`: events a receiver gave up on (`toa-agent requeue` sends them again) | counter |
//! | (calls)       | `toa_calls_dead_lettered_total`: calls delivered `limits.deliveries` times without an answer, whose callers were told | counter |
//! | (operations)  | `toa_operations_total{operation, outcome}`: the program's runs of an operation, by outcome (`ok`, `error`: an error code it answered, `timeout`, `failed`) | counter |
//! | (operations)  | `toa_operation_duration_seconds{operation}`: how long each run took | histogram |
//!
//! Every series carries `group`, the component (`namespace.name`), and `application`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    pub application: String,
    pub group: String,
}

impl Labels {
    fn of(application: &str, component: &str) -> Self {
        Self {
            application: application.to_owned(),
            group: component.to_owned(),
        }
    }
}

type Waits = Family<Labels, Histogram, fn() -> Histogram>;

/// A component's operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub application: String,
    pub group: String,
    pub operation: String,
}

/// A component's operation and how a run of it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub application: String,
    pub group: String,
    pub operation: String,
    pub outcome: String,
}

type Durations = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// The operations' run counts and durations, registered.
fn register_operations(registry: &mut Registry) -> (Family<OutcomeLabels, Counter>, Durations) {
    let operations = Family::<OutcomeLabels, Counter>::default();
    let durations: Durations = Family::new_with_constructor(duration_histogram);
    registry.register(
        "operations",
        "The program's runs of an operation, by outcome: ok, error (one the operation declares), timeout, failed",
        operations.clone(),
    );
    registry.register_with_unit(
        "operation_duration",
        "How long the program's runs of an operation took",
        prometheus_client::registry::Unit::Seconds,
        durations.clone(),
    );
    (operations, durations)
}

/// Counts and times one component's operation runs.
#[derive(Clone)]
pub struct Operations {
    runs: Family<OutcomeLabels, Counter>,
    durations: Durations,
    labels: Labels,
    /// Each operation's series, found in the families once: a run then makes and hashes no
    /// labels (four strings and two lookups per call, before).
    series: Arc<RwLock<HashMap<String, Arc<Series>>>>,
}

/// One operation's series: its durations, and its runs by outcome (made at the first run that
/// ends so, as the families would).
struct Series {
    labels: OperationLabels,
    duration: Histogram,
    runs: RwLock<Vec<(&'static str, Counter)>>,
}

impl Operations {
    /// The component whose runs these are (`group`).
    pub fn component(&self) -> &str {
        &self.labels.group
    }

    /// A run of `operation` that ended as `outcome` after `took`.
    pub fn record(&self, operation: &str, outcome: &'static str, took: Duration) {
        let series = self.series_of(operation);
        series.duration.observe(took.as_secs_f64());
        let known = read(&series.runs)
            .iter()
            .find(|(ended, _)| *ended == outcome)
            .map(|(_, runs)| runs.clone());
        let runs = known.unwrap_or_else(|| {
            let labels = OutcomeLabels {
                application: series.labels.application.clone(),
                group: series.labels.group.clone(),
                operation: series.labels.operation.clone(),
                outcome: outcome.to_owned(),
            };
            let runs = self.runs.get_or_create(&labels).clone();
            write(&series.runs).push((outcome, runs.clone()));
            runs
        });
        runs.inc();
    }

    fn series_of(&self, operation: &str) -> Arc<Series> {
        if let Some(series) = read(&self.series).get(operation) {
            return series.clone();
        }
        let labels = OperationLabels {
            application: self.labels.application.clone(),
            group: self.labels.group.clone(),
            operation: operation.to_owned(),
        };
        let series = Arc::new(Series {
            duration: self.durations.get_or_create(&labels).clone(),
            labels,
            runs: RwLock::default(),
        });
        let mut all = write(&self.series);
        all.entry(operation.to_owned()).or_insert(series).clone()
    }
}

/// A lock's value, however a panic elsewhere left it (counts stay counts).
fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The metrics of one process.
pub struct Metrics {
    registry: Registry,
    lock_wait: Waits,
    locks_held: Family<Labels, Gauge>,
    slots_assigned: Family<Labels, Gauge>,
    slots_replicas: Family<Labels, Gauge>,
    meter_calls: Family<Labels, Counter>,
    calls_dead_lettered: Family<Labels, Counter>,
    events_waiting: Family<Labels, Waiting>,
    events_dead_lettered: Family<Labels, Counter>,
    operations: Family<OutcomeLabels, Counter>,
    operation_duration: Durations,
}

/// Seconds, as a float gauge.
pub type Waiting = Gauge<f64, std::sync::atomic::AtomicU64>;

fn wait_histogram() -> Histogram {
    // 100 µs to about 30 minutes.
    Histogram::new(exponential_buckets(0.0001, 3.0, 16))
}

fn duration_histogram() -> Histogram {
    // 1 ms to about a minute (the default operation limit).
    Histogram::new(exponential_buckets(0.001, 2.5, 13))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("toa");
        let lock_wait: Waits = Family::new_with_constructor(wait_histogram);
        let locks_held = Family::<Labels, Gauge>::default();
        let slots_assigned = Family::<Labels, Gauge>::default();
        let slots_replicas = Family::<Labels, Gauge>::default();
        let meter_calls = Family::<Labels, Counter>::default();
        let calls_dead_lettered = Family::<Labels, Counter>::default();
        let events_waiting = Family::<Labels, Waiting>::default();
        let events_dead_lettered = Family::<Labels, Counter>::default();
        let (operations, operation_duration) = register_operations(&mut registry);
        registry.register(
            "events_dead_lettered",
            "Events a receiving component gave up on (dead-lettered: never handled, or not within limits.deliveries)",
            events_dead_lettered.clone(),
        );
        registry.register_with_unit(
            "events_waiting",
            "How long the oldest event of a component's outbox not yet published has waited (0: none)",
            prometheus_client::registry::Unit::Seconds,
            events_waiting.clone(),
        );
        registry.register(
            "calls_dead_lettered",
            "Calls delivered limits.deliveries times without an answer, whose callers were told",
            calls_dead_lettered.clone(),
        );
        registry.register_with_unit(
            "lock_wait",
            "Time spent waiting for a lock (seed: lock.wait)",
            prometheus_client::registry::Unit::Seconds,
            lock_wait.clone(),
        );
        registry.register("locks_held", "Locks held now", locks_held.clone());
        registry.register(
            "slots_assigned",
            "This replica's number i in its assignment {i, n}",
            slots_assigned.clone(),
        );
        registry.register(
            "slots_replicas",
            "n in this replica's assignment {i, n}; 0 while it owns nothing",
            slots_replicas.clone(),
        );
        registry.register("meter_calls", "Calls of meter", meter_calls.clone());
        Arc::new(Self {
            registry,
            lock_wait,
            locks_held,
            slots_assigned,
            slots_replicas,
            meter_calls,
            calls_dead_lettered,
            events_waiting,
            events_dead_lettered,
            operations,
            operation_duration,
        })
    }

    /// The runs of one component's operations.
    pub fn operations(&self, application: &str, component: &str) -> Operations {
        Operations {
            runs: self.operations.clone(),
            durations: self.operation_duration.clone(),
            labels: Labels::of(application, component),
            series: Arc::default(),
        }
    }

    /// How long one component's oldest unpublished event has waited.
    pub fn events_waiting(&self, application: &str, component: &str) -> Waiting {
        self.events_waiting
            .get_or_create(&Labels::of(application, component))
            .clone()
    }

    /// The count of the events one receiving component dead-lettered.
    pub fn events_dead_lettered(&self, application: &str, component: &str) -> Counter {
        self.events_dead_lettered
            .get_or_create(&Labels::of(application, component))
            .clone()
    }

    /// The count of one component's dead-lettered calls.
    pub fn dead_lettered(&self, application: &str, component: &str) -> Counter {
        self.calls_dead_lettered
            .get_or_create(&Labels::of(application, component))
            .clone()
    }

    /// The handles for one component of an application.
    pub fn component(&self, application: &str, component: &str) -> ComponentMetrics {
        let labels = Labels::of(application, component);
        ComponentMetrics {
            lock_wait: self.lock_wait.get_or_create(&labels).clone(),
            locks_held: self.locks_held.get_or_create(&labels).clone(),
            slots_assigned: self.slots_assigned.get_or_create(&labels).clone(),
            slots_replicas: self.slots_replicas.get_or_create(&labels).clone(),
            meter_calls: self.meter_calls.get_or_create(&labels).clone(),
        }
    }

    /// Everything, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// The metrics of one component: handles looked up once, so a call costs an atomic operation.
#[derive(Clone)]
pub struct ComponentMetrics {
    lock_wait: Histogram,
    locks_held: Gauge,
    slots_assigned: Gauge,
    slots_replicas: Gauge,
    meter_calls: Counter,
}

impl ComponentMetrics {
    pub fn lock_waited(&self, wait: Duration) {
        self.lock_wait.observe(wait.as_secs_f64());
    }

    pub fn lock_held(&self, delta: i64) {
        self.locks_held.inc_by(delta);
    }

    /// This replica's share `(i, n)` of the slots, or `None` while it owns nothing.
    pub fn slots_owned(&self, share: Option<(u32, u32)>) {
        let (i, n) = share.unwrap_or((0, 0));
        self.slots_assigned.set(i64::from(i));
        self.slots_replicas.set(i64::from(n));
    }

    pub fn meter_called(&self) {
        self.meter_calls.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_each_metric_with_the_component() {
        let metrics = Metrics::new();
        let orders = metrics.component("shop", "store.orders");
        orders.lock_waited(Duration::from_millis(3));
        orders.lock_held(1);
        orders.meter_called();
        orders.slots_owned(Some((1, 3)));
        let text = metrics.encode();
        for line in [
            "toa_lock_wait_seconds_count{application=\"shop\",group=\"store.orders\"} 1",
            "toa_locks_held{application=\"shop\",group=\"store.orders\"} 1",
            "toa_meter_calls_total{application=\"shop\",group=\"store.orders\"} 1",
            "toa_slots_assigned{application=\"shop\",group=\"store.orders\"} 1",
            "toa_slots_replicas{application=\"shop\",group=\"store.orders\"} 3",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn each_operations_runs_are_counted_by_outcome_and_timed_apart() {
        let metrics = Metrics::new();
        let orders = metrics.operations("shop", "store.orders");
        let (took, again) = (Duration::from_millis(2), orders.clone());
        for outcome in ["ok", "error", "ok", "failed"] {
            orders.record("approve", outcome, took);
        }
        again.record("observe", "ok", took);
        again.record("approve", "error", took);
        let text = metrics.encode();
        let labels = "application=\"shop\",group=\"store.orders\"";
        for line in [
            format!("toa_operations_total{{{labels},operation=\"approve\",outcome=\"ok\"}} 2"),
            format!("toa_operations_total{{{labels},operation=\"approve\",outcome=\"error\"}} 2"),
            format!("toa_operations_total{{{labels},operation=\"approve\",outcome=\"failed\"}} 1"),
            format!("toa_operations_total{{{labels},operation=\"observe\",outcome=\"ok\"}} 1"),
            format!("toa_operation_duration_seconds_count{{{labels},operation=\"approve\"}} 5"),
            format!("toa_operation_duration_seconds_count{{{labels},operation=\"observe\"}} 1"),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert!(
            !text.contains("operation=\"observe\",outcome=\"error\""),
            "{text}"
        );
    }
}
