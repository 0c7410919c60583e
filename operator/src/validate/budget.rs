//! The spec check run off the controller's runtime, a few at a time, within a time budget.
//!
//! A check compiles and evaluates JSON Schemas users wrote. [`toa_context::schema`] bounds each
//! schema (64 KiB, 32 levels, compiled patterns of 1 MiB, backtracking cut off), but within those
//! bounds a schema and a configuration can still cost seconds (`uniqueItems` over a long array, a
//! pattern on every key of a large object). Inline, that stalled every reconcile behind it; here it
//! runs on the blocking pool, at most [`Budget::checks`] at once, and a check that outlives
//! [`Budget::time`] refuses its Composition naming the field it was at. The thread cannot be
//! stopped: it finishes in the background, its slot held until then, so runaway checks never
//! take more than their slots.

use super::{validate_noting, InvalidSpec, Progress, Valid};
use crate::crd::CompositionSpec;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// How long one check may take.
pub const TIME: Duration = Duration::from_secs(1);
/// How many checks run at once: the operator's two cores' worth.
pub const CHECKS: usize = 2;

/// The pool's slots and the time each check gets.
#[derive(Debug, Clone)]
pub struct Budget {
    slots: Arc<Semaphore>,
    checks: usize,
    time: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(CHECKS, TIME)
    }
}

/// No slot came free within the budget: every one is held by a check still running. Not the
/// spec's fault; the reconcile is tried again later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("every spec check slot ({0}) is busy with a check past its budget; tried again later")]
pub struct Busy(usize);

impl Budget {
    pub fn new(checks: usize, time: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(checks)),
            checks,
            time,
        }
    }

    /// [`super::validate`] on the blocking pool: its answer, or `InvalidSpec` naming the field it
    /// was at when the budget ran out.
    pub async fn check(&self, spec: &CompositionSpec) -> Result<Result<Valid, InvalidSpec>, Busy> {
        let waiting = tokio::time::timeout(self.time, self.slots.clone().acquire_owned());
        let Ok(Ok(slot)) = waiting.await else {
            return Err(Busy(self.checks));
        };
        let progress = Arc::new(Progress::default());
        let (spec, noting) = (spec.clone(), progress.clone());
        let check = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            validate_noting(&spec, &noting)
        });
        Ok(match tokio::time::timeout(self.time, check).await {
            Ok(Ok(checked)) => checked,
            Ok(Err(failed)) => Err(InvalidSpec(format!(
                "the check of the spec failed: {failed}"
            ))),
            Err(_) => Err(InvalidSpec(format!(
                "`{}`: checking it took longer than {} ms (its schemas and their patterns are \
                 compiled and evaluated within that budget); make its schemas cheaper",
                progress.last_or("spec"),
                self.time.as_millis()
            ))),
        })
    }
}

#[cfg(test)]
mod tests;
