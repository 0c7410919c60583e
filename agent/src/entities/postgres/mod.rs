//! The PostgreSQL store (DESIGN 17): the replicas of a component share its objects, one row per
//! object in a table of the component's, in a schema of the application's.
//!
//! - **Rows**: `id` (the object's id, ordered byte by byte), `version`, `deleted` (a tombstone
//!   keeps its version), `state` (JSONB: the properties) and `attempts` (the ids of the last
//!   [`ATTEMPTS_KEPT`] writes that stored it, newest first).
//! - **A commit** is one statement: an `INSERT … ON CONFLICT DO NOTHING` for an object never
//!   written (version 0), else an `UPDATE … WHERE version = <the version read>`. No transaction
//!   spans the program's run; the row is locked only for the statement.
//! - **The records of calls applied once** (`once`, or a caller's key on a write) are rows of the
//!   application's `toa_once` table, by component, operation and key, with the call's outcome. A
//!   commit with a record is one transaction: the record first (a second delivery of the call
//!   waits on the first's uncommitted record, then finds it), then the compare-and-set; either
//!   failing rolls both back. Records older than `limits.once` are ignored, replaced, and
//!   deleted by every replica once an hour.
//! - **An outcome lost with its connection** (the statement was sent, the answer never came) is
//!   never re-run blindly: the agent reads the row on another connection and finds its attempt's
//!   id among the row's last writes (applied, even when other replicas wrote up to 15 times
//!   since) or not (not applied: the commit is made once more, itself a compare-and-set on the
//!   version read). When more writes followed the version read than the row names, a commit
//!   with a call's record (not a receiver's watermark, there from earlier events) asks the
//!   record, which commits with the write: there, the call was applied (by this delivery or
//!   another of the same call); missing, the write was lost to the other writers, unless
//!   records are kept so briefly that it may have expired. When the row cannot be read back, or
//!   neither row nor record can tell, the call is `UNAVAILABLE` saying that the write may have
//!   been stored.
//! - **DDL** runs at start under an advisory lock, so replicas starting together do not race;
//!   the runtime's own schema version is recorded in `toa_runtime`, and an agent refuses a newer
//!   one ([`SCHEMA_VERSION`]).
//!
//! Why tokio-postgres and deadpool-postgres: the one asynchronous driver on tokio that speaks the
//! protocol itself (no libpq), with prepared statements (each statement is prepared once per
//! pooled connection, `prepare_cached`: a read or a write is one round trip, not two), and a
//! small pool with wait, create and recycle timeouts; sqlx would add compile-time query checking this crate cannot use (its SQL
//! names tables at run time) and much more to build.

use super::backend::Retention;
use super::store::{Committed, Event, Found, Record, Recorded, State, Store, StoreError, Write};
use crate::errors::described;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::Json;

/// The layout of the runtime's tables this agent writes; an agent refuses a schema a newer one
/// recorded.
pub const SCHEMA_VERSION: i32 = 3;

/// How many of a row's last writes it names: enough that a write whose answer was lost finds
/// itself there although other replicas wrote since.
pub const ATTEMPTS_KEPT: usize = 16;

/// How long one statement may run (`statement_timeout`), and a connection may take to open.
const STATEMENT_LIMIT: Duration = Duration::from_secs(5);
const CONNECT_LIMIT: Duration = Duration::from_secs(5);
/// How long the agent waits for a statement's answer: a server that took it answers within its
/// `statement_timeout`; one that does not (frozen, or the network between cut without the
/// connection's end) is treated as a connection lost.
const ANSWER_LIMIT: Duration = Duration::from_secs(6);

/// How much longer than a commit has taken a call's record must be kept for its absence to say
/// that the commit was not stored: the server's clock, which dates and expires records, may be
/// stepped meanwhile.
const RECORD_MARGIN: Duration = Duration::from_secs(60);
/// How long the server keeps a transaction whose client went quiet in it.
const IDLE_IN_TRANSACTION_LIMIT: Duration = Duration::from_secs(10);

/// Where the store is, without credentials (the context's `storage`), and who logs in.
#[derive(Clone)]
pub struct Address {
    pub host: String,
    pub port: u16,
    pub database: String,
    pub username: Option<String>,
    pub password: Option<toa_context::Secret>,
    /// The CA certificates (PEM) the server's certificate is checked against, its name against
    /// `host`: TLS on. `None`: no TLS (a server on the node or in the pod's own network).
    pub ca: Option<String>,
}

mod connect;
mod outbox;

/// How often a replica deletes the records past `limits.once` (and the events past
/// `limits.events`).
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// One component's objects in PostgreSQL.
pub struct Postgres {
    pool: Pool,
    /// `"<schema>"."<table>"`, quoted.
    table: String,
    component: String,
    /// How long a record is kept (`limits.once`), in seconds.
    retention: f64,
    statements: Statements,
    outbox: outbox::Statements,
    /// Deletes the records past their retention, once the tables are there; stopped with the
    /// store.
    purge: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(purge) = &self.purge {
            purge.abort();
        }
    }
}

/// The statements, with the tables' names in place.
struct Statements {
    read: String,
    insert: String,
    update: String,
    /// `insert` and `update` with the write's events ([`outbox::with_events`]).
    insert_events: String,
    update_events: String,
    attempt: String,
    enumerate: String,
    /// The records': one kept, one made (or an expired one replaced), the expired deleted.
    recorded: String,
    record: String,
    purge: String,
}

/// What one try of a commit did.
enum Tried {
    /// The compare-and-set changed this many rows (0: somebody wrote first).
    Rows(u64),
    /// The connection went away with the statement (or `COMMIT`) sent: applied or not, unknown.
    Unknown,
    /// The call's record was there already: nothing written.
    Recorded,
    /// No answer within [`ANSWER_LIMIT`].
    Silent,
}

/// What a row read back after a commit says of it.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Stored: the attempt is among the row's last writes.
    Stored,
    /// Not stored, somebody else wrote first: the object's version now.
    Lost(u64),
    /// Not stored, and the object is where it was read: made once more.
    Again,
    /// Not among the row's last writes, but so many writes followed the version read that it
    /// may have been stored and pushed out of them: how many.
    Unknown(u64),
}

/// The verdict on a commit of the object read at version `read`, from the row read back after
/// it (`found`: its version, and whether the attempt is among its last writes; `None`: no row).
/// `missed`: the try answered that it changed nothing, `Some(true)` when that try was the first
/// (so nothing of this commit was stored), `Some(false)` after a first whose outcome was lost;
/// `None` when this try's outcome was lost too.
fn verdict(read: u64, found: Option<(u64, bool)>, missed: Option<bool>) -> Verdict {
    match found {
        Some((_, true)) => Verdict::Stored,
        // Stored, the attempt would have made version `read + 1`, which the row names while at
        // most ATTEMPTS_KEPT - 1 writes followed it: past that, its absence says nothing.
        Some((version, false))
            if missed != Some(true) && version.saturating_sub(read) > ATTEMPTS_KEPT as u64 =>
        {
            Verdict::Unknown(version - read)
        }
        Some((version, false)) if version != read => Verdict::Lost(version),
        _ if missed.is_some() => Verdict::Lost(read),
        _ => Verdict::Again,
    }
}

/// An identifier, quoted for SQL: the names come from the application's and the component's
/// names, which allow `.`, `-` and (a namespaced application) `/`. PostgreSQL cuts identifiers
/// at 63 bytes, so that two long names could meet: a longer name keeps its first 46 bytes and
/// adds 16 hex digits of its SHA-256.
pub fn quote(name: &str) -> String {
    const LONGEST: usize = 63;
    let fitted = if name.len() <= LONGEST {
        name.to_owned()
    } else {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(name.as_bytes());
        let mut end = 46;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}_{hex}", &name[..end])
    };
    format!("\"{}\"", fitted.replace('"', "\"\""))
}

/// The schema of `application`'s objects.
pub fn schema_of(application: &str) -> String {
    format!("toa_{application}")
}

/// The DDL of the entities of the components in `dirs`, for `application` (its shared name):
/// what `toa-agent storage ddl` prints, for a DBA or a Job to run where the agent's role may not
/// create tables.
pub fn ddl_of(application: &str, dirs: &[std::path::PathBuf]) -> Result<String, String> {
    let mut statements = Vec::new();
    for dir in dirs {
        let component = crate::component::Component::load(dir).map_err(|e| e.to_string())?;
        if component.manifest.entity.is_some() {
            for statement in ddl(application, &component.name) {
                if !statements.contains(&statement) {
                    statements.push(statement);
                }
            }
        }
    }
    let mut printed: String = statements.iter().map(|s| format!("{s};\n")).collect();
    if !printed.is_empty() {
        let grants = grants(&quote(&schema_of(application)), "<role>");
        printed.push_str(&format!(
            "-- Then, for the role the agents log in as (again after another component's \
             statements: ALL TABLES is the tables there now):\n-- {grants}\n"
        ));
    }
    Ok(printed)
}

/// The DDL of a component's objects in `application`: what `toa-agent storage ddl` prints for a
/// DBA, and what the agent runs at start.
pub fn ddl(application: &str, component: &str) -> Vec<String> {
    let schema = quote(&schema_of(application));
    let table = format!("{schema}.{}", quote(component));
    let mut statements = vec![
        format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.toa_runtime (key text PRIMARY KEY, value integer NOT NULL)"
        ),
        format!(
            "INSERT INTO {schema}.toa_runtime AS r (key, value) VALUES ('schema', {SCHEMA_VERSION}) \
             ON CONFLICT (key) DO UPDATE SET value = GREATEST(r.value, EXCLUDED.value)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.toa_once (\
             component text COLLATE \"C\" NOT NULL, \
             operation text COLLATE \"C\" NOT NULL, \
             key text COLLATE \"C\" NOT NULL, \
             hash text NOT NULL, \
             outcome jsonb NOT NULL, \
             at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (component, operation, key))"
        ),
        format!("CREATE INDEX IF NOT EXISTS toa_once_at ON {schema}.toa_once (at)"),
        format!(
            "CREATE TABLE IF NOT EXISTS {table} (\
             id text COLLATE \"C\" PRIMARY KEY, \
             version bigint NOT NULL, \
             deleted boolean NOT NULL DEFAULT false, \
             state jsonb NOT NULL, \
             attempts text[] NOT NULL)"
        ),
    ];
    statements.extend(outbox::ddl(&schema));
    statements
}

/// What the agent needs on the tables of records and events beside reading and writing them:
/// the hourly purge deletes those past `limits.once` and `limits.events`.
const PURGED: &str = "SELECT, INSERT, UPDATE, DELETE";

/// The grants that let `role` use the tables of `schema` (both quoted): what a DBA runs after
/// `toa-agent storage ddl`'s statements, and what an agent refused for a missing privilege
/// names.
pub fn grants(schema: &str, role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA {schema} TO {role}; \
         GRANT {PURGED} ON ALL TABLES IN SCHEMA {schema} TO {role};"
    )
}

/// A statement the server did not answer in time.
fn silent() -> StoreError {
    StoreError::Unavailable(format!(
        "the store did not answer within {} s (frozen, or cut off)",
        ANSWER_LIMIT.as_secs()
    ))
}

fn unavailable(error: impl std::error::Error + 'static) -> StoreError {
    StoreError::Unavailable(told(&described(&error)))
}

/// What a caller is told of a store's error: the error itself, without what the server adds to
/// it (`DETAIL:`, which may quote a row's values, and `HINT:`), which goes to the log only.
fn told(described: &str) -> String {
    let is_more = |line: &&str| line.starts_with("DETAIL: ") || line.starts_with("HINT: ");
    if !described.lines().any(|line| is_more(&line)) {
        return described.to_owned();
    }
    tracing::warn!(error = %described, "the store refused a statement");
    let lines = described.lines().filter(|line| !is_more(line));
    lines.collect::<Vec<_>>().join("\n")
}

impl Postgres {
    /// Connects, and makes the component's table when missing (under an advisory lock).
    /// `retention`: how long the records of calls applied once and the events published are
    /// kept.
    pub async fn open(
        address: &Address,
        application: &str,
        component: &str,
        connections: usize,
        retention: Retention,
    ) -> Result<Self, StoreError> {
        let pool = pool(address, connections)?;
        let schema = quote(&schema_of(application));
        let table = format!("{schema}.{}", quote(component));
        let statements = Statements::for_tables(
            &table,
            &format!("{schema}.toa_once"),
            &format!("{schema}.toa_outbox"),
        );
        let mut store = Self {
            pool,
            statements,
            outbox: outbox::Statements::for_table(&format!("{schema}.toa_outbox")),
            table,
            component: component.to_owned(),
            retention: retention.once.as_secs_f64(),
            purge: None,
        };
        store.migrate(application, component).await?;
        let purging = Purging {
            records: store.statements.purge.clone(),
            events: store.outbox.purge.clone(),
            component: component.to_owned(),
            retention: (store.retention, retention.events.as_secs_f64()),
        };
        store.purge = Some(tokio::spawn(purge(store.pool.clone(), purging)));
        Ok(store)
    }

    /// Makes the component's tables when missing, and refuses a layout a newer runtime made.
    /// Tables that are there are not made again: a role that may not create them (a DBA ran
    /// `toa-agent storage ddl`) still starts.
    async fn migrate(&self, application: &str, component: &str) -> Result<(), StoreError> {
        let schema = quote(&schema_of(application));
        let runtime = format!("{schema}.toa_runtime");
        self.granted(&schema, std::iter::empty()).await?;
        let client = self.pool.get().await.map_err(unavailable)?;
        let (once, outbox) = (format!("{schema}.toa_once"), format!("{schema}.toa_outbox"));
        let made = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                 AND to_regclass($3) IS NOT NULL AND to_regclass($4) IS NOT NULL",
                &[&runtime, &self.table, &once, &outbox],
            )
            .await
            .map_err(unavailable)?;
        drop(client);
        if !made.get::<_, bool>(0) {
            self.make(application, component).await?;
        }
        let tables = [
            (&runtime, "SELECT"),
            (&self.table, "SELECT, INSERT, UPDATE"),
        ];
        let tables = tables
            .into_iter()
            .chain([&once, &outbox].map(|t| (t, PURGED)));
        self.granted(&schema, tables).await?;
        let client = self.pool.get().await.map_err(unavailable)?;
        let recorded = format!("SELECT value FROM {runtime} WHERE key = 'schema'");
        let row = client
            .query_one(&recorded, &[])
            .await
            .map_err(unavailable)?;
        let version: i32 = row.get(0);
        if version > SCHEMA_VERSION {
            return Err(StoreError::Unavailable(format!(
                "the schema {schema} was made by a newer runtime (layout {version}; this agent \
                 knows {SCHEMA_VERSION}): upgrade the agent"
            )));
        }
        Ok(())
    }

    /// Refuses to start when the agent's role lacks `USAGE` on `schema` (when it is there) or,
    /// with `tables` (each with the privileges it needs, once they are there), a privilege on
    /// them, naming what is missing and the grants that give it: a role a DBA made, granted
    /// too little, would otherwise fail later, on a call or in the hourly purge.
    async fn granted<'a>(
        &self,
        schema: &str,
        tables: impl Iterator<Item = (&'a String, &'static str)>,
    ) -> Result<(), StoreError> {
        let (mut names, mut privileges) = (Vec::new(), Vec::new());
        for (table, needed) in tables {
            for privilege in needed.split(", ") {
                names.push(table.as_str());
                privileges.push(privilege);
            }
        }
        let client = self.pool.get().await.map_err(unavailable)?;
        // `regnamespace` reads the quoted name as an identifier, as the tables' names are read;
        // the schema is looked for first, since naming anything in it needs `USAGE`.
        let row = client
            .query_one(
                "SELECT current_user::text, coalesce(has_schema_privilege(\
                 to_regnamespace($1), 'USAGE'), true)",
                &[&schema],
            )
            .await
            .map_err(unavailable)?;
        let role: String = row.get(0);
        let missing: Vec<String> = if !row.get::<_, bool>(1) {
            vec![format!("USAGE on the schema {schema}")]
        } else if names.is_empty() {
            Vec::new()
        } else {
            client
                .query(
                    "SELECT p || ' on ' || t FROM unnest($1::text[], $2::text[]) \
                     WITH ORDINALITY AS x(t, p, n) WHERE NOT has_table_privilege(t, p) ORDER BY n",
                    &[&names, &privileges],
                )
                .await
                .map_err(unavailable)?
                .iter()
                .map(|row| row.get(0))
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        Err(StoreError::Unavailable(format!(
            "the role {role} may not use the tables of {}: it lacks {}; a DBA grants what it needs \
             with: {}",
            self.component,
            missing.join(", "),
            grants(schema, &quote(&role))
        )))
    }

    /// Runs the DDL, one agent at a time (`CREATE … IF NOT EXISTS` races otherwise).
    async fn make(&self, application: &str, component: &str) -> Result<(), StoreError> {
        let mut client = self.pool.get().await.map_err(unavailable)?;
        let transaction = client.transaction().await.map_err(unavailable)?;
        transaction
            .execute("SELECT pg_advisory_xact_lock(7414)", &[])
            .await
            .map_err(unavailable)?;
        for statement in ddl(application, component) {
            transaction
                .batch_execute(&statement)
                .await
                .map_err(|error| {
                    let reason = error
                        .as_db_error()
                        .map_or_else(|| error.to_string(), |e| e.message().to_owned());
                    StoreError::Unavailable(format!(
                        "cannot make the tables of {component} ({reason}); where the agent's role \
                     may not create them, `toa-agent storage ddl` prints the statements for a DBA"
                    ))
                })?;
        }
        transaction.commit().await.map_err(unavailable)
    }

    /// The row's version and whether `attempt` is among its last writes, if there is a row.
    async fn written_by(&self, id: &str, attempt: &str) -> Result<Option<(u64, bool)>, StoreError> {
        let row = self
            .query_opt(&self.statements.attempt, &[&id, &attempt])
            .await?;
        Ok(row.map(|row| (row.get::<_, i64>(0) as u64, row.get(1))))
    }

    /// After an answer lost with its connection: whether the write was applied, read back on
    /// another connection (a few times, as a restarting server comes back). `None`: not found out.
    async fn applied(&self, id: &str, attempt: &str) -> Option<Option<(u64, bool)>> {
        for pause in [0, 100, 400, 1_000] {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if let Ok(found) = self.written_by(id, attempt).await {
                return Some(found);
            }
        }
        None
    }

    /// A read: once more on another connection when the first was found gone (a pooled
    /// connection to a server since restarted, or cut).
    async fn query(
        &self,
        statement: &str,
        parameters: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        for _ in 0..2 {
            let mut held = Held::from(&self.pool).await?;
            let client = held.client();
            // Prepared once per connection: one round trip per statement instead of two.
            let answered = async {
                let prepared = client.prepare_cached(statement).await?;
                client.query(&prepared, parameters).await
            };
            match tokio::time::timeout(ANSWER_LIMIT, answered).await {
                Ok(Ok(rows)) => {
                    held.keep();
                    return Ok(rows);
                }
                Ok(Err(error)) if !lost_with_connection(&error) => {
                    held.keep();
                    return Err(unavailable(error));
                }
                // Gone, or silent: the connection is dropped, and a read is tried once more, on
                // another one.
                Ok(Err(_)) | Err(_) => {}
            }
        }
        Err(StoreError::Unavailable(format!(
            "the connection was lost, or the store did not answer within {} s, twice",
            ANSWER_LIMIT.as_secs()
        )))
    }

    async fn query_opt(
        &self,
        statement: &str,
        parameters: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        Ok(self.query(statement, parameters).await?.into_iter().next())
    }

    /// One try of a commit: the compare-and-set alone, or with the call's record and the
    /// write's events in one transaction.
    async fn try_commit(
        &self,
        (id, read, write): (&str, u64, &Write),
        attempt: &str,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Tried, StoreError> {
        let mut held = Held::from(&self.pool).await?;
        let nothing = State::new();
        let (deleted, state) = match write {
            Write::Put(state) => (false, state),
            Write::Delete => (true, &nothing),
        };
        let change = Change {
            id,
            read,
            deleted,
            state: Json(state),
            attempt,
        };
        let client = held.client();
        let done = tokio::time::timeout(ANSWER_LIMIT, async {
            match (record, events.is_empty()) {
                (None, true) => {
                    return self
                        .compare_and_set(&*client, &change)
                        .await
                        .map(Tried::Rows)
                }
                (None, false) => {
                    let rows = self.write_with_events(&*client, &change, events).await;
                    return rows.map(Tried::Rows);
                }
                (Some(_), _) => {}
            }
            self.transactional_write(client, &change, record, events)
                .await
        });
        // The connection leaves the pool (`held` dropped) but where it is known to be sound.
        match done.await.unwrap_or(Ok(Tried::Silent)) {
            // Sent, and no answer: applied or not, unknown.
            Ok(Tried::Silent) => Ok(Tried::Unknown),
            Ok(tried) => {
                held.keep();
                Ok(tried)
            }
            // The connection went away with the statement sent: applied or not, unknown.
            Err(error) if lost_with_connection(&error) => Ok(Tried::Unknown),
            // Refused by the server (a statement timeout, a read-only standby) or never sent:
            // not applied. A connection refused as read-only is not used again: its server (or a
            // pooler's server behind it) takes no writes now, and a new connection is checked
            // as it opens ([`pool`]).
            Err(error) => {
                if !read_only(&error) {
                    held.keep();
                }
                Err(unavailable(error))
            }
        }
    }

    /// What the row, read back, says of a commit's `attempt` on the object read at `read`
    /// ([`verdict`]); `None`: not stored, and the object is where it was read. When the row
    /// cannot tell, a commit with a call's `record` asks the record, if the record cannot have
    /// expired since the commit `began`.
    async fn judged(
        &self,
        (id, read): (&str, u64),
        attempt: &str,
        missed: Option<bool>,
        record: Option<&Record>,
        began: std::time::Instant,
    ) -> Result<Option<Committed>, StoreError> {
        let unknown = |why: &str| {
            StoreError::Unavailable(format!(
                "the write of {id} lost its connection and {why}: it may have been stored"
            ))
        };
        let found = self.applied(id, attempt).await;
        let found = found.ok_or_else(|| unknown("could not be read back"))?;
        match verdict(read, found, missed) {
            Verdict::Stored => Ok(Some(Committed::Stored { version: read + 1 })),
            Verdict::Lost(current) => Ok(Some(Committed::Lost { current })),
            Verdict::Unknown(since) => {
                let untraced = || {
                    unknown(&format!(
                        "{since} writes since leave no trace of it (a row names its last \
                         {ATTEMPTS_KEPT})"
                    ))
                };
                // A receiver's watermark is there from earlier events: it says nothing of this
                // write.
                let record = record
                    .filter(|record| !record.latest)
                    .ok_or_else(untraced)?;
                // The record and the write commit together, and the write is settled: had it
                // not committed, it would still hold the row (a lock no later write passes),
                // or it would find the row moved past the version it compares. So the record
                // there says applied (by this delivery or another of the same call), and
                // missing says lost, unless it was kept too briefly to be found now (`limits.once`
                // as short as this commit has taken, with a margin): then it says nothing.
                let found = self.recorded(record).await;
                // Timed once the record was looked for: the look-up's own wait counts.
                let kept = Duration::try_from_secs_f64(self.retention).unwrap_or(Duration::MAX);
                let unexpired = kept > began.elapsed() + RECORD_MARGIN;
                match found {
                    Ok(Some(recorded)) => Ok(Some(Committed::Repeated(recorded))),
                    Ok(None) if unexpired => Ok(Some(Committed::Lost {
                        current: read + since,
                    })),
                    Ok(None) => Err(unknown(&format!(
                        "{since} writes since leave no trace of it, nor does its record, which \
                         may have expired (limits.once)"
                    ))),
                    Err(_) => Err(untraced()),
                }
            }
            Verdict::Again => Ok(None),
        }
    }

    /// The compare-and-set statement: the rows it changed.
    async fn compare_and_set(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        change: &Change<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        let Change {
            id,
            read,
            deleted,
            state,
            attempt,
        } = change;
        if *read == 0 {
            let statement = client.prepare_cached(&self.statements.insert).await?;
            client
                .execute(&statement, &[id, deleted, state, attempt])
                .await
        } else {
            let read = *read as i64;
            let statement = client.prepare_cached(&self.statements.update).await?;
            client
                .execute(&statement, &[id, &read, deleted, state, attempt])
                .await
        }
    }

    /// The record (if any), the compare-and-set and the write's events, in one transaction:
    /// all or nothing.
    async fn transactional_write(
        &self,
        client: &mut deadpool_postgres::Object,
        change: &Change<'_>,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Tried, tokio_postgres::Error> {
        let transaction = client.transaction().await?;
        if let Some((record, outcome)) = record {
            let outcome = Json(outcome);
            let parameters = self.record_parameters(record, &outcome);
            let statement = transaction.prepare_cached(&self.statements.record).await?;
            if transaction.execute(&statement, &parameters).await? == 0 {
                transaction.rollback().await?;
                return Ok(Tried::Recorded);
            }
        }
        let rows = if events.is_empty() {
            self.compare_and_set(&transaction, change).await?
        } else {
            self.write_with_events(&transaction, change, events).await?
        };
        if rows == 0 {
            transaction.rollback().await?;
        } else {
            transaction.commit().await?;
        }
        Ok(Tried::Rows(rows))
    }
}

/// A compare-and-set's parameters.
struct Change<'a> {
    id: &'a str,
    read: u64,
    deleted: bool,
    /// By reference: serialized as the statement is sent, never copied before.
    state: Json<&'a State>,
    attempt: &'a str,
}

/// What the hourly purge deletes: its two statements, whose, and their retentions (records',
/// events') in seconds.
struct Purging {
    records: String,
    events: String,
    component: String,
    retention: (f64, f64),
}

/// Deletes `component`'s records and published events past their retention, at start and every
/// [`PURGE_EVERY`]; every replica does, which costs nothing when another did just before.
async fn purge(pool: Pool, purging: Purging) {
    let Purging {
        records: statement,
        events,
        component,
        retention: (retention, events_retention),
    } = purging;
    let mut every = tokio::time::interval(PURGE_EVERY);
    loop {
        every.tick().await;
        let client = match pool.get().await {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "the records past limits.once were not deleted now");
                continue;
            }
        };
        outbox::purge(&client, &events, &component, events_retention).await;
        match client.execute(&statement, &[&component, &retention]).await {
            Ok(0) => {}
            Ok(deleted) => {
                tracing::info!(%component, deleted, "deleted the records of calls applied once past limits.once")
            }
            Err(error) => {
                let error = described(&error);
                tracing::warn!(%component, %error, "the records past limits.once were not deleted now")
            }
        }
    }
}

impl Postgres {
    /// The parameters of the statement that makes `record` with `outcome`.
    fn record_parameters<'a>(
        &'a self,
        record: &'a Record,
        outcome: &'a Json<&'a Value>,
    ) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 7] {
        [
            &self.component,
            &record.operation,
            &record.key,
            &record.hash,
            outcome,
            &self.retention,
            // A watermark's older version is replaced (the hash is the version, zero-padded).
            &record.latest,
        ]
    }

    /// A record found there when writing it: what it says.
    async fn repeated(&self, record: &Record) -> Result<Recorded, StoreError> {
        match self.recorded(record).await? {
            Some(recorded) => Ok(recorded),
            // Past its retention between the two statements: rare, and safe to try again.
            None => Err(StoreError::Unavailable(format!(
                "the record of {} expired while it was read; try again",
                record.operation
            ))),
        }
    }
}

/// Takes a connection found gone out of the pool, so that no other statement gets it.
fn discard(client: deadpool_postgres::Object) {
    drop(deadpool_postgres::Object::take(client));
}

/// A pooled connection that goes back to the pool only when its work ended soundly
/// ([`Held::keep`]): one dropped half-way (the call's deadline cut its statement, the server
/// froze, the connection was lost) may be frozen or hold a transaction half done, and leaves the
/// pool instead.
struct Held(Option<deadpool_postgres::Object>);

impl Held {
    async fn from(pool: &Pool) -> Result<Self, StoreError> {
        Ok(Self(Some(pool.get().await.map_err(unavailable)?)))
    }

    fn client(&mut self) -> &mut deadpool_postgres::Object {
        self.0
            .as_mut()
            .expect("a held connection until kept or dropped")
    }

    /// Back to the pool: its work ended, and it answers.
    fn keep(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            discard(client);
        }
    }
}

/// Whether the server refused a write as read-only (SQLSTATE 25006): a standby, or a primary
/// being demoted.
fn read_only(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// Whether `error` is the connection's end (closed, or an I/O error under it) rather than an
/// answer of the server's or a statement never sent.
fn lost_with_connection(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    // The server ending the session (an administrator's shutdown, a crash: class 57P) or the
    // connection (class 08) answers as a database error, though the statement's fate is unknown.
    if let Some(code) = error.code() {
        let code = code.code();
        if code.starts_with("57P") || code.starts_with("08") {
            return true;
        }
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    false
}

fn pool(address: &Address, connections: usize) -> Result<Pool, StoreError> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&address.host)
        .port(address.port)
        .dbname(&address.database)
        .connect_timeout(CONNECT_LIMIT)
        // A transaction left open by a client that went silent (frozen, partitioned) would hold
        // its row and record locks until the server's TCP keepalive noticed, hours later.
        //
        // No sequential scans: every statement here finds its rows by an index. From a prepared
        // statement's sixth run the server may keep one generic plan for it, until the table's
        // statistics change (ANALYZE, VACUUM) or its definition does. Planned while the table was
        // a page or two, that plan was a scan of the whole table, and it stayed one as the table
        // grew (measured: most reads and writes of a 1,000-object table scanning it whole, at
        // twice the server's CPU per transition). Behind a pooler that drops startup options,
        // the role must carry these settings (docs/component-protocol.md).
        .options(format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={} -c enable_seqscan=off",
            STATEMENT_LIMIT.as_millis(),
            IDLE_IN_TRANSACTION_LIMIT.as_millis()
        ))
        .keepalives_idle(Duration::from_secs(10))
        // Never a standby's session: after a failover the address may lead to a standby for a
        // while (or a standby that is never promoted), whose reads stop where its replay
        // stopped. A write there is refused (25006), but a read, a record looked for, or a lost
        // commit's read-back would answer from the past. (Checked as a connection opens: behind
        // a pooler, that is the pooler's server of the moment.)
        .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite)
        .application_name("toa-agent");
    // Without one, the driver logs in as the operating system's user, as libpq does.
    if let Some(username) = &address.username {
        config.user(username);
    }
    if let Some(password) = &address.password {
        config.password(password.expose());
    }
    Pool::builder(manager(config, address.ca.as_deref())?)
        .max_size(connections)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(CONNECT_LIMIT))
        .create_timeout(Some(CONNECT_LIMIT))
        .recycle_timeout(Some(CONNECT_LIMIT))
        .build()
        .map_err(unavailable)
}

/// The pool's manager: connections opened on the local thread, with TLS when `ca` is given.
fn manager(mut config: tokio_postgres::Config, ca: Option<&str>) -> Result<Manager, StoreError> {
    let recycling = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    Ok(match ca {
        None => {
            let connect = connect::OnLocalThread {
                tls: tokio_postgres::NoTls,
            };
            Manager::from_connect(config, connect, recycling)
        }
        Some(pem) => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let connect = connect::OnLocalThread { tls: tls(pem)? };
            Manager::from_connect(config, connect, recycling)
        }
    })
}

/// TLS trusting only the CA certificates in `pem` (a server's name is checked against the
/// address's host, as rustls always does).
fn tls(pem: &str) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let certificate = certificate.map_err(|error| {
            StoreError::Unavailable(format!("TOA_STORAGE_CA: not a PEM certificate: {error}"))
        })?;
        roots.add(certificate).map_err(|error| {
            StoreError::Unavailable(format!("TOA_STORAGE_CA: a certificate is refused: {error}"))
        })?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| StoreError::Unavailable(format!("TLS: {error}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl Statements {
    fn for_tables(table: &str, once: &str, outbox: &str) -> Self {
        let past = "now() - make_interval(secs => $2::float8)";
        let insert = format!(
            "INSERT INTO {table} (id, version, deleted, state, attempts) \
             VALUES ($1, 1, $2, $3, ARRAY[$4::text]) ON CONFLICT (id) DO NOTHING"
        );
        let update = format!(
            "UPDATE {table} SET version = version + 1, deleted = $3, state = $4, \
             attempts = (ARRAY[$5::text] || attempts)[1:{ATTEMPTS_KEPT}] \
             WHERE id = $1 AND version = $2"
        );
        Self {
            read: format!("SELECT version, deleted, state FROM {table} WHERE id = $1"),
            insert_events: outbox::with_events(&insert, outbox, 4),
            update_events: outbox::with_events(&update, outbox, 5),
            insert,
            update,
            attempt: format!("SELECT version, $2::text = ANY(attempts) FROM {table} WHERE id = $1"),
            enumerate: format!(
                "SELECT id, version, state FROM {table} \
                 WHERE NOT deleted AND id > $1 ORDER BY id LIMIT $2"
            ),
            recorded: format!(
                "SELECT hash, outcome FROM {once} WHERE component = $1 AND operation = $2 \
                 AND key = $3 AND at > now() - make_interval(secs => $4::float8)"
            ),
            record: format!(
                "INSERT INTO {once} AS o (component, operation, key, hash, outcome) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (component, operation, key) \
                 DO UPDATE SET hash = EXCLUDED.hash, outcome = EXCLUDED.outcome, at = now() \
                 WHERE o.at <= now() - make_interval(secs => $6::float8) \
                 OR ($7::bool AND o.hash < EXCLUDED.hash)"
            ),
            purge: format!("DELETE FROM {once} WHERE component = $1 AND at <= {past}"),
        }
    }
}

/// A row's state as the store's: an object, or (a row someone else wrote) refused by name.
fn state_of(id: &str, value: Value) -> Result<State, StoreError> {
    match value {
        Value::Object(state) => Ok(state),
        other => Err(StoreError::Unavailable(format!(
            "the row of {id} holds {} where an object's properties belong",
            crate::component::client::quoted(&other.to_string())
        ))),
    }
}

impl Store for Postgres {
    async fn read(&self, id: &str) -> Result<Found, StoreError> {
        let row = self.query_opt(&self.statements.read, &[&id]).await?;
        let Some(row) = row else {
            return Ok(Found::Missing);
        };
        let version = row.get::<_, i64>(0) as u64;
        if row.get::<_, bool>(1) {
            return Ok(Found::Deleted { version });
        }
        let Json(state): Json<Value> = row.get(2);
        Ok(Found::Live {
            state: state_of(id, state)?,
            version,
        })
    }

    async fn commit(
        &self,
        id: &str,
        read: u64,
        write: Write,
        record: Option<(&Record, &Value)>,
        events: &[Event],
    ) -> Result<Committed, StoreError> {
        // 64 random bits: the id is looked for among one row's last writes only, and a short
        // one keeps the row small (its 16 names are most of it; measured: the server's CPU per
        // transition grows with the row).
        let attempt = format!("{:016x}", rand::random::<u64>());
        let began = std::time::Instant::now();
        // At most twice: once more after an outcome lost with its connection and found not
        // applied.
        for again in [false, true] {
            let tried = self
                .try_commit((id, read, &write), &attempt, record, events)
                .await;
            // A second try follows a first whose outcome was unknown: whatever this one says,
            // the first may still be stored (a slow COMMIT that lands later).
            let tried = tried.map_err(|error| match error {
                StoreError::Unavailable(problem) if again => StoreError::Unavailable(format!(
                    "{problem}; an earlier try's write of {id} may have been stored"
                )),
                other => other,
            })?;
            let missed = match tried {
                Tried::Rows(1) => return Ok(Committed::Stored { version: read + 1 }),
                // Not applied by this try; whether by an earlier one, only the first knows.
                Tried::Rows(_) => Some(!again),
                Tried::Unknown | Tried::Silent => None,
                Tried::Recorded => {
                    let record = record.expect("only a commit with a record finds one").0;
                    return self.repeated(record).await.map(Committed::Repeated);
                }
            };
            // Nothing changed (someone wrote first, or a first try of ours, cut, did meanwhile),
            // or the answer was lost: what the row says of this attempt.
            let record = record.map(|(record, _)| record);
            let judged = self.judged((id, read), &attempt, missed, record, began);
            if let Some(judged) = judged.await? {
                return Ok(judged);
            }
            tracing::warn!(table = %self.table, "a commit's outcome was lost with its connection and it was not applied: committing again");
        }
        Err(StoreError::Unavailable(format!(
            "the commit of {id} lost its connection twice: it may have been stored"
        )))
    }

    async fn recorded(&self, record: &Record) -> Result<Option<Recorded>, StoreError> {
        let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [
            &self.component,
            &record.operation,
            &record.key,
            &self.retention,
        ];
        let row = self
            .query_opt(&self.statements.recorded, &parameters)
            .await?;
        Ok(row.map(|row| {
            let Json(outcome): Json<Value> = row.get(1);
            Recorded {
                hash: row.get(0),
                outcome,
            }
        }))
    }

    async fn record(
        &self,
        record: &Record,
        outcome: &Value,
    ) -> Result<Option<Recorded>, StoreError> {
        let outcome = Json(outcome);
        let parameters = self.record_parameters(record, &outcome);
        // A lost answer here costs nothing: the statement is made once more as it is, and a
        // record found then is this one's (or another delivery's, of the same call).
        let mut made = None;
        for _ in 0..2 {
            let mut held = Held::from(&self.pool).await?;
            let statement = held.client().execute(&self.statements.record, &parameters);
            match tokio::time::timeout(ANSWER_LIMIT, statement).await {
                Ok(Ok(rows)) => {
                    held.keep();
                    made = Some(rows);
                    break;
                }
                Ok(Err(error)) if !lost_with_connection(&error) => {
                    if !read_only(&error) {
                        held.keep();
                    }
                    return Err(unavailable(error));
                }
                Ok(Err(_)) | Err(_) => {}
            }
        }
        let made = made.ok_or_else(silent)?;
        if made == 1 {
            return Ok(None);
        }
        self.repeated(record).await.map(Some)
    }

    async fn claim(&self, lease: Duration, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.claim_events(lease, limit).await
    }

    async fn published(&self, events: &[Event]) -> Result<(), StoreError> {
        self.mark_published(events).await
    }

    async fn waiting(&self) -> Result<Option<Duration>, StoreError> {
        self.oldest_waiting().await
    }

    async fn enumerate(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State, u64)>, StoreError> {
        let limit = limit as i64;
        let after = after.unwrap_or("");
        let rows = self
            .query(&self.statements.enumerate, &[&after, &limit])
            .await?;
        rows.into_iter()
            .map(|row| {
                let id: String = row.get(0);
                let Json(state): Json<Value> = row.get(2);
                let state = state_of(&id, state)?;
                Ok((id, state, row.get::<_, i64>(1) as u64))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_outcome_is_judged_from_the_row_and_never_as_lost_past_the_writes_it_names() {
        let kept = ATTEMPTS_KEPT as u64;
        // Found among the row's last writes: stored, however its try answered.
        for missed in [None, Some(true), Some(false)] {
            assert_eq!(verdict(7, Some((9, true)), missed), Verdict::Stored);
        }
        // Absent, and few enough writes since that it would be named: somebody else's.
        assert_eq!(
            verdict(7, Some((7 + kept, false)), None),
            Verdict::Lost(7 + kept)
        );
        // Absent past the names kept: a lost outcome may have been stored and pushed out.
        for missed in [None, Some(false)] {
            assert_eq!(
                verdict(7, Some((8 + kept, false)), missed),
                Verdict::Unknown(kept + 1)
            );
        }
        // A first try that answered "nothing changed" stored nothing: lost, however far.
        assert_eq!(
            verdict(7, Some((100, false)), Some(true)),
            Verdict::Lost(100)
        );
        // At the last write the row still names, after a second try's "nothing changed".
        assert_eq!(
            verdict(7, Some((7 + kept, false)), Some(false)),
            Verdict::Lost(7 + kept)
        );
        // No row, the try answered: lost where it was read.
        assert_eq!(verdict(7, None, Some(false)), Verdict::Lost(7));
        // Where it was read, and the outcome lost: not stored, made again.
        assert_eq!(verdict(7, Some((7, false)), None), Verdict::Again);
        assert_eq!(verdict(0, None, None), Verdict::Again);
        // Where it was read, the try answered: lost at the version read.
        assert_eq!(verdict(7, Some((7, false)), Some(true)), Verdict::Lost(7));
    }

    #[test]
    fn a_caller_is_told_the_error_not_the_rows_the_server_quotes() {
        let said = "db error: ERROR: duplicate key value violates unique constraint \"k\"\nDETAIL: Key (id)=(secret-42) already exists.\nHINT: look";
        let caller = told(said);
        assert_eq!(
            caller,
            "db error: ERROR: duplicate key value violates unique constraint \"k\""
        );
        assert_eq!(told(&caller), caller, "nothing to take from a plain error");
    }

    #[test]
    fn long_names_are_cut_with_a_hash_so_that_two_never_meet() {
        assert_eq!(quote("shop.stock"), "\"shop.stock\"");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
        let long = |last: char| format!("toa_{}/{}{last}", "n".repeat(40), "a".repeat(30));
        let (one, two) = (quote(&long('x')), quote(&long('y')));
        assert_ne!(one, two, "cut at 63 bytes, they would be one name");
        assert_eq!(one.len(), 63 + 2, "{one}");
        assert!(
            one.starts_with(&format!("\"toa_{}", "n".repeat(40))),
            "{one}"
        );
    }
}
