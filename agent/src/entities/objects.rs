//! A component's objects as its calls reach them (DESIGN 17): which operation is which kind,
//! which the agent serves itself (the inherited `observe`, `enumerate`, `transit`, `assign`,
//! `delete`), and each kind's run against the store.
//!
//! - an **observation** reads the object (`null` for a missing one of a non-associated entity;
//!   `blank` at its version for an associated one) and gives it to the program as `entry`;
//! - an **assignment** writes the given properties (the inherited `assign`: its input; one with a
//!   module: what the function returns) over the object, creating it when missing, and never
//!   answers `CONFLICT`: a write lost to another replica is made again on what that one stored
//!   (without running the function again), up to [`transition::ATTEMPTS`] times within the
//!   deadline, then `CONTENDED`. It reads before its compare-and-set, as a transition does, so
//!   that the caller's version, records, events' `previous` and the schema over the whole
//!   object hold for it too;
//! - a **transition** runs [`super::transition::transit`] with the program's function (or the
//!   inherited `transit`, which sets the input's properties, and `delete`);
//! - effects and computations take no query and no object.
//!
//! Every outcome of the store reaches the caller as an operation's error with the runtime's code
//! (`NOT_FOUND`, `PRECONDITION_FAILED`, `CONFLICT`, `CONTENDED`, `UNAVAILABLE`), which the local
//! API answers with 404, 412, 409, 409 and 503.

use super::backend::Backend;
use super::conditions::Publishing;
use super::outbox::Outbox;
use super::retrying::Retrying;
use super::store::{Committed, Event, Found, Receipt, Record, Recorded, State, Store, Write};
use super::transition::{self, Answer, Call, Decision, Entity, TransitionError, Turns};
use crate::component::client::{CallMeta, Outcome, ProgramClient, ProgramError};
use crate::component::{Component, ComponentError};
use crate::metrics::Operations;
use crate::traces::{self, Span};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use toa_context::manifest::{self, Concurrency, Kind};
use toa_context::query::Query;
use tokio::time::Instant;

/// How long after a call's deadline a call on the store is ended: the program's own runs end at
/// the deadline, and their failure is the one to tell when it was theirs.
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(250);

/// One component's objects and how its operations reach them.
pub struct Objects {
    component: String,
    associated: bool,
    blank: State,
    schema: jsonschema::Validator,
    /// Each operation's kind: the program's word, else the manifest's.
    kinds: BTreeMap<String, Kind>,
    concurrency: BTreeMap<String, Concurrency>,
    /// The inherited operations the program has no module for: the agent serves them.
    inherited: BTreeSet<String>,
    /// The operations declaring `once`.
    once: BTreeSet<String>,
    store: Arc<Backend>,
    /// The events a stored write publishes, and their outbox (`None`: none).
    publishing: Publishing,
    outbox: Option<Arc<Outbox>>,
    turns: Turns,
    /// This process's calls running as transitions under `retry` (shared by its components).
    retrying: Arc<Retrying>,
}

/// One call of an operation of a component.
pub struct Run<'a> {
    pub client: &'a ProgramClient,
    pub operation: &'a str,
    pub input: &'a Value,
    pub query: Option<&'a Query>,
    pub meta: &'a CallMeta,
    /// When the call ends: every wait (a turn on the object, the program's runs) ends by then.
    pub deadline: Instant,
    /// The caller's idempotency key, when the operation writes to the store (see
    /// [`Objects::records`]); the others' keys are Redis's (`crate::calls::once`).
    pub key: Option<&'a str>,
    /// A received event's run: `key` names the event (its inbox record) or, for a `latest`
    /// receiver, its object (a watermark at its version), instead of a caller's key.
    pub receipt: Option<Receipt>,
}

impl Run<'_> {
    /// The program's run of the call, with what is left until the deadline (`entry`: the object
    /// of an observation).
    async fn plain(&self, entry: Option<&Value>) -> Result<Outcome, ProgramError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let Run {
            client,
            operation,
            input,
            meta,
            ..
        } = self;
        client.operate(operation, input, entry, meta, left).await
    }
}

/// Runs one call: through the component's objects when it has an entity, else straight to the
/// program; counted and timed in `operations`.
pub async fn operate(
    objects: Option<&Objects>,
    run: Run<'_>,
    operations: &Operations,
) -> Result<Outcome, ProgramError> {
    let (started, operation) = (Instant::now(), run.operation);
    let mut span = Span::start(
        || format!("operate {}.{operation}", operations.component()),
        traces::Kind::Client,
        traces::current(),
    );
    let result = traces::within(span.context(), async {
        match objects {
            // Boxed: the store's path is a few KB of future, which a plain call would carry
            // (and copy) for nothing; a call on an object pays one allocation beside its I/O.
            Some(objects) => Box::pin(objects.operate(run)).await,
            None => run.plain(None).await,
        }
    })
    .await;
    // A declared error is an answer, as `toa_operations_total` and the alerts count it.
    let outcome = outcome_of(&result);
    match &result {
        Ok(Outcome::Error { code, .. }) => span.attribute("toa.error", || code.clone()),
        Err(_) => span.fail(|| outcome.to_owned()),
        Ok(_) => {}
    }
    operations.record(operation, outcome, started.elapsed());
    result
}

/// How a run ended, as `toa_operations_total` says it.
fn outcome_of(result: &Result<Outcome, ProgramError>) -> &'static str {
    match result {
        Ok(Outcome::Reply(_)) => "ok",
        Ok(Outcome::Error { .. }) => "error",
        Err(error) if error.past_deadline() => "timeout",
        Err(_) => "failed",
    }
}

/// The operation's own error with the runtime's `code`.
/// The answer to a `latest` receiver's event older than what it applied (or a copy of it): it
/// ran nothing.
fn stale(component: &str, record: &Record, recorded: &Recorded) -> Outcome {
    let version = |hash: &str| hash.trim_start_matches('0').parse::<u64>().unwrap_or(0);
    error(
        STALE,
        format!(
            "{component}: {} at version {}, and version {} was applied already: not run",
            record.key.trim_start_matches("latest:"),
            version(&record.hash),
            version(&recorded.hash)
        ),
    )
}

/// The code of a `latest` receiver's stale event (acknowledged, not run).
pub const STALE: &str = "STALE";

fn error(code: &str, message: String) -> Outcome {
    Outcome::Error {
        code: code.to_owned(),
        message: Some(message),
    }
}

impl Objects {
    /// The objects of `component`, if it declares an entity, with the kinds its program says
    /// (`None`: the manifest's word). A kind the program says against the manifest's `type` fails
    /// the start, naming the operation.
    pub fn new(
        component: &Component,
        description: Option<&toa_context::program::Description>,
        store: Backend,
        retrying: Arc<Retrying>,
    ) -> Result<Option<Self>, ComponentError> {
        let Some(entity) = &component.manifest.entity else {
            return Ok(None);
        };
        let mut kinds = BTreeMap::new();
        let mut concurrency = BTreeMap::new();
        let mut inherited = BTreeSet::new();
        let mut once = BTreeSet::new();
        for (name, declared) in &component.manifest.operations {
            let kind = component.kind_of(name, declared, description)?;
            if declared.once {
                once_applies(component, name, kind)?;
                once.insert(name.clone());
            }
            kinds.insert(name.clone(), kind);
            concurrency.insert(
                name.clone(),
                declared.concurrency.unwrap_or(Concurrency::Retry),
            );
            let served = description.is_some_and(|d| d.operations.contains(name));
            if manifest::is_inherited(name) && !served {
                inherited.insert(name.clone());
            }
        }
        let schema = toa_context::schema::compile(&entity.schema()).map_err(|error| {
            ComponentError::Mismatch {
                component: component.name.clone(),
                message: format!("`entity.properties`: {error}"),
            }
        })?;
        let store = Arc::new(store);
        let publishing = Publishing::new(component, description)?;
        let outbox =
            (!publishing.is_empty()).then(|| Arc::new(Outbox::new(&component.name, store.clone())));
        Ok(Some(Self {
            component: component.name.clone(),
            publishing,
            outbox,
            associated: entity.associated,
            blank: entity.blank.clone(),
            schema,
            kinds,
            concurrency,
            inherited,
            once,
            store,
            turns: Turns::default(),
            retrying,
        }))
    }

    /// The component's outbox, when it declares events.
    pub fn outbox(&self) -> Option<&Arc<Outbox>> {
        self.outbox.as_ref()
    }

    /// Hands the events of a write just stored to the outbox, to publish.
    fn stored(&self, events: Vec<Event>) {
        if let Some(outbox) = &self.outbox {
            outbox.sent(events);
        }
    }

    /// Whether calls of `operation` write to the store: a caller's key on them is a record the
    /// store keeps with the write, not Redis's.
    pub fn records(&self, operation: &str) -> bool {
        matches!(
            self.kinds.get(operation),
            Some(Kind::Transition | Kind::Assignment)
        )
    }

    /// The record that makes `run` apply once: by the caller's key, else by the call's id when
    /// the operation declares `once`.
    fn record_of(&self, run: &Run<'_>) -> Result<Option<Record>, ProgramError> {
        match (run.receipt, run.key) {
            (Some(Receipt::Latest(version)), Some(source)) => {
                return Ok(Some(Record::watermark(run.operation, source, version)))
            }
            (Some(Receipt::Inbox), Some(event)) => {
                return Ok(Some(Record::inbox(run.operation, event)))
            }
            _ => {}
        }
        let key = match run.key {
            Some(key) => format!("key:{key}"),
            None if !self.once.contains(run.operation) => return Ok(None),
            // A call of ours always has an id; one without would share a record with others.
            None if run.meta.id.is_empty() => {
                let message = "`once`: the call has no id to be applied once by".to_owned();
                return Err(self.refused(run.operation, message));
            }
            None => format!("call:{}", run.meta.id),
        };
        // The object is part of what a key names: the key given again for another object is
        // another call, refused.
        let named = json!({ "input": run.input, "query": run.query });
        Ok(Some(Record {
            operation: run.operation.to_owned(),
            key,
            hash: crate::coordination::atom::repeats::input_hash(&named),
            latest: false,
        }))
    }

    /// The record of `run`, if it has one, and what it says when it is kept already.
    async fn recorded(
        &self,
        run: &Run<'_>,
    ) -> Result<(Option<Record>, Option<Outcome>), ProgramError> {
        let Some(record) = self.record_of(run)? else {
            return Ok((None, None));
        };
        let repeat = match self.store.recorded(&record).await {
            Ok(Some(recorded)) if record.answered_by(&recorded) => {
                Some(self.repeat(run, &record, recorded)?)
            }
            Ok(_) => None,
            Err(problem) => Some(self.unavailable(problem)),
        };
        Ok((Some(record), repeat))
    }

    /// A repeat of a call applied already: its first outcome, unless the key came with another
    /// input.
    fn repeat(
        &self,
        run: &Run<'_>,
        record: &Record,
        recorded: Recorded,
    ) -> Result<Outcome, ProgramError> {
        if record.latest {
            return Ok(stale(&self.component, record, &recorded));
        }
        if recorded.hash != record.hash {
            let message = "`key`: given before with another input (limits.once); a key names \
                           one call"
                .to_owned();
            return Err(self.refused(run.operation, message));
        }
        tracing::info!(component = %self.component, operation = %run.operation, "a call applied already: its first outcome, not applied again");
        Ok(Outcome::from_json(&recorded.outcome).unwrap_or_else(|_| {
            self.unavailable(format!(
                "the record of {} holds {}, not an outcome",
                run.operation,
                crate::component::client::quoted(&recorded.outcome.to_string())
            ))
        }))
    }

    async fn operate(&self, run: Run<'_>) -> Result<Outcome, ProgramError> {
        let kind = self
            .kinds
            .get(run.operation)
            .copied()
            .unwrap_or(Kind::Effect);
        match kind {
            Kind::Effect | Kind::Computation if run.query.is_some() => Err(self.refused(
                run.operation,
                format!("`query`: an {} takes no query", kind.name()),
            )),
            Kind::Effect | Kind::Computation => run.plain(None).await,
            _ => self.on_store(kind, run).await,
        }
    }

    /// A call on the store, ended at its deadline: a store that stops answering (frozen, cut off
    /// without the connection's end) does not hold the call past it. A write under way then may
    /// or may not have been stored, and the answer says so. (The program's own runs end at the
    /// deadline already; the margin lets their failure be the one told.)
    async fn on_store(&self, kind: Kind, run: Run<'_>) -> Result<Outcome, ProgramError> {
        let ends = run.deadline + DEADLINE_MARGIN;
        let operation = run.operation.to_owned();
        let on = async {
            match kind {
                Kind::Observation => self.observe(run).await,
                Kind::Assignment => self.assign(run).await,
                _ => self.transition(run).await,
            }
        };
        match tokio::time::timeout_at(ends, on).await {
            Ok(outcome) => outcome,
            Err(_) => Ok(self.unavailable(format!(
                "{operation}: the call did not end by its deadline (the store, or the program, \
                 did not answer); a write under way may have been stored"
            ))),
        }
    }

    /// What the schema says of `state`: the first problem, naming the property.
    fn check(&self, state: &State) -> Result<(), String> {
        let value = Value::Object(state.clone());
        if let Some(problem) = self.schema.iter_errors(&value).next() {
            return Err(format!("{problem} (at {})", problem.instance_path()));
        }
        // PostgreSQL's JSONB cannot hold it; every store refuses it alike, naming where it is.
        match super::store::nul_at(&value, String::new()) {
            Some(at) => Err(format!(
                "a string holds the character U+0000, which no store keeps (at {})",
                if at.is_empty() { "/" } else { &at }
            )),
            None => Ok(()),
        }
    }

    /// The object as an entry (`id`, `VERSION`, every property `blank` has), or `None`.
    fn entry_of(&self, id: &str, found: Found) -> Option<Value> {
        let (mut state, version) = match found {
            Found::Live { state, version } => (state, version),
            Found::Missing | Found::Deleted { .. } if !self.associated => return None,
            other => (State::new(), other.version()),
        };
        for (key, value) in &self.blank {
            state.entry(key).or_insert_with(|| value.clone());
        }
        state.insert(transition::ID.to_owned(), Value::from(id));
        state.insert(transition::VERSION.to_owned(), Value::from(version));
        Some(Value::Object(state))
    }

    /// A call that breaks what the operation takes: refused as the request contract.
    fn refused(&self, operation: &str, message: String) -> ProgramError {
        ProgramError::Contract(format!("{}.{operation}: {message}", self.component))
    }

    fn no_id(&self, operation: &str) -> ProgramError {
        self.refused(operation, "`query.id`: the call names no object".to_owned())
    }

    /// The input of an inherited `transit` or `assign`: properties, never a control field.
    fn properties<'r>(&self, run: &Run<'r>) -> Result<&'r Value, ProgramError> {
        let reserved = [
            transition::ID,
            transition::VERSION,
            transition::DISCARD,
            transition::DELETE,
        ];
        let given = run.input.as_object().into_iter().flat_map(|o| o.keys());
        match given
            .into_iter()
            .find(|key| reserved.contains(&key.as_str()))
        {
            Some(key) => Err(self.refused(
                run.operation,
                format!(
                    "`input.{key}`: id, VERSION, DISCARD and DELETE are not properties; \
                     {} sets properties only",
                    run.operation
                ),
            )),
            None => Ok(run.input),
        }
    }

    /// This process's turn on the object `id`, waited for until `deadline`.
    async fn turn(&self, id: &str, deadline: Instant) -> Result<transition::Turn<'_>, ()> {
        tokio::time::timeout_at(deadline, self.turns.take(id))
            .await
            .map_err(|_| ())
    }

    fn unavailable(&self, problem: impl std::fmt::Display) -> Outcome {
        error("UNAVAILABLE", format!("{}: {problem}", self.component))
    }
}

/// `once` is a record written with a write: an operation that writes nothing (its module exports
/// an effect, an observation or a computation) cannot keep it, and fails the start.
fn once_applies(component: &Component, name: &str, kind: Kind) -> Result<(), ComponentError> {
    if matches!(kind, Kind::Transition | Kind::Assignment) {
        return Ok(());
    }
    Err(ComponentError::Mismatch {
        component: component.name.clone(),
        message: format!(
            "`operations.{name}.once`: only a transition or an assignment is applied once, and \
             {name} is {} {}",
            if kind.name().starts_with(['a', 'e', 'o']) {
                "an"
            } else {
                "a"
            },
            kind.name()
        ),
    })
}

/// Observations.
impl Objects {
    async fn observe(&self, run: Run<'_>) -> Result<Outcome, ProgramError> {
        if run.operation == manifest::ENUMERATE && self.inherited.contains(run.operation) {
            return Ok(self.enumerate(run.input).await);
        }
        let Some(id) = run.query.and_then(|q| q.id.as_deref()) else {
            return Err(self.no_id(run.operation));
        };
        let found = match self.store.read(id).await {
            Ok(found) => found,
            Err(problem) => return Ok(self.unavailable(problem)),
        };
        let entry = self.entry_of(id, found).unwrap_or(Value::Null);
        if self.inherited.contains(run.operation) {
            return Ok(Outcome::Reply(entry));
        }
        run.plain(Some(&entry)).await
    }

    /// A page of live objects by id: `{"items": [entries], "next": <the last id, or null>}`.
    async fn enumerate(&self, input: &Value) -> Outcome {
        // The input's schema bounds it too, unless `enumerate` is declared without one.
        let limit = input.get("limit").and_then(Value::as_u64).unwrap_or(100);
        let limit = limit.clamp(1, manifest::ENUMERATE_LIMIT);
        let after = input.get("after").and_then(Value::as_str);
        let page = match self.store.enumerate(after, limit as usize).await {
            Ok(page) => page,
            Err(problem) => return self.unavailable(problem),
        };
        let full = page.len() as u64 == limit;
        let next = full
            .then(|| page.last().map(|(id, _, _)| id.clone()))
            .flatten();
        let items: Vec<Value> = page
            .into_iter()
            .filter_map(|(id, state, version)| self.entry_of(&id, Found::Live { state, version }))
            .collect();
        Outcome::Reply(json!({ "items": items, "next": next }))
    }
}

/// Assignments.
impl Objects {
    async fn assign(&self, run: Run<'_>) -> Result<Outcome, ProgramError> {
        let (record, repeat) = self.recorded(&run).await?;
        if let Some(repeat) = repeat {
            return Ok(repeat);
        }
        let fields = if self.inherited.contains(run.operation) {
            self.properties(&run)?.clone()
        } else {
            match run.plain(None).await? {
                Outcome::Reply(fields) => fields,
                refused @ Outcome::Error { .. } => {
                    return self.remember(&run, record.as_ref(), refused).await
                }
            }
        };
        let Value::Object(fields) = fields else {
            let body =
                format!("an assignment's function returns the properties it writes, not {fields}");
            return Err(ProgramError::Malformed {
                component: self.component.clone(),
                body: crate::component::client::quoted(&body),
            });
        };
        let id = match run.query.and_then(|q| q.id.clone()) {
            Some(id) => id,
            None if self.associated => return Err(self.no_id(run.operation)),
            None => crate::component::client::new_id(),
        };
        let Ok(_turn) = self.turn(&id, run.deadline).await else {
            return Ok(busy(&self.component, &id));
        };
        for attempt in 1..=transition::ATTEMPTS {
            let written = self.write_fields(&run, &id, &fields, record.as_ref()).await;
            if let Some(outcome) = written? {
                return Ok(outcome);
            }
            let pause = transition::backoff(attempt);
            let margin = toa_context::program::START_MARGIN;
            if Instant::now() + pause + margin >= run.deadline {
                return Ok(contended(&self.component, &id, attempt));
            }
            tokio::time::sleep(pause).await;
        }
        Ok(contended(&self.component, &id, transition::ATTEMPTS))
    }

    /// Writes `fields` over the object `id` (created when missing; a deleted one of a
    /// non-associated entity stays deleted), with the call's record: the stored entry, the
    /// record's outcome, or `None` when another replica wrote first (written again on what it
    /// stored, after a pause).
    async fn write_fields(
        &self,
        run: &Run<'_>,
        id: &str,
        fields: &State,
        record: Option<&Record>,
    ) -> Result<Option<Outcome>, ProgramError> {
        let found = match self.store.read(id).await {
            Ok(found) => found,
            Err(problem) => return Ok(Some(self.unavailable(problem))),
        };
        let read = found.version();
        let expected = run.query.and_then(|q| q.version);
        if let Some(expected) = expected.filter(|e| *e != read) {
            let message = precondition(id, expected, read);
            return Ok(Some(error("PRECONDITION_FAILED", message)));
        }
        let previous = self.publishes();
        let previous = previous.then(|| transition::as_before(&found, id, &self.blank));
        let mut state = match found {
            Found::Live { state, .. } => state,
            Found::Deleted { .. } if !self.associated => {
                let message = TransitionError::NotFound { id: id.to_owned() }.to_string();
                let message = format!("{}: {message}", self.component);
                return Ok(Some(error("NOT_FOUND", message)));
            }
            Found::Missing | Found::Deleted { .. } => self.blank.clone(),
        };
        state.extend(fields.clone());
        if let Err(message) = self.check(&state) {
            return Ok(Some(invalid(&self.component, id, &message)));
        }
        let stored = Found::Live {
            state: state.clone(),
            version: read + 1,
        };
        let entry = self.entry_of(id, stored).unwrap_or(Value::Null);
        let outcome = json!({ "reply": entry });
        let recorded = record.map(|record| (record, &outcome));
        let write = Write::Put(state);
        let events = self
            .events_of(run, id, read + 1, &write, previous.flatten())
            .await?;
        match self.store.commit(id, read, write, recorded, &events).await {
            Ok(Committed::Stored { .. }) => {
                self.stored(events);
                Ok(Some(Outcome::Reply(entry)))
            }
            Ok(Committed::Repeated(found)) => {
                let record = record.expect("a record is found only by a commit with one");
                self.repeat(run, record, found).map(Some)
            }
            Ok(Committed::Lost { .. }) => Ok(None),
            Err(problem) => Ok(Some(self.unavailable(problem))),
        }
    }

    fn publishes(&self) -> bool {
        !self.publishing.is_empty()
    }

    /// The events an assignment's write of `id` at `version` publishes, over the object as it
    /// was (`previous`); a condition the program could not answer is the call's failure.
    async fn events_of(
        &self,
        run: &Run<'_>,
        id: &str,
        version: u64,
        write: &Write,
        previous: Option<Value>,
    ) -> Result<Vec<Event>, ProgramError> {
        if !self.publishes() {
            return Ok(Vec::new());
        }
        let payload = Event::payload(id, version, write);
        let (client, deadline) = (run.client, run.deadline);
        let labels = self
            .publishing
            .decide(client, deadline, &payload, previous.as_ref());
        let labels = labels.await?;
        Ok(Event::all(&labels, id, version, payload))
    }

    /// An outcome that wrote nothing (the operation's own error), kept as the call's record when
    /// it has one; a record there already is what the call answers.
    async fn remember(
        &self,
        run: &Run<'_>,
        record: Option<&Record>,
        outcome: Outcome,
    ) -> Result<Outcome, ProgramError> {
        let Some(record) = record else {
            return Ok(outcome);
        };
        match self.store.record(record, &outcome.to_json()).await {
            Ok(None) => Ok(outcome),
            Ok(Some(found)) => self.repeat(run, record, found),
            Err(problem) => {
                tracing::warn!(%problem, operation = %record.operation, "the outcome of a call that wrote nothing was not recorded: a redelivery runs it again");
                Ok(outcome)
            }
        }
    }
}

fn contended(component: &str, id: &str, attempts: u32) -> Outcome {
    let id = id.to_owned();
    let message = TransitionError::Contended { id, attempts }.to_string();
    error("CONTENDED", format!("{component}: {message}"))
}

/// A call that waited for its turn on an object until its deadline: this process's other calls
/// on the object held it all the while.
fn busy(component: &str, id: &str) -> Outcome {
    error(
        "CONTENDED",
        format!(
            "{component}: CONTENDED: the object {id} was busy with other calls of this process \
             until the call's deadline; nothing was stored"
        ),
    )
}

fn precondition(id: &str, expected: u64, current: u64) -> String {
    TransitionError::PreconditionFailed {
        id: id.to_owned(),
        expected,
        current,
    }
    .to_string()
}

/// A write the entity's schema refuses: the call's failure, nothing stored.
fn invalid(component: &str, id: &str, message: &str) -> Outcome {
    error(
        "INVALID_ENTRY",
        format!("{component}: the object {id} would not be valid: {message}; nothing was stored"),
    )
}

/// Transitions.
impl Objects {
    async fn transition(&self, run: Run<'_>) -> Result<Outcome, ProgramError> {
        let inherited = self.inherited.contains(run.operation);
        if inherited && run.operation != manifest::DELETE {
            self.properties(&run)?;
        }
        let id = run.query.and_then(|q| q.id.as_deref());
        let _turn = match id {
            Some(id) => match self.turn(id, run.deadline).await {
                Ok(turn) => Some(turn),
                Err(()) => return Ok(busy(&self.component, id)),
            },
            None => None,
        };
        let (record, repeat) = self.recorded(&run).await?;
        if let Some(repeat) = repeat {
            return Ok(repeat);
        }
        let concurrency = self.concurrency[run.operation];
        // Known while it runs, so that a call it makes to an operation declaring `once` is
        // refused (the inherited ones make no calls).
        let _running = (concurrency == Concurrency::Retry && !inherited)
            .then(|| self.retrying.enter(&run.meta.id));
        let call = Call {
            id,
            version: run.query.and_then(|q| q.version),
            concurrency,
            deadline: run.deadline,
            record: record.as_ref(),
        };
        let check = |state: &State| self.check(state);
        let stored = |events| self.stored(events);
        let failed = std::sync::Mutex::new(None);
        let entity = Entity {
            associated: self.associated,
            blank: &self.blank,
            check: &check,
            events: &self.publishing.of_call(run.client, run.deadline, &failed),
            stored: &stored,
        };
        let decide = |entry: State| self.decide(&run, entry, inherited, &failed, call.deadline);
        let answer = transition::transit(&*self.store, &entity, &call, decide).await;
        if let Some(failure) = failed.lock().expect("failed").take() {
            return Err(failure);
        }
        if let (Ok(Answer::Repeated(found)), Some(record)) = (&answer, &record) {
            return self.repeat(&run, record, found.clone());
        }
        Ok(self.answered(run.operation, answer))
    }

    /// One run of the transition on `entry`: the inherited ones here, the others in the
    /// program (whose failure is kept in `failed` and ends the call).
    async fn decide(
        &self,
        run: &Run<'_>,
        mut entry: State,
        inherited: bool,
        failed: &std::sync::Mutex<Option<ProgramError>>,
        deadline: Instant,
    ) -> Result<Decision, TransitionError> {
        if inherited {
            if run.operation == manifest::DELETE {
                entry.insert(transition::DELETE.to_owned(), Value::Bool(true));
            } else if let Value::Object(fields) = run.input {
                entry.extend(fields.clone());
            }
            return Ok(Decision::Left {
                entry,
                returned: None,
            });
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // As for any call: a run that could not finish before the caller stops waiting does not
        // start (a rerun after a lost write, late in the call).
        if left <= toa_context::program::START_MARGIN {
            let component = self.component.clone();
            *failed.lock().expect("failed") = Some(ProgramError::TimedOut {
                component,
                limit: left,
            });
            return Err(TransitionError::Program("past the deadline".to_owned()));
        }
        let entry = Value::Object(entry);
        let ran = run
            .client
            .transit(run.operation, run.input, &entry, run.meta, left)
            .await;
        match ran {
            Ok(Ok((entry, returned))) => Ok(Decision::Left { entry, returned }),
            Ok(Err(refused)) => Ok(Decision::Refused(refused.to_json()["error"].take())),
            Err(failure) => {
                let message = failure.to_string();
                *failed.lock().expect("failed") = Some(failure);
                Err(TransitionError::Program(message))
            }
        }
    }

    /// What the caller gets of a transition.
    fn answered(&self, operation: &str, answer: Result<Answer, TransitionError>) -> Outcome {
        match answer {
            Ok(Answer::Stored { reply, .. } | Answer::Discarded { reply, .. }) => {
                Outcome::Reply(reply)
            }
            // Answered above, with the record's check.
            Ok(Answer::Repeated(found)) => Outcome::from_json(&found.outcome)
                .unwrap_or_else(|_| error("FAILED", format!("{operation}: {}", found.outcome))),
            Ok(Answer::Refused(refused)) => Outcome::from_json(&json!({ "error": refused }))
                .unwrap_or_else(|_| error("FAILED", format!("{operation}: {refused}"))),
            Err(failure) => {
                let code = match &failure {
                    TransitionError::NotFound { .. } => "NOT_FOUND",
                    TransitionError::PreconditionFailed { .. } => "PRECONDITION_FAILED",
                    TransitionError::Conflict { .. } => "CONFLICT",
                    TransitionError::Contended { .. } => "CONTENDED",
                    TransitionError::Invalid { .. } | TransitionError::Unkept { .. } => {
                        "INVALID_ENTRY"
                    }
                    TransitionError::NoId => "RequestContract",
                    TransitionError::Store(_) => "UNAVAILABLE",
                    TransitionError::Program(_) => "FAILED",
                };
                error(code, format!("{}: {failure}", self.component))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toa_context::program::Description;
    use toa_context::Manifest;

    fn stock(operations: &str) -> Component {
        let yaml = format!(
            "name: stock\nentity: {{ associated: true, properties: {{ n: {{ type: integer }} }}, blank: {{ n: 0 }} }}\noperations: {operations}\n"
        );
        Component::new(Manifest::parse(&yaml, "m").unwrap(), ".".into()).unwrap()
    }

    /// The objects of `stock` with `operations`, in memory, without a program's word.
    fn objects_of(operations: &str) -> Objects {
        Objects::new(&stock(operations), None, memory(), Default::default())
            .unwrap()
            .unwrap()
    }

    fn memory() -> Backend {
        Backend::Memory(super::super::memory::Memory::default())
    }

    fn said(operations: &[&str], kinds: &[(&str, Kind)]) -> Description {
        Description {
            commands: Vec::new(),
            operations: operations.iter().map(|o| (*o).to_owned()).collect(),
            kinds: kinds.iter().map(|(o, k)| ((*o).to_owned(), *k)).collect(),
            receivers: Vec::new(),
            conditions: Vec::new(),
        }
    }

    #[test]
    fn the_program_says_each_kind_and_the_agent_serves_what_it_has_no_module_for() {
        let component = stock("{ reserve: {}, transit: {}, look: { type: observation } }");
        let description = said(&["reserve", "look"], &[("reserve", Kind::Transition)]);
        let objects = Objects::new(&component, Some(&description), memory(), Default::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            objects.kinds["reserve"],
            Kind::Transition,
            "the module's word"
        );
        assert_eq!(objects.kinds["transit"], Kind::Transition, "the name's");
        assert_eq!(objects.kinds["observe"], Kind::Observation, "inherited");
        let inherited: Vec<&str> = objects.inherited.iter().map(String::as_str).collect();
        assert_eq!(inherited, ["enumerate", "observe", "transit"]);
        // Without the program's word, `reserve` is an effect: it declares nothing of a transition.
        let manifests = Objects::new(&component, None, memory(), Default::default())
            .unwrap()
            .unwrap();
        assert_eq!(manifests.kinds["reserve"], Kind::Effect);
        // A module exporting another kind than the manifest's `type` fails the start.
        let wrong = said(&["reserve", "look"], &[("look", Kind::Transition)]);
        let error = Objects::new(&component, Some(&wrong), memory(), Default::default())
            .err()
            .unwrap();
        assert_eq!(
            error.to_string(),
            "stock: the program does not match its manifest: `operations.look.type` is observation, and its module exports a transition"
        );
        let once = stock("{ pay: { type: transition, once: true } }");
        let once = Objects::new(&once, None, memory(), Default::default())
            .unwrap()
            .unwrap();
        assert!(once.once.contains("pay") && once.records("pay"));
        assert!(!once.records("observe"), "an observation writes nothing");
        // `once` on what the program says is an effect: nothing to keep its record with.
        let effect = stock("{ pay: { once: true } }");
        let says = said(&["pay"], &[("pay", Kind::Effect)]);
        let error = Objects::new(&effect, Some(&says), memory(), Default::default())
            .err()
            .unwrap();
        assert_eq!(
            error.to_string(),
            "stock: the program does not match its manifest: `operations.pay.once`: only a transition or an assignment is applied once, and pay is an effect"
        );
        // The inherited operations need no module; the others do.
        assert!(component.commands(Some(&description)).is_ok());
        let missing = said(&["look"], &[]);
        let error = component.commands(Some(&missing)).unwrap_err().to_string();
        assert!(error.contains("declares [\"reserve\"]"), "{error}");
    }

    /// A call of the inherited `transit` on `id` with `input`, ending at `deadline`.
    async fn transit(
        objects: &Objects,
        id: &str,
        input: Value,
        deadline: Instant,
    ) -> Result<Outcome, ProgramError> {
        let meta = CallMeta {
            id: crate::component::client::new_id(),
            ..CallMeta::default()
        };
        delivered(objects, id, input, deadline, &meta, None).await
    }

    /// A delivery of a call of the inherited `transit` with `meta` (its id) and a caller's `key`.
    async fn delivered(
        objects: &Objects,
        id: &str,
        input: Value,
        deadline: Instant,
        meta: &CallMeta,
        key: Option<&str>,
    ) -> Result<Outcome, ProgramError> {
        let client = ProgramClient::new("stock", 1);
        let query = Query {
            id: Some(id.to_owned()),
            version: None,
        };
        let run = Run {
            client: &client,
            operation: "transit",
            input: &input,
            query: Some(&query),
            meta,
            deadline,
            key,
            receipt: None,
        };
        objects.operate(run).await
    }

    #[tokio::test]
    async fn a_call_declared_once_is_applied_once_however_often_it_is_delivered() {
        let objects = objects_of("{ transit: { once: true } }");
        let far = Instant::now() + std::time::Duration::from_secs(5);
        let meta = CallMeta {
            id: "c1".to_owned(),
            ..CallMeta::default()
        };
        let first = delivered(&objects, "p1", json!({ "n": 1 }), far, &meta, None).await;
        let again = delivered(&objects, "p1", json!({ "n": 1 }), far, &meta, None).await;
        let stored = Outcome::Reply(json!({ "id": "p1", "n": 1, "VERSION": 1 }));
        assert_eq!(first.unwrap(), stored);
        assert_eq!(
            again.unwrap(),
            stored,
            "the first outcome, not applied again"
        );
        assert_eq!(objects.store.read("p1").await.unwrap().version(), 1);
        // Another call (another id) is applied.
        let other = transit(&objects, "p1", json!({ "n": 2 }), far)
            .await
            .unwrap();
        assert_eq!(
            other,
            Outcome::Reply(json!({ "id": "p1", "n": 2, "VERSION": 2 }))
        );
    }

    #[tokio::test]
    async fn a_key_on_a_write_is_the_stores_record_and_names_one_input() {
        let objects = objects_of("{ transit: {} }");
        let far = Instant::now() + std::time::Duration::from_secs(5);
        let (one, two) = (CallMeta::default(), CallMeta::default());
        let key = Some("order-7");
        let first = delivered(&objects, "p1", json!({ "n": 1 }), far, &one, key).await;
        let repeat = delivered(&objects, "p1", json!({ "n": 1 }), far, &two, key).await;
        assert_eq!(first.unwrap(), repeat.unwrap());
        assert_eq!(
            objects.store.read("p1").await.unwrap().version(),
            1,
            "applied once"
        );
        let other = delivered(&objects, "p1", json!({ "n": 3 }), far, &two, key).await;
        let refused = other.unwrap_err().to_string();
        assert!(
            refused.contains("`key`: given before with another input"),
            "{refused}"
        );
        // The key given again for another object is another call: refused, nothing written.
        let elsewhere = delivered(&objects, "p2", json!({ "n": 1 }), far, &two, key).await;
        let refused = elsewhere.unwrap_err().to_string();
        assert!(
            refused.contains("`key`: given before with another input"),
            "{refused}"
        );
        assert_eq!(objects.store.read("p2").await.unwrap(), Found::Missing);
        // Without a key (and without `once`), a call has no record: each is applied.
        transit(&objects, "p1", json!({ "n": 1 }), far)
            .await
            .unwrap();
        assert_eq!(objects.store.read("p1").await.unwrap().version(), 2);
    }

    #[tokio::test]
    async fn a_string_with_u0000_is_refused_naming_where_and_nothing_is_stored() {
        let yaml = "name: notes\nentity: { associated: true, properties: { text: { type: string }, tags: { type: object } }, blank: {} }\noperations: { transit: {}, assign: {} }\n";
        let component = Component::new(Manifest::parse(yaml, "m").unwrap(), ".".into()).unwrap();
        let objects = Objects::new(&component, None, memory(), Default::default())
            .unwrap()
            .unwrap();
        let far = Instant::now() + std::time::Duration::from_secs(5);
        for (operation, input, at) in [
            ("transit", json!({ "text": "a\u{0}b" }), "/text"),
            ("assign", json!({ "tags": { "x\u{0}": 1 } }), "/tags/x\u{0}"),
        ] {
            let client = ProgramClient::new("notes", 1);
            let query = Query {
                id: Some("n1".to_owned()),
                version: None,
            };
            let run = Run {
                client: &client,
                operation,
                input: &input,
                query: Some(&query),
                meta: &CallMeta::default(),
                deadline: far,
                key: None,
                receipt: None,
            };
            let answer = objects.operate(run).await.unwrap();
            let Outcome::Error { code, message } = answer else {
                panic!("{operation}: {answer:?}")
            };
            let message = message.unwrap_or_default();
            assert_eq!(code, "INVALID_ENTRY", "{operation}: {message}");
            assert!(
                message.contains("U+0000") && message.contains(&format!("(at {at})")),
                "{operation}: {message}"
            );
        }
        assert_eq!(objects.store.read("n1").await.unwrap(), Found::Missing);
    }

    #[tokio::test]
    async fn an_assignment_with_a_key_is_applied_once() {
        let objects = objects_of("{ assign: {} }");
        let client = ProgramClient::new("stock", 1);
        let query = Query {
            id: Some("p1".to_owned()),
            version: None,
        };
        let far = Instant::now() + std::time::Duration::from_secs(5);
        let assign = |n: i64| {
            let input = json!({ "n": n });
            let meta = CallMeta::default();
            let (client, query, objects) = (&client, &query, &objects);
            async move {
                let run = Run {
                    client,
                    operation: "assign",
                    input: &input,
                    query: Some(query),
                    meta: &meta,
                    deadline: far,
                    key: Some("set-5"),
                    receipt: None,
                };
                objects.operate(run).await
            }
        };
        let first = assign(5).await.unwrap();
        assert_eq!(
            first,
            Outcome::Reply(json!({ "id": "p1", "n": 5, "VERSION": 1 }))
        );
        assert_eq!(assign(5).await.unwrap(), first, "the first outcome");
        assert_eq!(objects.store.read("p1").await.unwrap().version(), 1);
        assert!(assign(6).await.is_err(), "another input with the key");
    }

    #[tokio::test]
    async fn a_call_waiting_for_its_turn_on_an_object_ends_at_its_deadline() {
        let objects = objects_of("{ transit: {} }");
        let held = objects.turns.take("p1").await;
        let started = Instant::now();
        let deadline = started + std::time::Duration::from_millis(100);
        let answer = transit(&objects, "p1", json!({ "n": 1 }), deadline)
            .await
            .unwrap();
        let waited = started.elapsed();
        assert!(
            matches!(&answer, Outcome::Error { code, .. } if code == "CONTENDED"),
            "{answer:?}"
        );
        assert!(
            waited < std::time::Duration::from_millis(300),
            "waited {waited:?}"
        );
        drop(held);
        let far = Instant::now() + std::time::Duration::from_secs(5);
        let stored = transit(&objects, "p1", json!({ "n": 1 }), far)
            .await
            .unwrap();
        assert_eq!(
            stored,
            Outcome::Reply(json!({ "id": "p1", "n": 1, "VERSION": 1 }))
        );
    }

    #[tokio::test]
    async fn the_inherited_transit_sets_properties_only() {
        let objects = objects_of("{ transit: {} }");
        let far = Instant::now() + std::time::Duration::from_secs(5);
        let input = json!({ "n": 1, "DELETE": true });
        let refused = transit(&objects, "p1", input, far)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with(
                "stock.transit: `input.DELETE`: id, VERSION, DISCARD and DELETE are not properties"
            ),
            "{refused}"
        );
        assert_eq!(
            objects.store.read("p1").await.unwrap(),
            Found::Missing,
            "nothing written"
        );
    }
}
