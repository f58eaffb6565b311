//! What operators do with an outbox (the `idem outbox` commands): open one by URL without
//! creating anything, list its messages, purge delivered ones, and report its gauges.

use super::schema::{self, DEAD, DELIVERED, PENDING};
use super::{Outbox, OutboxStats, OUTBOX_SCHEMA_VERSION};
use crate::error::{Error, StoreErrorKind};
use crate::store::postgres::pg_error;
use crate::store::postgres::schema::{current_version, ensure_with, Table};
use crate::store::Backend;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Row};
use std::str::FromStr;
use std::time::Duration;

/// The state of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Waiting for (another) delivery attempt, backing off after a failure or not.
    Pending,
    /// Accepted by the publisher; deleted after the relays' retention (or `purge_delivered`).
    Delivered,
    /// Failed `max_attempts` times: kept, no longer tried, until [`Outbox::retry_dead`].
    Dead,
}

impl MessageState {
    /// `pending`, `delivered` or `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::Delivered => "delivered",
            MessageState::Dead => "dead",
        }
    }

    fn code(self) -> i16 {
        match self {
            MessageState::Pending => PENDING,
            MessageState::Delivered => DELIVERED,
            MessageState::Dead => DEAD,
        }
    }

    fn from_code(c: i16) -> Option<MessageState> {
        match c {
            PENDING => Some(MessageState::Pending),
            DELIVERED => Some(MessageState::Delivered),
            DEAD => Some(MessageState::Dead),
            _ => None,
        }
    }
}

/// One message as [`Outbox::list`] shows it (without its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageInfo {
    /// The message id.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// The ordering key.
    pub ordering_key: String,
    /// Its state.
    pub state: MessageState,
    /// Delivery attempts so far (failed ones, plus the successful one of a delivered message).
    pub attempts: u32,
    /// How long ago it was enqueued.
    pub age: Duration,
    /// A pending message backing off: how long until its next attempt (`None`: due now).
    pub next_attempt_in: Option<Duration>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// The payload's size in bytes.
    pub payload_len: u64,
}

/// Which messages [`Outbox::list`] returns: by default pending and dead ones (not the delivered
/// ones awaiting purge), oldest first, at most 100.
#[derive(Debug, Clone)]
pub struct ListFilter {
    states: Vec<MessageState>,
    topic: Option<String>,
    ordering_key: Option<String>,
    limit: i64,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            states: vec![MessageState::Pending, MessageState::Dead],
            topic: None,
            ordering_key: None,
            limit: 100,
        }
    }
}

impl ListFilter {
    /// Pending and dead messages, at most 100.
    pub fn new() -> ListFilter {
        ListFilter::default()
    }
    /// Only messages in `state`.
    pub fn state(mut self, state: MessageState) -> ListFilter {
        self.states = vec![state];
        self
    }
    /// Only messages of this topic.
    pub fn topic(mut self, topic: impl Into<String>) -> ListFilter {
        self.topic = Some(topic.into());
        self
    }
    /// Only messages of this ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> ListFilter {
        self.ordering_key = Some(key.into());
        self
    }
    /// At most `n` messages (at least 1).
    pub fn limit(mut self, n: usize) -> ListFilter {
        self.limit = n.clamp(1, i64::MAX as usize) as i64;
        self
    }
}

impl Outbox {
    /// Opens the outbox in `table` of the database at `url` (`postgres://…`) for an operator:
    /// a pool of two connections, checked at once, and the table's schema checked without
    /// creating anything. A table never migrated is an [`Error::Store`] of kind
    /// [`StoreErrorKind::SchemaMissing`] whose message names the migration to run; a URL that
    /// is not PostgreSQL's is [`Error::Config`].
    pub async fn connect(url: &str, table: &str) -> Result<Outbox, Error> {
        Outbox::connect_as(url, table, None).await
    }

    /// [`Outbox::connect`] with the connections' `application_name`.
    pub async fn connect_as(
        url: &str,
        table: &str,
        application_name: Option<&str>,
    ) -> Result<Outbox, Error> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::config(
                "the outbox is on PostgreSQL: the URL must start with postgres:// or \
                 postgresql:// (postgres://user:password@host:port/database)",
            ));
        }
        let t = Table::parse(table)?;
        let mut options = PgConnectOptions::from_str(url).map_err(|e| {
            Error::config(format!(
                "invalid PostgreSQL URL ({e}); expected postgres://user:password@host:port/database"
            ))
        })?;
        if let Some(name) = application_name {
            options = options.application_name(name);
        }
        let mut conn = options
            .connect()
            .await
            .map_err(|e| pg_error("outbox.connect", e))?;
        let found = current_version(&mut conn, &t).await;
        let checked = match found {
            Ok(0) => Err(missing(&t)),
            Ok(_) => ensure_with(
                &mut conn,
                &t,
                false,
                OUTBOX_SCHEMA_VERSION,
                schema::migrations(&t),
            )
            .await
            .map(drop),
            Err(e) => Err(e),
        };
        let _ = sqlx::Connection::close(conn).await;
        checked?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        Outbox::with_table(pool, table)
    }

    /// The messages `filter` selects, oldest first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<MessageInfo>, Error> {
        let sql = format!(
            "SELECT id, topic, ordering_key, status, attempts, \
                    (extract(epoch FROM now() - created_at) * 1000)::bigint, \
                    (extract(epoch FROM next_attempt_at - now()) * 1000)::bigint, \
                    last_error, octet_length(payload)::bigint \
             FROM {t} WHERE status = ANY($1) \
             AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR ordering_key = $3) \
             ORDER BY seq LIMIT $4",
            t = self.records()
        );
        let states: Vec<i16> = filter.states.iter().map(|s| s.code()).collect();
        let rows = sqlx::query(&sql)
            .bind(states)
            .bind(filter.topic.as_deref())
            .bind(filter.ordering_key.as_deref())
            .bind(filter.limit)
            .fetch_all(self.pool())
            .await
            .map_err(|e| pg_error("outbox.list", e))?;
        let db = |e| pg_error("outbox.list", e);
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let status: i16 = row.try_get(3).map_err(db)?;
            let state = MessageState::from_code(status).ok_or_else(|| {
                Error::store_kind(
                    Backend::Postgres,
                    "outbox.list",
                    StoreErrorKind::Corrupt,
                    format!("outbox message with unknown status {status}"),
                )
            })?;
            let attempts: i32 = row.try_get(4).map_err(db)?;
            let age: i64 = row.try_get(5).map_err(db)?;
            let next: i64 = row.try_get(6).map_err(db)?;
            let len: i64 = row.try_get(8).map_err(db)?;
            out.push(MessageInfo {
                id: row.try_get(0).map_err(db)?,
                topic: row.try_get(1).map_err(db)?,
                ordering_key: row.try_get(2).map_err(db)?,
                state,
                attempts: attempts.max(0) as u32,
                age: Duration::from_millis(age.max(0) as u64),
                next_attempt_in: (state == MessageState::Pending && next > 0)
                    .then(|| Duration::from_millis(next as u64)),
                last_error: row.try_get(7).map_err(db)?,
                payload_len: len.max(0) as u64,
            });
        }
        Ok(out)
    }

    /// The state of the message `id`, `None` when there is none (never enqueued, or purged).
    pub async fn state_of(&self, id: &str) -> Result<Option<MessageState>, Error> {
        let sql = format!("SELECT status FROM {} WHERE id = $1", self.records());
        let status: Option<i16> = sqlx::query_scalar(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| pg_error("outbox.list", e))?;
        Ok(status.and_then(MessageState::from_code))
    }

    /// Deletes the messages delivered more than `older_than` ago (what each relay does every
    /// `purge_every` with its retention) and returns how many. Pending and dead messages are
    /// never deleted.
    pub async fn purge_delivered(&self, older_than: Duration) -> Result<u64, Error> {
        let sql = format!(
            "DELETE FROM {} WHERE status = {DELIVERED} \
             AND delivered_at < now() - $1 * interval '1 millisecond'",
            self.records()
        );
        let done = sqlx::query(&sql)
            .bind(older_than.as_millis().min(i64::MAX as u128) as i64)
            .execute(self.pool())
            .await
            .map_err(|e| pg_error("outbox.purge", e))?;
        Ok(done.rows_affected())
    }

    /// Reads [`Outbox::stats`] and, with the feature `metrics`, sets the gauges
    /// `idem_outbox_pending`, `idem_outbox_dead` and `idem_outbox_oldest_pending_seconds`
    /// (label `table`) from it. A running [`Relay`](super::Relay) does this itself every
    /// [`RelayOptions::metrics_every`](super::RelayOptions::metrics_every); call it from your
    /// own scheduler when no relay runs in the process that exports metrics.
    pub async fn report_metrics(&self) -> Result<OutboxStats, Error> {
        let stats = self.stats().await?;
        crate::observe::outbox_gauges(
            self.table(),
            stats.pending,
            stats.dead,
            stats.oldest_pending,
        );
        Ok(stats)
    }
}

/// The outbox table is missing: which migration creates it.
fn missing(t: &Table) -> Error {
    Error::store_kind(
        Backend::Postgres,
        "outbox.connect",
        StoreErrorKind::SchemaMissing,
        format!(
            "the PostgreSQL database has no outbox table {}: it is created by outbox migration \
             1 (\"outbox messages\"), which `Outbox::migrate()` runs (or `idem outbox migrate`; \
             the SQL: `Outbox::migrations(\"{}\")`)",
            t.display, t.display
        ),
    )
}
