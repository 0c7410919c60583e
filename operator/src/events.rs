//! The Kubernetes events the operator publishes on a Composition (`kubectl describe`, `kubectl
//! events`): Normal ones for a halt's steps, Warning ones for what someone must act on — a spec
//! refused (`InvalidSpec`), an object of another manager in the way (`Conflict`), pods that fail
//! or that admission refuses (`PodsFailing`, `PodsRefused`), a halt called off
//! (`HaltCalledOff`). Reconciles see a lasting fault again and again: a Warning is published at
//! most once per reason per Composition per [`WARNING_EVERY`]; the status says the rest.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::events::{Event, EventType, Recorder};
use std::collections::HashMap;
use std::sync::Mutex;

/// How often one reason's Warning may be published on one Composition.
pub const WARNING_EVERY: SignedDuration = SignedDuration::from_secs(60);

/// Where events go, and when each Warning was last published.
#[derive(Default)]
pub struct Events {
    /// `None` in tests: nothing is published.
    recorder: Option<Recorder>,
    limiter: Limiter,
}

impl Events {
    pub fn new(recorder: Recorder) -> Self {
        Self {
            recorder: Some(recorder),
            limiter: Limiter::default(),
        }
    }

    /// A Normal event on `on`.
    pub async fn normal(&self, on: &ObjectReference, (reason, action): (&str, &str), note: String) {
        self.publish(on, EventType::Normal, (reason, action), note)
            .await;
    }

    /// A Warning event on `on`, unless one of `reason` was published on it within
    /// [`WARNING_EVERY`] of `now`.
    pub async fn warning(
        &self,
        on: &ObjectReference,
        (reason, action): (&str, &str),
        note: String,
        now: Timestamp,
    ) {
        let uid = on.uid.clone().unwrap_or_default();
        if self.limiter.due(&uid, reason, now) {
            self.publish(on, EventType::Warning, (reason, action), note)
                .await;
        }
    }

    /// Publishes; a failure is logged, never fatal.
    async fn publish(
        &self,
        on: &ObjectReference,
        type_: EventType,
        (reason, action): (&str, &str),
        note: String,
    ) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, on).await {
            tracing::warn!(%error, reason, "cannot publish an event");
        }
    }
}

/// When each (Composition uid, reason) was last let through.
#[derive(Default)]
pub struct Limiter {
    last: Mutex<HashMap<(String, String), Timestamp>>,
}

impl Limiter {
    /// Whether a Warning of `reason` on `uid` may go out at `now` (and, if so, it is counted).
    pub fn due(&self, uid: &str, reason: &str, now: Timestamp) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        // Entries older than the window say nothing any more: dropped, so deleted Compositions
        // leave nothing behind.
        last.retain(|_, at| now.duration_since(*at) < WARNING_EVERY);
        let key = (uid.to_owned(), reason.to_owned());
        if last.contains_key(&key) {
            return false;
        }
        last.insert(key, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_reason_and_composition_per_minute() {
        let limiter = Limiter::default();
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        assert!(limiter.due("a", "InvalidSpec", at(0)));
        assert!(
            !limiter.due("a", "InvalidSpec", at(59)),
            "again within the minute"
        );
        assert!(limiter.due("a", "Conflict", at(1)), "another reason");
        assert!(
            limiter.due("b", "InvalidSpec", at(2)),
            "another Composition"
        );
        assert!(limiter.due("a", "InvalidSpec", at(60)), "a minute later");
        assert!(!limiter.due("a", "InvalidSpec", at(61)));
    }
}
