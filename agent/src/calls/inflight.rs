//! The calls this process's programs have in flight through it, per callee component, at most
//! `limits.inflight` at once. A program that loops on calls (or an SDK retrying without end) no
//! longer grows the agent's memory with every call it keeps waiting: one past the limit waits for
//! a slot, within its own deadline (its timeout, or `limits.operation` for a call without one),
//! and is answered as any call that ran out of time when none comes free.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots of every component called so far (components are the catalog's, a bounded set).
pub struct Inflight {
    limit: usize,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// None of `limit` slots came free within the call's time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{limit} calls to {component} are already in flight from this process (limits.inflight), and \
     none ended within {waited_ms} ms"
)]
pub struct Full {
    pub component: String,
    pub limit: usize,
    pub waited_ms: u128,
}

impl Inflight {
    pub fn new(limit: u32) -> Self {
        Self {
            limit: limit.max(1) as usize,
            slots: Mutex::default(),
        }
    }

    /// A slot for one call to `component`, held until dropped, waiting up to `within`.
    pub async fn enter(
        &self,
        component: &str,
        within: Duration,
    ) -> Result<OwnedSemaphorePermit, Full> {
        let slots = {
            let mut all = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            let slots = all
                .entry(component.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.limit)));
            slots.clone()
        };
        match tokio::time::timeout(within, slots.acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => Err(Full {
                component: component.to_owned(),
                limit: self.limit,
                waited_ms: within.as_millis(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_past_the_limit_waits_for_a_slot_within_its_time() {
        let inflight = Arc::new(Inflight::new(2));
        let long = Duration::from_secs(10);
        let first = inflight.enter("shop.mail", long).await.unwrap();
        let _second = inflight.enter("shop.mail", long).await.unwrap();
        // Another component has slots of its own.
        let _other = inflight.enter("shop.orders", long).await.unwrap();
        let waiting = tokio::spawn({
            let inflight = inflight.clone();
            async move { inflight.enter("shop.mail", long).await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a third call waits");
        drop(first);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_call_that_finds_no_slot_in_its_time_is_told_why() {
        let inflight = Inflight::new(1);
        let _held = inflight
            .enter("shop.mail", Duration::from_secs(1))
            .await
            .unwrap();
        let full = inflight
            .enter("shop.mail", Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(
            full.to_string(),
            "1 calls to shop.mail are already in flight from this process (limits.inflight), and \
             none ended within 20 ms"
        );
    }
}
