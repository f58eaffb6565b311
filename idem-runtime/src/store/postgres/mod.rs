//! The PostgreSQL store (feature `postgres`): one statement — one round trip — per protocol step.
//!
//! | step | statement |
//! |---|---|
//! | `claim` | `WITH live AS (SELECT <live row>), ins AS (INSERT … WHERE NOT EXISTS (live) ON CONFLICT (key) DO UPDATE … WHERE <existing not live> RETURNING token) SELECT <claimed> FROM ins UNION ALL SELECT <live row> FROM live` |
//! | `complete` | `UPDATE … SET status = 1, value, expires_at WHERE key AND token AND status = 0 AND expires_at > now RETURNING <notify if waiters>` |
//! | `release` | `UPDATE … SET expires_at = now WHERE key AND token AND status = 0 AND expires_at > now RETURNING <notify if waiters>` (the row ends and keeps its token) |
//! | `mark_waiting` | `UPDATE … SET waiters WHERE key AND status = 0 AND NOT waiters AND live` + a read (waiters only) |
//! | `renew` | `UPDATE … SET expires_at WHERE key AND token AND status = 0 AND expires_at > now` |
//! | `get` | `SELECT … WHERE key AND expires_at > now` |
//! | `purge_expired` | `DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … WHERE expires_at < now ORDER BY expires_at LIMIT n FOR UPDATE SKIP LOCKED))` |
//! | `force_release` | `WITH old AS (SELECT <live row> FOR UPDATE), ended AS (UPDATE … SET expires_at = now) SELECT old` |
//!
//! Every time is the server's: `statement_timestamp()` in milliseconds since the epoch, one
//! instant per statement, never the client's clock, so instances with skewed clocks agree. Keys and
//! fingerprints are `bytea` digests, tokens `bigint`.
//!
//! **The claim** reads the key's live row from the statement's snapshot first. If there is one,
//! it is the answer and nothing is written (a replay is a pure read: no row lock, no WAL); it
//! was live at the snapshot, a moment inside the statement's execution, so the answer is
//! linearizable. If there is none, the upsert runs.
//!
//! **The READ COMMITTED caveat.** `INSERT … ON CONFLICT DO UPDATE` always sees the latest
//! committed version of a conflicting row (it waits for an uncommitted one), but the `SELECT`s
//! of the statement read its snapshot. When the conflicting row was committed after that
//! snapshot and is live, the upsert does nothing and the snapshot shows no live row either. The
//! claim detects "neither claimed nor found" and runs the statement again with a new snapshot,
//! at most [`CLAIM_ATTEMPTS`] times.
//!
//! Waiting (`Store::changed`) uses `LISTEN`/`NOTIFY`: a waiter marks the row it waits for
//! (`waiters`), `complete` and `release` of a marked row notify on a channel of the table inside
//! the same statement, and one shared listener connection per store wakes the waiters of that
//! key. Unmarked rows, nearly all of them, complete without a NOTIFY: a NOTIFY takes a
//! cluster-wide lock at commit, which serializes every committing call that sends one.
//!
//! The transactional mode (`Call::in_transaction`, `#[idempotent(transaction = tx)]`) runs the
//! same statements on the caller's own connection (`tx.rs`), as the engine's transactional executor.

mod inspect;
mod listen;
mod options;
mod resume;
pub(crate) mod schema;
mod statements;
pub(crate) mod tx;

pub use options::PostgresOptions;
pub use schema::SCHEMA_VERSION;
pub use sqlx;

use super::{
    millis, Backend, BoxFuture, Claim, ClaimOutcome, Complete, Migrated, Migration, Record,
    ReleaseFeed, ReleaseHub, Resolve, Resolved, SchemaVersion, Status, Store, Takeover,
};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use listen::Notifier;
use schema::Table;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{ConnectOptions, Connection, Row};
use statements::Sql;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const BACKEND: Backend = Backend::Postgres;
/// How many times a claim runs its statement when a concurrent commit hid the row from its
/// snapshot (see the module docs).
pub const CLAIM_ATTEMPTS: usize = 5;
/// Durations are clamped to this many milliseconds (about 31,000 years), so `now + ttl` never
/// overflows a `bigint`.
const MAX_MS: i64 = 1_000_000_000_000_000;
/// The server's clock in milliseconds since the Unix epoch: the time the statement started, so
/// every use inside one statement reads the same instant. `date_part` is floating point: the
/// `numeric` arithmetic of `extract` made the claim statement a third slower when it was
/// evaluated at each use (measured with pgbench at 16 and 64 connections).
const CLOCK: &str = "(date_part('epoch', statement_timestamp()) * 1000)::bigint";

pub(crate) fn ms(d: Duration) -> i64 {
    millis(d).min(MAX_MS)
}

struct Inner {
    pool: PgPool,
    table: Table,
    sql: Sql,
    notifier: Option<Arc<Notifier>>,
    /// The listener for other instances' releases (`Store::releases`), with `notify` on.
    releases: Option<Arc<ReleaseHub>>,
    migrate_on_open: bool,
    complete_retry: Duration,
}

/// The PostgreSQL store behind `Idem::postgres`. Cheap to clone (clones share one pool).
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table.display)
            .finish_non_exhaustive()
    }
}

/// A `sqlx` failure as an `idem::Error` of the postgres store, with its kind.
pub(crate) fn pg_error(op: &'static str, e: sqlx::Error) -> Error {
    let kind = kind_of(&e);
    match e {
        sqlx::Error::PoolTimedOut => Error::store_kind(
            BACKEND,
            op,
            kind,
            "timed out waiting for a connection: the PostgreSQL server is down or unreachable, \
             or every connection of the pool is busy (see `acquire_timeout`, `max_connections`)",
        ),
        e => Error::store_kind(BACKEND, op, kind, e),
    }
}

/// What a `sqlx` failure means, by its class or its SQLSTATE.
fn kind_of(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unreachable,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Database(db) => match db.code().as_deref().unwrap_or_default() {
            "28P01" | "28000" => StoreErrorKind::Authentication,
            "42501" => StoreErrorKind::Permission,
            "42P01" | "3F000" => StoreErrorKind::SchemaMissing,
            "3D000" => StoreErrorKind::DatabaseMissing,
            "25006" => StoreErrorKind::ReadOnly,
            "57014" => StoreErrorKind::Timeout,
            "40001" | "40P01" | "55P03" => StoreErrorKind::Busy,
            c if c.starts_with("08") || c.starts_with("57P") => StoreErrorKind::Unreachable,
            c if c.starts_with("53") => StoreErrorKind::Capacity,
            _ => StoreErrorKind::Query,
        },
        _ => StoreErrorKind::Query,
    }
}

/// True when `e` means the connection (not the statement) failed: the step may be retried on
/// another connection.
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        _ => false,
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

/// Decodes a record from columns `at..at + 10` (name, fingerprint, token, status, value,
/// created_at, expires_at, attempt, keep_until, now).
pub(crate) fn record_from(
    op: &'static str,
    key: &Digest,
    row: &PgRow,
    at: usize,
) -> Result<Record, Error> {
    let get_err = |e: sqlx::Error| pg_error(op, e);
    let status: i16 = row.try_get(at + 3).map_err(get_err)?;
    let status = Status::from_column(status).ok_or_else(|| {
        corrupt(
            op,
            format!(
                "the record of key {key} has status {status}, which this version of idem does \
                 not know: it was written by a newer schema version; upgrade idem"
            ),
        )
    })?;
    let token: i64 = row.try_get(at + 2).map_err(get_err)?;
    let attempt: i32 = row.try_get(at + 7).map_err(get_err)?;
    Ok(Record {
        name: row.try_get(at).map_err(get_err)?,
        key: *key,
        fingerprint: digest_of(op, "fingerprint", row.try_get(at + 1).map_err(get_err)?)?,
        token: token as u64,
        status,
        value: row.try_get(at + 4).map_err(get_err)?,
        created_at: row.try_get(at + 5).map_err(get_err)?,
        expires_at: row.try_get(at + 6).map_err(get_err)?,
        attempt: attempt_of(op, key, attempt)?,
        keep_until: row.try_get(at + 8).map_err(get_err)?,
        now: row.try_get(at + 9).map_err(get_err)?,
    })
}

/// An attempt number from its column: never below 1.
fn attempt_of(op: &'static str, key: &Digest, attempt: i32) -> Result<u32, Error> {
    u32::try_from(attempt)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| corrupt(op, format!("the record of key {key} has attempt {attempt}")))
}

/// Runs the claim statement once on `conn` (a pool, or the caller's transaction). `None`:
/// neither claimed nor found, because a concurrent commit hid the row from the statement's
/// snapshot; run it again.
pub(crate) async fn claim_once<'e, E>(
    sql: &str,
    conn: E,
    claim: Claim<'_>,
) -> Result<Option<ClaimOutcome>, Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    let row = sqlx::query(sql)
        .bind(&claim.key.0[..])
        .bind(claim.name)
        .bind(&claim.fingerprint.0[..])
        .bind(ms(claim.lease))
        .bind(ms(claim.lease.max(claim.ttl)))
        .fetch_optional(conn)
        .await
        .map_err(|e| pg_error("claim", e))?;
    let Some(row) = row else { return Ok(None) };
    let claimed: bool = row.try_get(0).map_err(|e| pg_error("claim", e))?;
    if claimed {
        let get = |e| pg_error("claim", e);
        let token: i64 = row.try_get(3).map_err(get)?;
        let attempt = attempt_of("claim", claim.key, row.try_get(8).map_err(get)?)?;
        let abandoned_at: Option<i64> = row.try_get(6).map_err(get)?;
        let takeover = match abandoned_at {
            Some(abandoned_at) if attempt > 1 => Some(Takeover {
                attempt,
                abandoned_at,
            }),
            _ => None,
        };
        return Ok(Some(ClaimOutcome::Claimed {
            token: token as u64,
            takeover,
        }));
    }
    Ok(Some(ClaimOutcome::Existing(record_from(
        "claim", claim.key, &row, 1,
    )?)))
}

/// Opens one connection (for the schema check, before any pool): a server that is down fails
/// here at once with what the connection said, not after the pool's acquire timeout.
pub(crate) async fn connect_one(
    connect: &PgConnectOptions,
    timeout: Duration,
) -> Result<sqlx::PgConnection, Error> {
    tokio::time::timeout(timeout, connect.connect())
        .await
        .map_err(|_| {
            Error::store_kind(
                BACKEND,
                "open",
                StoreErrorKind::Unreachable,
                format!("no answer from the PostgreSQL server within {timeout:?}"),
            )
        })?
        .map_err(|e| pg_error("open", e))
}

/// The error of a claim that found its row hidden [`CLAIM_ATTEMPTS`] times in a row.
pub(crate) fn claim_exhausted(key: &Digest) -> Error {
    Error::store_kind(
        BACKEND,
        "claim",
        StoreErrorKind::Busy,
        format!(
            "the key {key} changed under {CLAIM_ATTEMPTS} claims in a row (each saw a row \
             committed after its snapshot); try again"
        ),
    )
}

impl PostgresStore {
    /// Opens a store on `url` (`postgres://user:password@host:port/database?…`) with the
    /// default options, creating or upgrading the schema.
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        PostgresOptions::from_url(url)?.connect().await
    }

    /// Opens a store on `url` with the default options.
    #[deprecated(since = "0.2.0", note = "use `PostgresStore::connect`")]
    pub async fn open(url: &str) -> Result<PostgresStore, Error> {
        Self::connect(url).await
    }

    /// Opens a store on `url` with `options` (whose own server, if any, is replaced by `url`).
    #[deprecated(
        since = "0.2.0",
        note = "use `PostgresOptions::from_url(url)?` with the settings, then `.connect()`"
    )]
    pub async fn open_with(url: &str, options: PostgresOptions) -> Result<PostgresStore, Error> {
        let connect = PostgresOptions::from_url(url)?.connect;
        PostgresOptions { connect, ..options }.connect().await
    }

    /// A store on the caller's pool (its settings are the caller's; the server and pool
    /// options of `options` are ignored). The schema is created or upgraded as `options` says.
    pub async fn from_pool(pool: PgPool, options: PostgresOptions) -> Result<PostgresStore, Error> {
        let table = Table::parse(&options.table)?;
        let mut conn = pool.acquire().await.map_err(|e| pg_error("open", e))?;
        schema::ensure(&mut conn, &table, options.migrate_on_open, SCHEMA_VERSION).await?;
        drop(conn);
        Ok(Self::assemble(pool, table, &options))
    }

    fn assemble(pool: PgPool, table: Table, options: &PostgresOptions) -> PostgresStore {
        let notifier = options.notify.then(|| {
            let connect = (*pool.connect_options()).clone();
            Arc::new(Notifier::new(connect, table.channel.clone()))
        });
        let releases = options.notify.then(|| {
            let connect = (*pool.connect_options()).clone();
            let channel = table.released_channel.clone();
            Arc::new(ReleaseHub::new(move |announce| {
                listen::announce_releases(connect.clone(), channel.clone(), announce)
            }))
        });
        PostgresStore {
            inner: Arc::new(Inner {
                sql: Sql::new(&table, options.notify),
                pool,
                table,
                notifier,
                releases,
                migrate_on_open: options.migrate_on_open,
                complete_retry: options.complete_retry,
            }),
        }
    }

    /// Creates or upgrades the schema to [`SCHEMA_VERSION`], for deployments that manage DDL
    /// themselves (open with `migrate_on_open(false)`, run this from a privileged role).
    /// Concurrent calls are serialized by an advisory lock. Says what it found.
    pub async fn migrate(&self) -> Result<Migrated, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| pg_error("migrate", e))?;
        let from = schema::ensure(&mut conn, &self.inner.table, true, SCHEMA_VERSION).await?;
        Ok(Migrated::new(
            BACKEND,
            from,
            SCHEMA_VERSION,
            format!("table {}", self.inner.table.display),
        ))
    }

    /// Applies the migrations up to `version` only (for tests of upgrades).
    #[cfg(feature = "testkit")]
    pub async fn migrate_to(
        pool: &PgPool,
        table: &str,
        version: SchemaVersion,
    ) -> Result<SchemaVersion, Error> {
        let table = Table::parse(table)?;
        let mut conn = pool.acquire().await.map_err(|e| pg_error("migrate", e))?;
        schema::ensure(&mut conn, &table, true, version).await
    }

    /// The migrations of `table`, as SQL a DBA can review and run (each with its version; the
    /// version table `<table>_migrations (version, description, applied_at)` records them).
    pub fn migrations(table: &str) -> Result<Vec<Migration>, Error> {
        Ok(schema::migrations(&Table::parse(table)?))
    }

    /// The schema version recorded in the database (0 when there is none).
    pub async fn schema_version(&self) -> Result<SchemaVersion, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| pg_error("migrate", e))?;
        schema::current_version(&mut conn, &self.inner.table).await
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
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

    /// The SQL text of a step (`"claim"`, `"complete"`, `"release"`, `"renew"`, `"get"`,
    /// `"purge"`), for benchmarks that run the same statements through raw sqlx.
    #[cfg(feature = "testkit")]
    pub fn statement_text(&self, step: &str) -> Option<&str> {
        let sql = &self.inner.sql;
        Some(match step {
            "claim" => &sql.claim,
            "complete" => &sql.complete,
            "release" => &sql.release,
            "renew" => &sql.renew,
            "get" => &sql.get,
            "purge" => &sql.purge,
            _ => return None,
        })
    }

    pub(crate) fn sql_claim(&self) -> &str {
        &self.inner.sql.claim
    }

    /// The completion of the transactional mode, where the row lock is the lease.
    pub(crate) fn sql_complete_locked(&self) -> &str {
        &self.inner.sql.complete_locked
    }

    /// The release of the transactional mode, where the row lock is the lease.
    pub(crate) fn sql_release_locked(&self) -> &str {
        &self.inner.sql.release_locked
    }

    pub(crate) fn channel(&self) -> &str {
        &self.inner.table.channel
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
                Err(e) if is_connection_error(&e) && Instant::now() < deadline => {
                    tracing::warn!(key = %done.key, token = done.token, attempt, error = %e,
                        "idem: completion failed on a lost connection; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    attempt += 1;
                }
                Err(e) => return Err(pg_error("complete", e)),
            }
        }
    }

    async fn complete_once(
        &self,
        sql: &str,
        done: Complete<'_>,
        conn: Option<&mut sqlx::PgConnection>,
    ) -> Result<bool, sqlx::Error> {
        let q = sqlx::query(sql)
            .bind(&done.key.0[..])
            .bind(done.token as i64)
            .bind(done.value)
            .bind(ms(done.ttl))
            .bind(self.channel())
            .bind(ms(done.tombstone));
        let row = match conn {
            Some(c) => q.fetch_optional(c).await?,
            None => q.fetch_optional(&self.inner.pool).await?,
        };
        Ok(row.is_some())
    }

    /// One fenced statement without a result (`$1` key, `$2` token): park, abandon.
    async fn fenced(
        &self,
        sql: &str,
        op: &'static str,
        key: &Digest,
        token: u64,
    ) -> Result<bool, Error> {
        let done = sqlx::query(sql)
            .bind(&key.0[..])
            .bind(token as i64)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| pg_error(op, e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_now(&self, key: &Digest, token: u64) -> Result<bool, Error> {
        let run = || {
            sqlx::query(&self.inner.sql.release)
                .bind(&key.0[..])
                .bind(token as i64)
                .bind(self.channel())
                .fetch_optional(&self.inner.pool)
        };
        let row = match run().await {
            // Once more on another connection: a release is safe to repeat.
            Err(e) if is_connection_error(&e) => run().await,
            other => other,
        };
        Ok(row.map_err(|e| pg_error("release", e))?.is_some())
    }
}

impl Store for PostgresStore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn in_transaction<'a>(
        &'a self,
        conn: crate::store::Connection<'a>,
    ) -> Option<Box<dyn crate::store::Executor + 'a>> {
        match conn {
            crate::store::Connection::Postgres(conn) => {
                Some(Box::new(tx::OnConnection { store: self, conn }))
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            for _ in 0..CLAIM_ATTEMPTS {
                if let Some(out) =
                    claim_once(&self.inner.sql.claim, &self.inner.pool, claim).await?
                {
                    if matches!(out, ClaimOutcome::Claimed { .. }) {
                        // The body runs next, on this worker. Woken by the claim's I/O, this
                        // task sits in the worker's LIFO slot, which other workers cannot
                        // steal: a body that blocks its thread would then also stop the
                        // runtime's I/O and timer driver (other callers' sleeps and leases).
                        // One yield moves it to the stealable queue. No round trip.
                        tokio::task::yield_now().await;
                    }
                    return Ok(out);
                }
            }
            Err(claim_exhausted(claim.key))
        })
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
            let done = sqlx::query(&self.inner.sql.renew)
                .bind(&key.0[..])
                .bind(token as i64)
                .bind(ms(lease))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| pg_error("renew", e))?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.inner.sql.get)
                .bind(&key.0[..])
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| pg_error("get", e))?;
            row.map(|row| record_from("get", key, &row, 0)).transpose()
        })
    }

    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            sqlx::query(&self.inner.sql.strip)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| pg_error("purge_expired", e))?;
            let done = sqlx::query(&self.inner.sql.purge)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .execute(&self.inner.pool)
                .await
                .map_err(|e| pg_error("purge_expired", e))?;
            Ok(done.rows_affected())
        })
    }

    fn changed<'a>(&'a self, key: &'a Digest, timeout: Duration) -> BoxFuture<'a, ()> {
        let Some(n) = &self.inner.notifier else {
            return Box::pin(tokio::time::sleep(timeout.min(Duration::from_millis(25))));
        };
        // Subscribed before the mark is written, so a completion that sees the mark cannot
        // notify before this waiter listens.
        let woken = n.changed(key, timeout);
        Box::pin(async move {
            let marked = sqlx::query_scalar::<_, bool>(&self.inner.sql.mark_waiting)
                .bind(&key.0[..])
                .fetch_one(&self.inner.pool)
                .await;
            match marked {
                // No longer in progress: the caller reads the record now.
                Ok(false) => {}
                Ok(true) => woken.await,
                // The caller's next read reports a store that fails; wait out the interval
                // so that a server that is down is not asked in a tight loop.
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "idem: marking a waiter failed");
                    woken.await
                }
            }
        })
    }

    fn releases(&self) -> Option<ReleaseFeed> {
        self.inner.releases.as_ref().map(ReleaseHub::subscribe)
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
        Box::pin(async move {
            let (applied, value, ttl) = match resolution {
                Resolve::Applied { value, ttl } => (true, Some(value), ms(ttl)),
                Resolve::NotApplied => (false, None, 0),
            };
            let row = sqlx::query(&self.inner.sql.resolve)
                .bind(&key.0[..])
                .bind(applied)
                .bind(value)
                .bind(ttl)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| pg_error("resolve", e))?;
            let Some(row) = row else {
                return Ok(Resolved::NotParked(None));
            };
            let record = record_from("resolve", key, &row, 0)?;
            let done: bool = row.try_get(10).map_err(|e| pg_error("resolve", e))?;
            Ok(if done {
                Resolved::Done(record)
            } else {
                Resolved::NotParked(Some(record))
            })
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.inner.sql.force_release)
                .bind(&key.0[..])
                .bind(self.channel())
                .bind(&self.inner.table.released_channel)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| pg_error("force_release", e))?;
            row.map(|row| record_from("force_release", key, &row, 0))
                .transpose()
        })
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
