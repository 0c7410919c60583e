//! The outbox in PostgreSQL (DESIGN 18): `"toa_<app>".toa_outbox`, one row per event a stored
//! write publishes, inserted in the write's transaction. The committing agent leases its rows
//! for [`LEASE`] as it inserts them and publishes them itself; a relay in every replica claims
//! rows whose lease ran out (`FOR UPDATE SKIP LOCKED`, so two relays never claim one row), and a
//! published row is deleted after `limits.events`.

use super::Postgres;
use crate::entities::store::{Event, StoreError};
use crate::errors::described;
use std::time::Duration;
use tokio_postgres::types::Json;

/// The most published rows one statement of the purge deletes.
const PURGE_BATCH: usize = 10_000;

/// The outbox's statements, with its table's name in place.
pub(super) struct Statements {
    claim: String,
    published: String,
    waiting: String,
    pub(super) purge: String,
}

/// The outbox's DDL in `schema` (quoted).
pub(super) fn ddl(schema: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {schema}.toa_outbox (\
             component text COLLATE \"C\" NOT NULL, \
             object text COLLATE \"C\" NOT NULL, \
             version bigint NOT NULL, \
             label text COLLATE \"C\" NOT NULL, \
             payload jsonb NOT NULL, \
             at timestamptz NOT NULL DEFAULT now(), \
             lease timestamptz NOT NULL, \
             published timestamptz, \
             PRIMARY KEY (component, object, version, label))"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS toa_outbox_waiting ON {schema}.toa_outbox (component, at) \
             WHERE published IS NULL"
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS toa_outbox_published ON {schema}.toa_outbox \
             (component, published) WHERE published IS NOT NULL"
        ),
    ]
}

/// `write` (the insert or the compare-and-set update, whose parameters end at `$last`) and its
/// events' rows as one statement: the rows are inserted for the version `write` stored, and
/// none when it stored nothing, so the write and its events are one round trip and atomic. The
/// statement's count is the rows inserted: 0 when the write lost. Its own parameters follow
/// `write`'s: the component, the labels (`text[]`), the payload, the lease in seconds.
pub(super) fn with_events(write: &str, outbox: &str, last: usize) -> String {
    let [component, labels, payload, lease] = [1, 2, 3, 4].map(|n| format!("${}", last + n));
    format!(
        "WITH written AS ({write} RETURNING version) \
         INSERT INTO {outbox} (component, object, version, label, payload, lease) \
         SELECT {component}, $1, written.version, label, {payload}, \
         clock_timestamp() + make_interval(secs => {lease}::float8) \
         FROM written, unnest({labels}::text[]) AS label"
    )
}

impl Statements {
    pub(super) fn for_table(outbox: &str) -> Self {
        Self {
            claim: format!(
                "WITH due AS (SELECT object, version, label FROM {outbox} \
                 WHERE component = $1 AND published IS NULL AND lease <= now() \
                 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE {outbox} o SET lease = now() + make_interval(secs => $3::float8) FROM due \
                 WHERE o.component = $1 AND o.object = due.object AND o.version = due.version \
                 AND o.label = due.label \
                 RETURNING o.label, o.object, o.version, o.payload"
            ),
            published: format!(
                "UPDATE {outbox} o SET published = now() \
                 FROM unnest($2::text[], $3::int8[], $4::text[]) AS p(object, version, label) \
                 WHERE o.component = $1 AND o.object = p.object AND o.version = p.version \
                 AND o.label = p.label"
            ),
            waiting: format!(
                "SELECT extract(epoch FROM now() - min(at))::float8 FROM {outbox} \
                 WHERE component = $1 AND published IS NULL"
            ),
            // In batches: one statement each, within the statement timeout however many rows
            // a long outage left.
            purge: format!(
                "DELETE FROM {outbox} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {outbox} \
                 WHERE component = $1 AND published <= now() - make_interval(secs => $2::float8) \
                 LIMIT {PURGE_BATCH}))"
            ),
        }
    }
}

impl Postgres {
    /// The write of `change` and its `events` in one statement ([`with_events`]): the rows it
    /// changed (1, or 0 when another writer wrote first).
    pub(super) async fn write_with_events(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        change: &super::Change<'_>,
        events: &[Event],
    ) -> Result<u64, tokio_postgres::Error> {
        let super::Change {
            id,
            read,
            deleted,
            state,
            attempt,
        } = change;
        let labels: Vec<&str> = events.iter().map(|e| e.label.as_str()).collect();
        // Every label of one write publishes the same payload.
        let payload = Json(&events[0].payload);
        let lease = crate::entities::store::LEASE.as_secs_f64();
        let read = *read as i64;
        type Parameter<'p> = &'p (dyn tokio_postgres::types::ToSql + Sync);
        let mut parameters: Vec<Parameter<'_>> = vec![id];
        let statement = if read == 0 {
            &self.statements.insert_events
        } else {
            parameters.push(&read);
            &self.statements.update_events
        };
        let events: [Parameter<'_>; 4] = [&self.component, &labels, &payload, &lease];
        parameters.extend([deleted as Parameter<'_>, state, attempt]);
        parameters.extend(events);
        let statement = client.prepare_cached(statement).await?;
        let rows = client.execute(&statement, &parameters).await?;
        Ok(u64::from(rows > 0))
    }

    pub(super) async fn claim_events(
        &self,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let (limit, lease) = (limit as i64, lease.as_secs_f64());
        let rows = self
            .query(&self.outbox.claim, &[&self.component, &limit, &lease])
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let Json(payload) = row.get(3);
                Event {
                    label: row.get(0),
                    object: row.get(1),
                    version: row.get::<_, i64>(2) as u64,
                    payload,
                }
            })
            .collect())
    }

    pub(super) async fn mark_published(&self, events: &[Event]) -> Result<(), StoreError> {
        let objects: Vec<&str> = events.iter().map(|e| e.object.as_str()).collect();
        let versions: Vec<i64> = events.iter().map(|e| e.version as i64).collect();
        let labels: Vec<&str> = events.iter().map(|e| e.label.as_str()).collect();
        self.query(
            &self.outbox.published,
            &[&self.component, &objects, &versions, &labels],
        )
        .await
        .map(drop)
    }

    pub(super) async fn oldest_waiting(&self) -> Result<Option<Duration>, StoreError> {
        let row = self
            .query_opt(&self.outbox.waiting, &[&self.component])
            .await?;
        let seconds: Option<f64> = row.and_then(|row| row.get(0));
        Ok(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }
}

/// Deletes `component`'s events published longer than `retention` seconds ago, a batch at a
/// time: one step of the store's hourly purge.
pub(super) async fn purge(
    client: &deadpool_postgres::Object,
    statement: &str,
    component: &str,
    retention: f64,
) {
    let mut deleted = 0;
    loop {
        match client.execute(statement, &[&component, &retention]).await {
            Ok(0) => break,
            Ok(rows) => deleted += rows,
            Err(error) => {
                let error = described(&error);
                tracing::warn!(%component, %error, "the events past limits.events were not deleted now");
                break;
            }
        }
    }
    if deleted > 0 {
        tracing::info!(%component, deleted, "deleted the events published longer ago than limits.events");
    }
}
