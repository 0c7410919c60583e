//! Which of a component's events a stored write publishes (DESIGN 18): every declared event on
//! every stored change, except those whose condition the program keeps (`events/<name>`
//! exporting `condition(entry, previous)`), which publish when it holds. The agent asks the
//! program once per write, before its commit, with the object as the write stores it and as it
//! was; the answer decides the outbox rows written with it, so that an event exists exactly when
//! its write was stored and its condition held for what was stored.

use super::transition::{Publishes, TransitionError};
use crate::component::client::{ProgramClient, ProgramError};
use crate::component::{Component, ComponentError};
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::Mutex;
use toa_context::program::Description;
use tokio::time::Instant;

/// A component's events and which of them have a condition.
pub struct Publishing {
    events: Vec<Declared>,
    /// The names of the events with a condition: what the program is asked about.
    conditional: Vec<String>,
}

struct Declared {
    name: String,
    label: String,
    conditional: bool,
}

impl Publishing {
    /// The events `component` declares, with the conditions its program says it keeps (`None`:
    /// none; checked against the manifest by [`Component::conditioned`]).
    pub fn new(
        component: &Component,
        description: Option<&Description>,
    ) -> Result<Self, ComponentError> {
        component.conditioned(description)?;
        let manifest = &component.manifest;
        let conditional = description.map_or(Vec::new(), |d| d.conditions.clone());
        let events = manifest
            .events
            .keys()
            .map(|name| Declared {
                label: manifest.event_label(name),
                conditional: conditional.contains(name),
                name: name.clone(),
            })
            .collect();
        Ok(Self {
            events,
            conditional,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The labels a write storing `entry` over `previous` publishes: the program is asked about
    /// those with a condition, by the call's `deadline`.
    pub async fn decide(
        &self,
        client: &ProgramClient,
        deadline: Instant,
        entry: &Value,
        previous: Option<&Value>,
    ) -> Result<Vec<String>, ProgramError> {
        let holding = if self.conditional.is_empty() {
            Vec::new()
        } else {
            let left = deadline.saturating_duration_since(Instant::now());
            let asked = &self.conditional;
            client.conditions(entry, previous, asked, left).await?
        };
        Ok(self
            .events
            .iter()
            .filter(|e| !e.conditional || holding.contains(&e.name))
            .map(|e| e.label.clone())
            .collect())
    }

    /// The events of one transition's writes, whose program is asked by the call's `deadline`;
    /// a failure to answer is kept in `failed` (the call's failure: nothing is stored).
    pub fn of_call<'a>(
        &'a self,
        client: &'a ProgramClient,
        deadline: Instant,
        failed: &'a Mutex<Option<ProgramError>>,
    ) -> Conditioned<'a> {
        Conditioned {
            publishing: self,
            client,
            deadline,
            failed,
        }
    }
}

/// A component's events as one call's writes publish them.
pub struct Conditioned<'a> {
    publishing: &'a Publishing,
    client: &'a ProgramClient,
    deadline: Instant,
    failed: &'a Mutex<Option<ProgramError>>,
}

impl Publishes for Conditioned<'_> {
    fn any(&self) -> bool {
        !self.publishing.is_empty()
    }

    fn labels<'a>(
        &'a self,
        entry: &'a Value,
        previous: Option<&'a Value>,
    ) -> BoxFuture<'a, Result<Vec<String>, TransitionError>> {
        Box::pin(async move {
            let Conditioned {
                publishing,
                client,
                deadline,
                failed,
            } = self;
            let decided = publishing.decide(client, *deadline, entry, previous).await;
            decided.map_err(|failure| {
                let message = failure.to_string();
                *failed.lock().expect("failed") = Some(failure);
                TransitionError::Program(message)
            })
        })
    }
}
