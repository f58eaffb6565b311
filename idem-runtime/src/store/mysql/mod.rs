//! The MySQL / MariaDB store (feature `mysql`): MySQL 8 and MariaDB 10.6+, on InnoDB.
//!
//! | step | statements (autocommit) |
//! |---|---|
//! | `claim` | `INSERT … ON DUPLICATE KEY UPDATE <each column: IF(lapsed, new, old)>`; the outcome in the OK packet's insert id (`LAST_INSERT_ID(token)` or `LAST_INSERT_ID(0)`); when a live row was left alone, `SELECT` it |
//! | `complete` | `UPDATE … SET status = 1, value, expires_at WHERE key AND token AND status = 0 AND expires_at > now` |
//! | `release` | `UPDATE … SET expires_at = now WHERE key AND token AND status = 0 AND expires_at > now` (the row ends and keeps its token) |
//! | `renew` | `UPDATE … SET expires_at WHERE key AND token AND status = 0 AND expires_at > now` |
//! | `get` | `SELECT … WHERE key AND expires_at > now` |
//! | `purge_expired` | `DELETE … WHERE expires_at < now ORDER BY expires_at LIMIT n` |
//! | `force_release` | `SELECT … WHERE key AND expires_at > now FOR UPDATE`, then `UPDATE … SET expires_at = now`, one transaction |
//!
//! A fresh call's claim and a takeover of a lapsed record are one round trip; a duplicate of a
//! live record is two (the upsert that leaves it alone, then the read of it). See
//! docs/mysql.md for why the claim cannot run a body twice under any interleaving.
//!
//! **The claim's read** runs after the upsert, as a statement of its own: the row may have
//! changed in between (completed, released, taken over). A live row read then is the answer —
//! nothing was written, and it was live at that moment. A row that is gone or lapsed sends the
//! claim round again, at most [`CLAIM_ATTEMPTS`] times.
//!
//! **Lock conflicts.** InnoDB deadlocks on concurrent inserts into one unique key are part of
//! its design; every statement here is retried on them, boundedly (see `locks.rs`).
//!
//! Every time is the server's (`UTC_TIMESTAMP(3)` in milliseconds since the epoch, one instant
//! per statement), never the client's clock. Keys and fingerprints are `BINARY(32)` digests,
//! tokens `BIGINT`. MySQL has no notifications: waiting duplicates poll.

mod error;
mod inspect;
mod locks;
mod options;
mod resume;
pub(crate) mod schema;
mod statements;
pub(crate) mod tx;

pub use options::{MysqlOptions, DEFAULT_TABLE};
pub use schema::{Migration, SCHEMA_VERSION};

use super::{
    millis, Backend, BoxFuture, Claim, ClaimOutcome, Complete, Migrated, Record, Resolve, Resolved,
    Status, Store, Takeover,
};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
pub(crate) use error::{error_number, is_connection_error, my_error};
use locks::retrying;
use schema::Table;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::{ConnectOptions, Connection, Row};
use statements::Sql;
// The outbox's MySQL dialect (built with `outbox` and `mysql` too) reads the same clock as the
// store's statements.
#[cfg(any(feature = "outbox", feature = "outbox-mysql"))]
pub(crate) use statements::CLOCK;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const BACKEND: Backend = Backend::Mysql;
/// How many times a claim runs when the live row it found was gone by the time it read it.
pub const CLAIM_ATTEMPTS: usize = 5;
/// Durations are clamped to this many milliseconds (about 31,000 years), so `now + ttl` never
/// overflows a `BIGINT`.
const MAX_MS: i64 = 1_000_000_000_000_000;

fn ms(d: Duration) -> i64 {
    millis(d).min(MAX_MS)
}

struct Inner {
    pool: MySqlPool,
    table: Table,
    sql: Sql,
    migrate_on_open: bool,
    complete_retry: Duration,
}

/// The MySQL / MariaDB store behind [`crate::Idem::mysql`]. Cheap to clone (clones share one
/// pool).
#[derive(Clone)]
pub struct MysqlStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("table", &self.inner.table.display)
            .finish_non_exhaustive()
    }
}

fn corrupt(op: &'static str, what: String) -> Error {
    Error::store_kind(BACKEND, op, StoreErrorKind::Corrupt, what)
}

fn digest_of(op: &'static str, what: &str, bytes: Vec<u8>) -> Result<Digest, Error> {
    <[u8; 32]>::try_from(bytes.as_slice())
        .map(Digest)
        .map_err(|_| {
            corrupt(
                op,
                format!("stored {what} is {} bytes, not 32", bytes.len()),
            )
        })
}

/// Decodes a record from columns 0..10 (name, fingerprint, token, status, value, created_at,
/// expires_at, attempt, keep_until, now).
fn record_from(op: &'static str, key: &Digest, row: &MySqlRow) -> Result<Record, Error> {
    let get_err = |e: sqlx::Error| my_error(op, e);
    let status: i8 = row.try_get(3).map_err(get_err)?;
    let status = Status::from_column(status).ok_or_else(|| {
        corrupt(
            op,
            format!(
                "the record of key {key} has status {status}, which this version of idem does \
                 not know: it was written by a newer schema version; upgrade idem"
            ),
        )
    })?;
    // The name is read as bytes: sqlx refuses a `_bin` collated text column as a `String`.
    let name: Vec<u8> = row.try_get(0).map_err(get_err)?;
    let name = String::from_utf8(name)
        .map_err(|_| corrupt(op, format!("the name of key {key} is not UTF-8")))?;
    let token: i64 = row.try_get(2).map_err(get_err)?;
    let attempt: i32 = row.try_get(7).map_err(get_err)?;
    Ok(Record {
        name,
        key: *key,
        fingerprint: digest_of(op, "fingerprint", row.try_get(1).map_err(get_err)?)?,
        token: token as u64,
        status,
        value: row.try_get(4).map_err(get_err)?,
        created_at: row.try_get(5).map_err(get_err)?,
        expires_at: row.try_get(6).map_err(get_err)?,
        attempt: u32::try_from(attempt)
            .ok()
            .filter(|a| *a >= 1)
            .ok_or_else(|| corrupt(op, format!("the record of key {key} has attempt {attempt}")))?,
        keep_until: row.try_get(8).map_err(get_err)?,
        now: row.try_get(9).map_err(get_err)?,
    })
}

/// Runs the claim's upsert on `conn`: the new token (0 when a live row was left alone) and,
/// for a takeover of an abandoned attempt, what the statement left in the session.
pub(crate) async fn claim_on(
    sql: &str,
    conn: &mut sqlx::MySqlConnection,
    claim: Claim<'_>,
) -> Result<(u64, Option<Takeover>), sqlx::Error> {
    let keep = ms(claim.lease.max(claim.ttl));
    let done = sqlx::query(sql)
        .bind(&claim.key.0[..])
        .bind(claim.name)
        .bind(&claim.fingerprint.0[..])
        .bind(ms(claim.lease))
        .bind(keep)
        .bind(claim.name)
        .bind(&claim.fingerprint.0[..])
        .bind(keep)
        .bind(ms(claim.lease))
        .execute(&mut *conn)
        .await?;
    let id = done.last_insert_id();
    if id & statements::TAKEOVER_FLAG == 0 {
        return Ok((id, None));
    }
    let (attempt, abandoned_at): (i64, i64) =
        sqlx::query_as("SELECT CAST(@idem_attempt AS SIGNED), CAST(@idem_abandoned_at AS SIGNED)")
            .fetch_one(&mut *conn)
            .await?;
    let takeover = Takeover {
        attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        abandoned_at,
    };
    Ok((id & !statements::TAKEOVER_FLAG, Some(takeover)))
}

/// Opens one connection (for the schema check, before any pool): a server that is down fails
/// here at once with what the connection said, not after the pool's acquire timeout.
pub(crate) async fn connect_one(
    connect: &MySqlConnectOptions,
    timeout: Duration,
) -> Result<sqlx::MySqlConnection, Error> {
    tokio::time::timeout(timeout, connect.connect())
        .await
        .map_err(|_| {
            Error::store_kind(
                BACKEND,
                "open",
                StoreErrorKind::Unreachable,
                format!("no answer from the MySQL server within {timeout:?}"),
            )
        })?
        .map_err(|e| my_error("open", e))
}

/// What a migration of `table` from version `from` did.
fn migrated(table: &Table, from: i32) -> Migrated {
    Migrated::new(
        BACKEND,
        from,
        SCHEMA_VERSION,
        format!("table {}", table.display),
    )
}

/// The error of a claim that found its row gone [`CLAIM_ATTEMPTS`] times in a row.
fn claim_exhausted(key: &Digest) -> Error {
    Error::store_kind(
        BACKEND,
        "claim",
        StoreErrorKind::Busy,
        format!(
            "the key {key} changed under {CLAIM_ATTEMPTS} claims in a row (each found a live \
             record that was gone when it read it); try again"
        ),
    )
}

impl MysqlStore {
    /// Opens a store on `url` (`mysql://user:password@host:port/database?…`) with the default
    /// options, creating or upgrading the schema.
    pub async fn connect(url: &str) -> Result<MysqlStore, Error> {
        MysqlOptions::from_url(url)?.connect().await
    }

    /// A store on the caller's pool (its settings are the caller's; the pool options of
    /// `options` are ignored, and so is its server). The schema is created or upgraded as
    /// `options` says.
    pub async fn from_pool(pool: MySqlPool, options: MysqlOptions) -> Result<MysqlStore, Error> {
        let table = Table::parse(&options.table)?;
        let mut conn = pool.acquire().await.map_err(|e| my_error("open", e))?;
        schema::ensure(&mut conn, &table, options.migrate_on_open, SCHEMA_VERSION).await?;
        drop(conn);
        Ok(Self::assemble(pool, table, &options))
    }

    pub(super) fn assemble(pool: MySqlPool, table: Table, options: &MysqlOptions) -> MysqlStore {
        MysqlStore {
            inner: Arc::new(Inner {
                sql: Sql::new(&table),
                pool,
                table,
                migrate_on_open: options.migrate_on_open,
                complete_retry: options.complete_retry,
            }),
        }
    }

    /// Creates or upgrades the schema to [`SCHEMA_VERSION`], for deployments that manage DDL
    /// themselves. Concurrent calls are serialized by a named lock. Says what it found.
    pub async fn migrate(&self) -> Result<Migrated, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| my_error("migrate", e))?;
        let from = schema::ensure(&mut conn, &self.inner.table, true, SCHEMA_VERSION).await?;
        Ok(migrated(&self.inner.table, from))
    }

    /// The migrations of `table`, as SQL a DBA can review and run (each with its version; the
    /// version table `<table>_migrations (version, description, applied_at)` records them).
    pub fn migrations(table: &str) -> Result<Vec<Migration>, Error> {
        Ok(schema::migrations(&Table::parse(table)?))
    }

    /// The schema version recorded in the database (0 when there is none).
    pub async fn schema_version(&self) -> Result<i32, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| my_error("migrate", e))?;
        schema::current_version(&mut conn, &self.inner.table).await
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The table, as configured.
    pub fn table(&self) -> &str {
        &self.inner.table.display
    }

    /// Whether the schema is created or upgraded on open.
    pub fn migrates_on_open(&self) -> bool {
        self.inner.migrate_on_open
    }

    /// The SQL text of a step (`"claim"`, `"get"`, `"complete"`, `"release"`, `"renew"`,
    /// `"purge"`), for benchmarks that run the same statements through raw sqlx.
    #[cfg(feature = "testkit")]
    pub fn statement_text(&self, step: &str) -> Option<&str> {
        let sql = &self.inner.sql;
        Some(match step {
            "claim" => &sql.claim,
            "get" => &sql.get,
            "complete" => &sql.complete,
            "release" => &sql.release,
            "renew" => &sql.renew,
            "purge" => &sql.purge,
            _ => return None,
        })
    }

    async fn claim_now(&self, claim: Claim<'_>) -> Result<ClaimOutcome, Error> {
        let sql = &self.inner.sql;
        let pool = &self.inner.pool;
        for _ in 0..CLAIM_ATTEMPTS {
            let (token, takeover) = retrying(|| async {
                let mut conn = pool.acquire().await?;
                claim_on(&sql.claim, &mut conn, claim).await
            })
            .await
            .map_err(|e| my_error("claim", e))?;
            if token != 0 {
                // The body runs next, on this worker: one yield moves this task out of the
                // worker's LIFO slot, which other workers cannot steal, so a body that blocks
                // its thread does not also stop the runtime's I/O and timers.
                tokio::task::yield_now().await;
                return Ok(ClaimOutcome::Claimed { token, takeover });
            }
            let row = retrying(|| {
                sqlx::query(&sql.occupant)
                    .bind(&claim.key.0[..])
                    .fetch_optional(pool)
            })
            .await
            .map_err(|e| my_error("claim", e))?;
            if let Some(row) = row {
                return Ok(ClaimOutcome::Existing(record_from(
                    "claim", claim.key, &row,
                )?));
            }
        }
        Err(claim_exhausted(claim.key))
    }

    async fn complete_now(&self, done: Complete<'_>) -> Result<bool, Error> {
        let deadline = Instant::now() + self.inner.complete_retry;
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 0u32;
        loop {
            let res = if attempt == 0 {
                self.complete_once(&self.inner.sql.complete, done, None)
                    .await
            } else {
                // A fresh, tested connection: the pool may still hold others that died
                // with the one that failed.
                match self.inner.pool.acquire().await {
                    Ok(mut conn) => match conn.ping().await {
                        Ok(()) => {
                            self.complete_once(
                                &self.inner.sql.complete_again,
                                done,
                                Some(&mut conn),
                            )
                            .await
                        }
                        Err(e) => {
                            conn.close_on_drop();
                            Err(e)
                        }
                    },
                    Err(e) => Err(e),
                }
            };
            match res {
                Ok(done) => return Ok(done),
                Err(e)
                    if (is_connection_error(&e) || error::lock_conflict(&e).is_some())
                        && Instant::now() < deadline =>
                {
                    tracing::warn!(key = %done.key, token = done.token, attempt, error = %e,
                        "idem: completion failed on a lost connection; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    attempt += 1;
                }
                Err(e) => return Err(my_error("complete", e)),
            }
        }
    }

    async fn complete_once(
        &self,
        sql: &str,
        done: Complete<'_>,
        conn: Option<&mut sqlx::MySqlConnection>,
    ) -> Result<bool, sqlx::Error> {
        let query = || {
            sqlx::query(sql)
                .bind(done.value)
                .bind(ms(done.ttl))
                .bind(ms(done.tombstone))
                .bind(&done.key.0[..])
                .bind(done.token as i64)
        };
        let result = match conn {
            // On a fresh connection after a lost one; a lock conflict here goes round the
            // caller's loop.
            Some(c) => query().execute(c).await?,
            None => retrying(|| query().execute(&self.inner.pool)).await?,
        };
        Ok(result.rows_affected() == 1)
    }

    async fn release_now(&self, key: &Digest, token: u64) -> Result<bool, Error> {
        let run = || {
            retrying(|| {
                sqlx::query(&self.inner.sql.release)
                    .bind(&key.0[..])
                    .bind(token as i64)
                    .execute(&self.inner.pool)
            })
        };
        let done = match run().await {
            // Once more on another connection: a release is safe to repeat.
            Err(e) if is_connection_error(&e) => run().await,
            other => other,
        };
        Ok(done.map_err(|e| my_error("release", e))?.rows_affected() == 1)
    }

    /// One fenced statement (`key`, `token`): park, abandon.
    async fn fenced(
        &self,
        sql: &str,
        op: &'static str,
        key: &Digest,
        token: u64,
    ) -> Result<bool, Error> {
        let done = retrying(|| {
            sqlx::query(sql)
                .bind(&key.0[..])
                .bind(token as i64)
                .execute(&self.inner.pool)
        })
        .await
        .map_err(|e| my_error(op, e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn resolve_now(&self, key: &Digest, resolution: Resolve<'_>) -> Result<Resolved, Error> {
        let (status, value, ttl) = match resolution {
            Resolve::Applied { value, ttl } => (Status::Completed, Some(value), ms(ttl)),
            Resolve::NotApplied => (Status::Released, None, 0),
        };
        let row = retrying(|| async {
            let mut tx = self.inner.pool.begin().await?;
            let row = sqlx::query(&self.inner.sql.resolve_select)
                .bind(&key.0[..])
                .fetch_optional(&mut *tx)
                .await?;
            let mut done = false;
            if row.is_some() {
                done = sqlx::query(&self.inner.sql.resolve)
                    .bind(status.as_i16())
                    .bind(value)
                    .bind(ttl)
                    .bind(&key.0[..])
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                    == 1;
            }
            tx.commit().await?;
            Ok((row, done))
        })
        .await
        .map_err(|e| my_error("resolve", e))?;
        let (row, done) = row;
        let record = row
            .map(|row| record_from("resolve", key, &row))
            .transpose()?;
        Ok(match record {
            Some(r) if done => Resolved::Done(r),
            other => Resolved::NotParked(other),
        })
    }

    async fn force_release_now(&self, key: &Digest) -> Result<Option<Record>, Error> {
        let err = |e| my_error("force_release", e);
        retrying(|| async {
            let mut tx = self.inner.pool.begin().await?;
            let row = sqlx::query(&self.inner.sql.force_select)
                .bind(&key.0[..])
                .fetch_optional(&mut *tx)
                .await?;
            if row.is_some() {
                sqlx::query(&self.inner.sql.end)
                    .bind(&key.0[..])
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(row)
        })
        .await
        .map_err(err)?
        .map(|row| record_from("force_release", key, &row))
        .transpose()
    }
}

impl Store for MysqlStore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn in_transaction<'a>(
        &'a self,
        conn: crate::store::Connection<'a>,
    ) -> Option<Box<dyn crate::store::Executor + 'a>> {
        match conn {
            crate::store::Connection::MySql(conn) => {
                Some(Box::new(tx::OnConnection { store: self, conn }))
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.claim_now(claim))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.complete_now(done))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.release_now(key, token))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = retrying(|| {
                sqlx::query(&self.inner.sql.renew)
                    .bind(ms(lease))
                    .bind(&key.0[..])
                    .bind(token as i64)
                    .execute(&self.inner.pool)
            })
            .await
            .map_err(|e| my_error("renew", e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.inner.sql.get)
                .bind(&key.0[..])
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| my_error("get", e))?;
            row.map(|row| record_from("get", key, &row)).transpose()
        })
    }

    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            retrying(|| {
                sqlx::query(&self.inner.sql.strip)
                    .bind(limit)
                    .execute(&self.inner.pool)
            })
            .await
            .map_err(|e| my_error("purge_expired", e))?;
            let done = retrying(|| {
                sqlx::query(&self.inner.sql.purge)
                    .bind(limit)
                    .execute(&self.inner.pool)
            })
            .await
            .map_err(|e| my_error("purge_expired", e))?;
            Ok(done.rows_affected())
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.force_release_now(key))
    }

    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.fenced(&self.inner.sql.park, "park", key, token))
    }

    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.fenced(&self.inner.sql.abandon, "abandon", key, token))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        Box::pin(self.resolve_now(key, resolution))
    }
    fn keep_args<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.keep_args_now(key, token, args))
    }

    fn abandoned_calls<'a>(
        &'a self,
        names: &'a [&'a str],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(self.abandoned_now(names, limit))
    }
}
