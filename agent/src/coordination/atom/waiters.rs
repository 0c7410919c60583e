//! Wakes lock waiters when a key is released, through a subscription to the release channel on
//! every server (one server frozen or down still leaves the others to tell). A waiter takes a
//! [`Wake`] before it tries, so a release between its attempt and its wait is not missed.

use crate::coordination::redis::Servers;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(super) struct Waiters {
    /// Full key → generation, bumped on every release message for the key.
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What a waiter waits on: a release of any of its keys after it was taken.
pub(super) struct Wake {
    receivers: Vec<watch::Receiver<u64>>,
}

impl Waiters {
    pub fn start(servers: Arc<Servers>, channel: String) -> Arc<Self> {
        let waiters = Arc::new(Self {
            keys: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        });
        let tasks = (0..servers.list.len())
            .map(|index| {
                tokio::spawn(subscribe(
                    servers.clone(),
                    index,
                    channel.clone(),
                    Arc::downgrade(&waiters),
                ))
            })
            .collect();
        *waiters.tasks.lock().expect("waiter tasks") = tasks;
        waiters
    }

    pub fn listen(&self, keys: &[String]) -> Wake {
        let mut map = self.keys.lock().expect("waiters");
        if map.len() > 256 {
            map.retain(|_, sender| sender.receiver_count() > 0);
        }
        let receivers = keys
            .iter()
            .map(|key| {
                map.entry(key.clone())
                    .or_insert_with(|| watch::channel(0).0)
                    .subscribe()
            })
            .collect();
        Wake { receivers }
    }

    fn released(&self, key: &[u8]) {
        let map = self.keys.lock().expect("waiters");
        if let Some(sender) = std::str::from_utf8(key).ok().and_then(|key| map.get(key)) {
            sender.send_modify(|generation| *generation += 1);
        }
    }

    fn released_all(&self) {
        for sender in self.keys.lock().expect("waiters").values() {
            sender.send_modify(|generation| *generation += 1);
        }
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().expect("waiter tasks").drain(..) {
            task.abort();
        }
    }
}

impl Wake {
    /// Completes when one of the keys was released since this was taken.
    pub async fn wait(mut self) {
        let changes = self
            .receivers
            .iter_mut()
            .map(|receiver| Box::pin(receiver.changed()));
        let _ = futures::future::select_all(changes).await;
    }
}

async fn subscribe(servers: Arc<Servers>, index: usize, channel: String, waiters: Weak<Waiters>) {
    let server = &servers.list[index];
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok(mut pubsub) = server.pubsub().await {
            let subscribed =
                tokio::time::timeout(server.timeout(), pubsub.subscribe(&channel)).await;
            if let Ok(Ok(())) = subscribed {
                backoff = Duration::from_millis(100);
                // Releases published while this subscription was down would be lost: wake everyone.
                match waiters.upgrade() {
                    Some(waiters) => waiters.released_all(),
                    None => return,
                }
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    match waiters.upgrade() {
                        Some(waiters) => waiters.released(message.get_payload_bytes()),
                        None => return,
                    }
                }
                tracing::debug!(server = %server.address(), "lock: release subscription ended; resubscribing");
            }
        }
        if waiters.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
