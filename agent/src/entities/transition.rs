//! A transition (DESIGN 17; seed 003, "Two Writers at Once"): the agent reads the object and its
//! version, the program decides on the entry as it is, and the agent stores what the program left
//! with one compare-and-set on the version it read. Nothing is locked across the program's run,
//! and no database transaction spans it.
//!
//! - A lost write under `concurrency: retry` (the default) reads again and runs again, after a
//!   jittered backoff, up to [`ATTEMPTS`] runs and never past the call's deadline: then
//!   `CONTENDED`. Under `none` the first lost write is `CONFLICT`.
//! - A caller that names the version it saw gets `PRECONDITION_FAILED` when the object is at
//!   another, before the program runs and again at the commit.
//! - `DISCARD` answers without writing; `DELETE` leaves a tombstone; what the program leaves is
//!   checked against the entity's schema before it is stored.
//! - [`Turns`]: one run at a time per object in a process, so a process's own calls never lose
//!   writes to each other; lost writes come only from other replicas.

use super::store::{Committed, Event, Found, Record, Recorded, State, Store, StoreError, Write};
use futures::future::BoxFuture;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Runs of one call at most, lost writes included. 16 callers of one object at once, each losing
/// to every other in turn, need 16.
pub const ATTEMPTS: u32 = 32;

/// The fields of an entry that are not properties: given to the program, never stored.
pub const ID: &str = "id";
pub const VERSION: &str = "VERSION";
pub const DISCARD: &str = "DISCARD";
pub const DELETE: &str = "DELETE";

pub use toa_context::manifest::Concurrency;

/// What a transition needs of the component's entity.
pub struct Entity<'a> {
    /// One object per id a caller names, `blank` until written: an id needs no creating.
    pub associated: bool,
    pub blank: &'a State,
    /// The entity's schema, applied to what the program leaves (the message names the property).
    pub check: &'a (dyn Fn(&State) -> Result<(), String> + Sync),
    /// Which events a stored write publishes (DESIGN 18), and who is handed them once it is
    /// stored, to publish.
    pub events: &'a dyn Publishes,
    pub stored: &'a (dyn Fn(Vec<Event>) + Sync),
}

/// Which of a component's events a write publishes.
pub trait Publishes: Sync {
    /// Whether the component declares any.
    fn any(&self) -> bool;

    /// The labels of those a write storing `entry` over `previous` (`None`: there was none)
    /// publishes; `entry` is the events' payload.
    fn labels<'a>(
        &'a self,
        entry: &'a Value,
        previous: Option<&'a Value>,
    ) -> BoxFuture<'a, Result<Vec<String>, TransitionError>>;
}

/// These labels, on every write.
impl Publishes for Vec<String> {
    fn any(&self) -> bool {
        !self.is_empty()
    }

    fn labels<'a>(
        &'a self,
        _: &'a Value,
        _: Option<&'a Value>,
    ) -> BoxFuture<'a, Result<Vec<String>, TransitionError>> {
        Box::pin(std::future::ready(Ok(self.clone())))
    }
}

/// One call of a transition.
pub struct Call<'a> {
    /// `query.id`; without one, a non-associated entity gets a new object.
    pub id: Option<&'a str>,
    /// `query.version` (or `If-Match`): the version the caller saw.
    pub version: Option<u64>,
    pub concurrency: Concurrency,
    pub deadline: Instant,
    /// The record that makes the call apply once (`once`, or the caller's key): stored with the
    /// write, and with an outcome that writes nothing.
    pub record: Option<&'a Record>,
}

/// What one run of the program answered.
pub enum Decision {
    /// The entry as the function left it, and what it returned: `None` for the entry itself.
    Left {
        entry: State,
        returned: Option<Value>,
    },
    /// The operation's own error (`OUT_OF_STOCK`): answered as it is, nothing written.
    Refused(Value),
}

/// How a transition ended for its caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Stored at `version` after `attempts` runs; `reply` is what the function returned (the
    /// stored entry, with `id` and its new `VERSION`, when it returned the entry).
    Stored {
        reply: Value,
        version: u64,
        attempts: u32,
    },
    /// `DISCARD`: nothing written; the object stays at `version`.
    Discarded { reply: Value, version: u64 },
    /// The operation's own error.
    Refused(Value),
    /// The call's record was there: another delivery of it (or another call with its key) was
    /// applied, and this is what it answered; nothing was run to the end or written.
    Repeated(Recorded),
}

impl Answer {
    /// The outcome as the caller gets it, and a record keeps it.
    pub fn outcome(&self) -> Value {
        match self {
            Self::Stored { reply, .. } | Self::Discarded { reply, .. } => json!({ "reply": reply }),
            Self::Refused(error) => json!({ "error": error }),
            Self::Repeated(recorded) => recorded.outcome.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransitionError {
    #[error("NOT_FOUND: there is no object {id}")]
    NotFound { id: String },
    #[error("PRECONDITION_FAILED: the object {id} is at version {current}, not {expected}")]
    PreconditionFailed {
        id: String,
        expected: u64,
        current: u64,
    },
    #[error("CONFLICT: the object {id} was written by another call meanwhile (concurrency: none); nothing was stored")]
    Conflict { id: String },
    #[error("CONTENDED: the object {id} was written by other calls meanwhile, {attempts} times; nothing was stored")]
    Contended { id: String, attempts: u32 },
    #[error("the entry left for {id} is not valid: {message}; nothing was stored")]
    Invalid { id: String, message: String },
    #[error(
        "what the transition returned for {id} holds the character U+0000 (at {at}), which no \
         store keeps as the call's record; nothing was stored"
    )]
    Unkept { id: String, at: String },
    #[error("a transition on an associated entity needs query.id")]
    NoId,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The program's run failed; the caller gets its failure.
    #[error("{0}")]
    Program(String),
}

/// Runs the transition `run` for `call`: see the module's documentation.
pub async fn transit<S, F, Fut>(
    store: &S,
    entity: &Entity<'_>,
    call: &Call<'_>,
    mut run: F,
) -> Result<Answer, TransitionError>
where
    S: Store,
    F: FnMut(State) -> Fut,
    Fut: Future<Output = Result<Decision, TransitionError>>,
{
    let (id, mut new) = match (call.id, entity.associated) {
        (Some(id), _) => (id.to_owned(), false),
        (None, false) => (crate::component::client::new_id(), true),
        (None, true) => return Err(TransitionError::NoId),
    };
    for attempt in 1..=ATTEMPTS {
        let found = read(store, &id, new).await?;
        // The caller's version first: a caller who saw an object since deleted learns that it
        // changed, whatever it became.
        expect(call, &id, found.version())?;
        let previous = entity.before(&found, &id);
        let (state, version) = current(found, entity, &id, new)?;
        let (left, returned) = match run(entry(&state, &id, version)).await? {
            Decision::Refused(error) => {
                return Ok(remember(store, call, Answer::Refused(error)).await)
            }
            Decision::Left { entry, returned } => (entry, returned),
        };
        let Some(write) = settle(left, entity, &id)? else {
            let reply = returned.unwrap_or_else(|| Value::Object(entry(&state, &id, version)));
            let discarded = Answer::Discarded { reply, version };
            return Ok(remember(store, call, discarded).await);
        };
        keepable(call, &id, returned.as_ref())?;
        let commit = Commit {
            id: &id,
            read: version,
            previous,
            write,
            returned,
            attempt,
        };
        match commit.made(store, call, entity).await? {
            Ok(answer) => return Ok(answer),
            Err(current) => {
                expect(call, &id, current)?;
                lost(call, &id, attempt).await?;
                new = false;
            }
        }
    }
    Err(TransitionError::Contended {
        id,
        attempts: ATTEMPTS,
    })
}

/// The object `id` as the store has it (`new`: one made by this call, never written).
async fn read<S: Store>(store: &S, id: &str, new: bool) -> Result<Found, StoreError> {
    if new {
        return Ok(Found::Missing);
    }
    store.read(id).await
}

impl Entity<'_> {
    /// The object as it was before a write, when events' conditions may ask (see
    /// [`as_before`]).
    fn before(&self, found: &Found, id: &str) -> Option<Value> {
        self.events
            .any()
            .then(|| as_before(found, id, self.blank))?
    }
}

/// A commit of what one run left.
struct Commit<'a> {
    id: &'a str,
    read: u64,
    /// The object as it was, when the component has events (their conditions' `previous`).
    previous: Option<Value>,
    write: Write,
    /// What the function returned (`None`: the entry).
    returned: Option<Value>,
    attempt: u32,
}

impl Commit<'_> {
    /// The answer once stored (or found applied by its record); `Err`: lost to another writer,
    /// the object now at that version.
    async fn made<S: Store>(
        self,
        store: &S,
        call: &Call<'_>,
        entity: &Entity<'_>,
    ) -> Result<Result<Answer, u64>, TransitionError> {
        let Commit {
            id,
            read,
            previous,
            write,
            returned,
            attempt,
        } = self;
        let nothing = State::new();
        let stored = match &write {
            Write::Put(state) => state,
            Write::Delete => &nothing,
        };
        // The reply is known before the commit (at the version after the one read), so that the
        // record stored with the write keeps it.
        let reply = returned.unwrap_or_else(|| Value::Object(entry(stored, id, read + 1)));
        let outcome = json!({ "reply": reply });
        let record = call.record.map(|record| (record, &outcome));
        let events = if entity.events.any() {
            let payload = Event::payload(id, read + 1, &write);
            let labels = entity.events.labels(&payload, previous.as_ref()).await?;
            Event::all(&labels, id, read + 1, payload)
        } else {
            Vec::new()
        };
        Ok(
            match store.commit(id, read, write, record, &events).await? {
                Committed::Stored { version } => {
                    if !events.is_empty() {
                        (entity.stored)(events);
                    }
                    Ok(Answer::Stored {
                        reply,
                        version,
                        attempts: attempt,
                    })
                }
                Committed::Repeated(recorded) => Ok(Answer::Repeated(recorded)),
                Committed::Lost { current } => Err(current),
            },
        )
    }
}

/// An answer that wrote nothing, kept as the call's record when it has one; a record there
/// already is what the call answers. A record that cannot be kept is not the call's failure
/// (nothing was written): a redelivery runs it again.
async fn remember<S: Store>(store: &S, call: &Call<'_>, answer: Answer) -> Answer {
    let Some(record) = call.record else {
        return answer;
    };
    match store.record(record, &answer.outcome()).await {
        Ok(None) => answer,
        Ok(Some(recorded)) => Answer::Repeated(recorded),
        Err(error) => {
            tracing::warn!(%error, operation = %record.operation, "the outcome of a call that wrote nothing was not recorded: a redelivery runs it again");
            answer
        }
    }
}

/// The object as it was before a write (`None`: there was none), as an event's payload has it,
/// with `blank`'s value for a property it lacks (one added to the schema since it was written),
/// as the program is given it.
pub fn as_before(found: &Found, id: &str, blank: &State) -> Option<Value> {
    let Found::Live { state, version } = found else {
        return None;
    };
    let mut before = entry(state, id, *version);
    for (key, value) in blank {
        before.entry(key).or_insert_with(|| value.clone());
    }
    Some(Value::Object(before))
}

/// The object as the program is given it, and its version. A missing property reads as
/// `blank`'s value (a property added to the schema since the object was written).
fn current(
    found: Found,
    entity: &Entity<'_>,
    id: &str,
    new: bool,
) -> Result<(State, u64), TransitionError> {
    match found {
        Found::Live { mut state, version } => {
            for (key, value) in entity.blank {
                state.entry(key).or_insert_with(|| value.clone());
            }
            Ok((state, version))
        }
        Found::Missing if new || entity.associated => Ok((entity.blank.clone(), 0)),
        // An associated object goes back to `blank`, at the tombstone's version.
        Found::Deleted { version } if entity.associated => Ok((entity.blank.clone(), version)),
        Found::Missing | Found::Deleted { .. } => {
            Err(TransitionError::NotFound { id: id.to_owned() })
        }
    }
}

/// A call with a record keeps what it answers with its write: what the function returned must
/// be something a store can keep.
fn keepable(call: &Call<'_>, id: &str, returned: Option<&Value>) -> Result<(), TransitionError> {
    let kept = returned.filter(|_| call.record.is_some());
    match kept.and_then(|reply| super::store::nul_at(reply, String::new())) {
        Some(at) => Err(TransitionError::Unkept {
            id: id.to_owned(),
            at,
        }),
        None => Ok(()),
    }
}

/// The caller's version, if it names one, is the object's.
fn expect(call: &Call<'_>, id: &str, current: u64) -> Result<(), TransitionError> {
    match call.version {
        Some(expected) if expected != current => Err(TransitionError::PreconditionFailed {
            id: id.to_owned(),
            expected,
            current,
        }),
        _ => Ok(()),
    }
}

/// The entry given to the program: the properties, its `id` and `VERSION`.
fn entry(state: &State, id: &str, version: u64) -> State {
    let mut entry = state.clone();
    entry.insert(ID.to_owned(), Value::from(id));
    entry.insert(VERSION.to_owned(), Value::from(version));
    entry
}

/// What the entry the program left writes: `None` for `DISCARD`; the properties (checked
/// against the schema), or a tombstone for `DELETE`.
fn settle(
    mut left: State,
    entity: &Entity<'_>,
    id: &str,
) -> Result<Option<Write>, TransitionError> {
    let flag = |left: &State, key: &str| left.get(key) == Some(&Value::Bool(true));
    let (discard, delete) = (flag(&left, DISCARD), flag(&left, DELETE));
    for key in [ID, VERSION, DISCARD, DELETE] {
        left.remove(key);
    }
    if discard {
        return Ok(None);
    }
    if delete {
        return Ok(Some(Write::Delete));
    }
    (entity.check)(&left).map_err(|message| TransitionError::Invalid {
        id: id.to_owned(),
        message,
    })?;
    Ok(Some(Write::Put(left)))
}

/// After a lost write: `CONFLICT` under `none`; `CONTENDED` when the pause would pass the
/// deadline; otherwise the pause.
async fn lost(call: &Call<'_>, id: &str, attempt: u32) -> Result<(), TransitionError> {
    if call.concurrency == Concurrency::None {
        return Err(TransitionError::Conflict { id: id.to_owned() });
    }
    // Another run needs time of its own too (a read, the program, a commit): it starts only
    // with the call's start margin left after the pause.
    let pause = backoff(attempt);
    if Instant::now() + pause + toa_context::program::START_MARGIN >= call.deadline {
        return Err(TransitionError::Contended {
            id: id.to_owned(),
            attempts: attempt,
        });
    }
    tokio::time::sleep(pause).await;
    Ok(())
}

/// Full jitter under a ceiling that doubles from 2 ms to 64 ms: runs that lost together do not
/// meet again.
pub fn backoff(attempt: u32) -> Duration {
    let ceiling_us = 1_000u64 << attempt.min(6);
    Duration::from_micros(rand::random_range(0..=ceiling_us))
}

/// One run at a time per object in this process.
#[derive(Default)]
pub struct Turns {
    held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// This process's turn on one object, until dropped.
pub struct Turn<'a> {
    turns: &'a Turns,
    id: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Turns {
    pub async fn take(&self, id: &str) -> Turn<'_> {
        let lock = self
            .held
            .lock()
            .expect("turns")
            .entry(id.to_owned())
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        Turn {
            turns: self,
            id: id.to_owned(),
            lock,
            guard: Some(guard),
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // The last one out forgets the object: the map holds only objects in use.
        let mut held = self.turns.held.lock().expect("turns");
        if Arc::strong_count(&self.lock) == 2 {
            held.remove(&self.id);
        }
    }
}
