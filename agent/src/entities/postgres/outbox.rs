//! The outbox in PostgreSQL (DESIGN 18): `"toa_<app>".toa_outbox`, one row per event a stored
//! write publishes, inserted in the write's transaction. The committing agent leases its rows
//! for [`LEASE`] as it inserts them and publishes them itself; a relay in every replica claims
//! rows whose lease ran out (`FOR UPDATE SKIP LOCKED`, so two relays never claim one row), and a
//! published row is deleted after `limits.events`.

use super::{described, Postgres};
use crate::entities::store::{Event, StoreError};
use std::time::Duration;
use tokio_postgres::types::Json;

/// The outbox's statements, with its table's name in place.
pub(super) struct Statements {
    insert: String,
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
    ]
}

impl Statements {
    pub(super) fn for_table(outbox: &str) -> Self {
        let leased = "now() + make_interval(secs => $6::float8)";
        Self {
            insert: format!(
                "INSERT INTO {outbox} (component, object, version, label, payload, lease) \
                 VALUES ($1, $2, $3, $4, $5, {leased})"
            ),
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
            purge: format!(
                "DELETE FROM {outbox} WHERE component = $1 \
                 AND published <= now() - make_interval(secs => $2::float8)"
            ),
        }
    }
}

impl Postgres {
    /// The rows of `events`, in the write's transaction, leased to this process.
    pub(super) async fn insert_events(
        &self,
        transaction: &deadpool_postgres::Transaction<'_>,
        events: &[Event],
    ) -> Result<(), tokio_postgres::Error> {
        let statement = transaction.prepare_cached(&self.outbox.insert).await?;
        let lease = crate::entities::store::LEASE.as_secs_f64();
        for event in events {
            let version = event.version as i64;
            let payload = Json(&event.payload);
            let parameters: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                &self.component,
                &event.object,
                &version,
                &event.label,
                &payload,
                &lease,
            ];
            transaction.execute(&statement, &parameters).await?;
        }
        Ok(())
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

/// Deletes `component`'s events published longer than `retention` seconds ago: one step of the
/// store's hourly purge.
pub(super) async fn purge(
    client: &deadpool_postgres::Object,
    statement: &str,
    component: &str,
    retention: f64,
) {
    match client.execute(statement, &[&component, &retention]).await {
        Ok(0) => {}
        Ok(deleted) => {
            tracing::info!(%component, deleted, "deleted the events published longer ago than limits.events")
        }
        Err(error) => {
            let error = described(&error);
            tracing::warn!(%component, %error, "the events past limits.events were not deleted now")
        }
    }
}
