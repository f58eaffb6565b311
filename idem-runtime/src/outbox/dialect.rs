//! What differs between the databases an outbox lives on: the SQL of each step, behind one
//! trait, so that [`Outbox`](super::Outbox) and the relay's loop are written once. PostgreSQL's
//! is in `postgres.rs`, MySQL's in `mysql.rs`.

use super::listing::ListFilter;
use super::{Delivery, Enqueued, Message, MessageInfo, OutboxStats};
use crate::error::Error;
use crate::store::{BoxFuture, Migration, SchemaVersion};
use sqlx::{Database, Pool};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A database an [`Outbox`](super::Outbox) can live on: PostgreSQL (`sqlx::Postgres`, feature
/// `outbox`) or MySQL / MariaDB (`sqlx::MySql`, feature `outbox-mysql`, or `outbox` with
/// `mysql`). Implemented by idem for those two only.
pub trait OutboxDatabase: Database {
    /// The statements of this database.
    #[doc(hidden)]
    type __Dialect: Dialect<Db = Self>;
}

/// The table of one outbox on one database, and its statements. Every method is one step of
/// the outbox; none holds state beyond the table's names and prepared SQL text.
pub trait Dialect: std::fmt::Debug + Send + Sync + Sized + 'static {
    /// The database.
    type Db: Database;
    /// Validates the table name (`Error::Config` for anything but a plain identifier).
    fn parse(table: &str) -> Result<Self, Error>;
    /// The table's name as given.
    fn display(&self) -> &str;
    /// A `sqlx` failure of step `op` as an `idem::Error` of this backend, with its kind.
    fn error(op: &'static str, e: sqlx::Error) -> Error;
    /// Every migration of the table, in order.
    fn migrations(&self) -> Vec<Migration>;
    /// Checks the table's schema and, when `apply`, creates or upgrades it; returns the version
    /// found before. Without `apply`, a missing table is `SchemaMissing`.
    fn ensure<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
        apply: bool,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>>;
    /// The table's schema version (0: none).
    fn schema_version<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>>;
    /// Inserts `message` with `id` (`None`: the database makes one) on a transaction's
    /// connection, unless a message with this id is there.
    fn enqueue<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
        id: Option<String>,
        message: &'a Message,
        headers: String,
    ) -> BoxFuture<'a, Result<Enqueued, Error>>;
    /// The counts of [`OutboxStats`].
    fn stats<'a>(&'a self, pool: &'a Pool<Self::Db>) -> BoxFuture<'a, Result<OutboxStats, Error>>;
    /// Dead letters (one, or all) back to pending.
    fn retry_dead<'a>(
        &'a self,
        pool: &'a Pool<Self::Db>,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, Error>>;
    /// The messages `filter` selects, oldest first.
    fn list<'a>(
        &'a self,
        pool: &'a Pool<Self::Db>,
        filter: &'a ListFilter,
    ) -> BoxFuture<'a, Result<Vec<MessageInfo>, Error>>;
    /// The status code of message `id`.
    fn status_of<'a>(
        &'a self,
        pool: &'a Pool<Self::Db>,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<i16>, Error>>;
    /// Deletes the messages delivered more than `older_than` ago.
    fn purge_delivered<'a>(
        &'a self,
        pool: &'a Pool<Self::Db>,
        older_than: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>>;
    /// How long until the earliest pending message falls due (`None`: nothing pending).
    fn next_due<'a>(
        &'a self,
        pool: &'a Pool<Self::Db>,
    ) -> BoxFuture<'a, Result<Option<Duration>, Error>>;
    /// Runs on a relay's connection before its round's `BEGIN` (MySQL: the isolation level).
    fn before_round<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// Locks the due head of up to `batch` ordering keys, skipping locked rows, in the round's
    /// transaction.
    fn heads<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
        batch: i64,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, Error>>;
    /// Marks message `id` delivered, in the round's transaction.
    fn delivered<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// Counts a failed attempt of message `id`: its error, dead or due again after `wait`.
    fn failed<'a>(
        &'a self,
        conn: &'a mut <Self::Db as Database>::Connection,
        id: &'a str,
        error: String,
        dead: bool,
        wait: Duration,
    ) -> BoxFuture<'a, Result<(), Error>>;
    /// A task that wakes the relay when a message is committed (PostgreSQL's `LISTEN`), or
    /// `None` when the database cannot tell (MySQL: the relay polls).
    fn listen(&self, pool: Pool<Self::Db>, wake: Arc<Notify>) -> Option<BoxFuture<'static, ()>>;
}

/// Milliseconds of `d` for a `BIGINT` parameter.
pub(super) fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}
