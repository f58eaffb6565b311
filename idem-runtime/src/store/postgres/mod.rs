//! The PostgreSQL store (feature `postgres`): one statement — one round trip — per protocol step.
//!
//! | step | statement |
//! |---|---|
//! | `claim` | `WITH live AS (SELECT <live row>), ins AS (INSERT … WHERE NOT EXISTS (live) ON CONFLICT (key) DO UPDATE … WHERE <existing not live> RETURNING token) SELECT <claimed> FROM ins UNION ALL SELECT <live row> FROM live` |
//! | `complete` | `UPDATE … SET status = 1, value, expires_at WHERE key AND token AND status = 0 RETURNING <notify if waiters>` |
//! | `release` | `DELETE … WHERE key AND token AND status = 0 RETURNING <notify if waiters>` |
//! | `mark_waiting` | `UPDATE … SET waiters WHERE key AND status = 0 AND NOT waiters AND live` + a read (waiters only) |
//! | `renew` | `UPDATE … SET expires_at WHERE key AND token AND status = 0` |
//! | `get` | `SELECT … WHERE key AND expires_at > now` |
//! | `purge_expired` | `DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … WHERE expires_at <= now ORDER BY expires_at LIMIT n FOR UPDATE SKIP LOCKED))` |
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
//! [`tx`] has the transactional mode: the claim and the stored result written inside the
//! caller's own transaction, so they commit or roll back with the handler's writes.

pub(crate) mod inspect;
mod listen;
mod schema;
pub mod tx;

pub use schema::{Migration, SCHEMA_VERSION};
pub use sqlx;
pub use tx::{in_transaction, StoredResult, TxCall, TxClaim, TxStep};

use super::{millis, BoxFuture, Claim, ClaimOutcome, Complete, Record, Status, Store};
use crate::error::Error;
use crate::handle::Idem;
use crate::key::Digest;
use listen::Notifier;
use schema::Table;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{ConnectOptions, Connection, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const BACKEND: &str = "postgres";
/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "idem_records";
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

/// How to open a [`PostgresStore`]: the table, the pool, and the schema policy.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    table: String,
    max_connections: u32,
    min_connections: u32,
    acquire_timeout: Duration,
    idle_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
    application_name: Option<String>,
    migrate_on_open: bool,
    notify: bool,
    complete_retry: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            table: DEFAULT_TABLE.to_string(),
            max_connections: 16,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            max_lifetime: Some(Duration::from_secs(1800)),
            application_name: None,
            migrate_on_open: true,
            notify: true,
            complete_retry: Duration::from_secs(10),
        }
    }
}

impl PostgresOptions {
    /// The defaults: table `idem_records`, 16 connections, 5 s acquire timeout, the schema
    /// created or upgraded on open, notifications on, completions retried for 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table (`name` or `schema.name`; letters, digits, `_`). Anything else is refused with
    /// `Error::Config` at open: the name is validated, then quoted, never interpolated raw.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Most connections the store's pool opens (default 16). Ignored by
    /// [`PostgresStore::from_pool`], whose pool is the caller's.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Connections the pool keeps open when idle (default 0).
    pub fn min_connections(mut self, n: u32) -> Self {
        self.min_connections = n;
        self
    }

    /// How long a step waits for a connection before failing with `Error::Store` (default 5 s).
    /// While the server is down, this is how long a call takes to fail.
    pub fn acquire_timeout(mut self, d: Duration) -> Self {
        self.acquire_timeout = d;
        self
    }

    /// Idle connections are closed after this (default 10 min; `None`: never).
    pub fn idle_timeout(mut self, d: Option<Duration>) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Connections are replaced after this (default 30 min; `None`: never).
    pub fn max_lifetime(mut self, d: Option<Duration>) -> Self {
        self.max_lifetime = d;
        self
    }

    /// The `application_name` of the store's connections (shown in `pg_stat_activity`).
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// Create or upgrade the schema on open (default `true`). With `false`, open only checks
    /// that the schema is current, for deployments whose role may not run DDL: run
    /// [`PostgresStore::migrate`] or the SQL of [`PostgresStore::migrations`] separately.
    pub fn migrate_on_open(mut self, yes: bool) -> Self {
        self.migrate_on_open = yes;
        self
    }

    /// `NOTIFY` on completion and release so that waiting duplicates wake at once (default
    /// `true`). Without it, waiters poll every 25 ms.
    pub fn notify(mut self, yes: bool) -> Self {
        self.notify = yes;
        self
    }

    /// How long a completion is retried, on fresh connections, when the connection fails
    /// (default 10 s; zero: never). A completion that is lost leaves the key in progress until
    /// its lease lapses, and then a retry runs the body again; so it is worth waiting for.
    /// The retry is safe: it recognises a completion of its own that did land.
    pub fn complete_retry(mut self, d: Duration) -> Self {
        self.complete_retry = d;
        self
    }
}

/// The statements of one table, built once.
struct Sql {
    claim: String,
    complete: String,
    complete_again: String,
    release: String,
    mark_waiting: String,
    renew: String,
    get: String,
    purge: String,
    force_release: String,
}

impl Sql {
    fn new(t: &Table, notify: bool) -> Sql {
        let r = &t.records;
        let cols = "name, fingerprint, token, status, value, created_at, expires_at";
        // `$n` is the channel parameter of a statement that notifies; the column is a boolean
        // either way (the notification itself is sent when the statement commits). Only a row
        // that a waiter marked (`waiters`, see `mark_waiting`) notifies: NOTIFY serializes
        // committing transactions on a cluster-wide lock, which halved the throughput of fresh
        // calls at 64 connections when every completion sent one.
        let notify_expr = |rel: &str, n: u8| {
            if notify {
                format!(
                    "CASE WHEN {rel}.waiters THEN pg_notify(${n}, encode({rel}.key, 'hex')) IS NULL \
                     ELSE TRUE END"
                )
            } else {
                format!("${n}::text IS NULL")
            }
        };
        Sql {
            // A live row in the statement's snapshot is answered without touching it (a
            // replay is a pure read: no row lock, no WAL); otherwise the upsert runs, and takes
            // over a row that is not live.
            claim: format!(
                "WITH live AS MATERIALIZED ( \
                   SELECT e.name, e.fingerprint, e.token, e.status, e.value, e.created_at, \
                          e.expires_at \
                     FROM {r} e WHERE e.key = $1 AND e.expires_at > {CLOCK}), \
                 ins AS ( \
                   INSERT INTO {r} AS r (key, name, fingerprint, token, status, value, created_at, expires_at) \
                   SELECT $1, $2, $3, {CLOCK} * 1000, 0, NULL, {CLOCK}, {CLOCK} + $4 \
                    WHERE NOT EXISTS (SELECT 1 FROM live) \
                   ON CONFLICT (key) DO UPDATE SET \
                     name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint, \
                     token = GREATEST(r.token + 1, EXCLUDED.token), status = 0, value = NULL, \
                     created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at \
                   WHERE r.expires_at <= EXCLUDED.created_at \
                   RETURNING r.token) \
                 SELECT TRUE AS claimed, NULL::text, NULL::bytea, ins.token, NULL::smallint, \
                        NULL::bytea, NULL::bigint, NULL::bigint, {CLOCK} \
                   FROM ins \
                 UNION ALL \
                 SELECT FALSE, live.*, {CLOCK} FROM live"
            ),
            complete: format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4 \
                 WHERE key = $1 AND token = $2 AND status = 0 RETURNING {}",
                notify_expr("u", 5)
            ),
            // After a lost connection: the first attempt may have landed; only this attempt
            // holds this token, so a completed record with it is our own completion.
            complete_again: format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4 \
                 WHERE key = $1 AND token = $2 AND status IN (0, 1) RETURNING {}",
                notify_expr("u", 5)
            ),
            release: format!(
                "DELETE FROM {r} AS d WHERE key = $1 AND token = $2 AND status = 0 RETURNING {}",
                notify_expr("d", 3)
            ),
            // A waiter asks the key's completion to notify. True when the row is in progress
            // with `waiters` set (by this statement or an earlier waiter): its completion, or
            // its release, is then bound to see the mark and notify. False when it is not in
            // progress (any more), so the waiter reads again at once. Only the first waiter
            // writes; the others find the mark in place.
            mark_waiting: format!(
                "WITH m AS (UPDATE {r} SET waiters = TRUE WHERE key = $1 AND status = 0 \
                       AND NOT waiters AND expires_at > {CLOCK} RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM m) OR EXISTS (SELECT 1 FROM {r} e \
                   WHERE e.key = $1 AND e.status = 0 AND e.waiters AND e.expires_at > {CLOCK})"
            ),
            renew: format!(
                "UPDATE {r} SET expires_at = {CLOCK} + $3 WHERE key = $1 AND token = $2 AND status = 0"
            ),
            get: format!(
                "SELECT {cols}, {CLOCK} FROM {r} WHERE key = $1 AND expires_at > {CLOCK}"
            ),
            // The clock is written inline: `statement_timestamp()` is stable, so the planner
            // bounds the index scan with it (`Index Cond: expires_at <= …`). Behind a CTE it
            // could only filter, and a batch that found fewer than `n` expired rows (the last
            // one of every purge, and every reaper tick on a clean table) walked the whole
            // index: 1.6 s at 2 M live rows. The rows are deleted by the `ctid` their lock
            // returned rather than looked up again by key: the lock is held to the delete, so
            // the tuple cannot move, and a primary-key probe per row is saved (a batch of
            // 1 000 took 4.5 ms instead of 14).
            purge: format!(
                "DELETE FROM {r} WHERE ctid = ANY(ARRAY( \
                   SELECT e.ctid FROM {r} e WHERE e.expires_at <= {CLOCK} \
                    ORDER BY e.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                   AND expires_at <= {CLOCK}"
            ),
            force_release: format!(
                "WITH d AS (DELETE FROM {r} WHERE key = $1 RETURNING *) \
                 SELECT {cols}, {CLOCK}, {} FROM d",
                notify_expr("d", 2)
            ),
        }
    }
}

struct Inner {
    pool: PgPool,
    table: Table,
    sql: Sql,
    notifier: Option<Arc<Notifier>>,
    migrate_on_open: bool,
    complete_retry: Duration,
}

/// The PostgreSQL store behind [`Idem::postgres`]. Cheap to clone (clones share one pool).
///
/// Keep a clone when you also use the transactional mode ([`tx`]): `let idem = store.idem();`.
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

/// A `sqlx` failure as an `idem::Error` of the postgres store.
pub(crate) fn pg_error(op: &'static str, e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::PoolTimedOut => Error::store(
            BACKEND,
            op,
            "timed out waiting for a connection: the PostgreSQL server is down or unreachable, \
             or every connection of the pool is busy (see `acquire_timeout`, `max_connections`)",
        ),
        e => Error::store(BACKEND, op, e),
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
    Error::store(BACKEND, op, what)
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

/// Decodes a record from columns `at..at + 8` (name, fingerprint, token, status, value,
/// created_at, expires_at, now).
pub(crate) fn record_from(
    op: &'static str,
    key: &Digest,
    row: &PgRow,
    at: usize,
) -> Result<Record, Error> {
    let get_err = |e: sqlx::Error| pg_error(op, e);
    let status: i16 = row.try_get(at + 3).map_err(get_err)?;
    let status = Status::from_i16(status).ok_or_else(|| {
        corrupt(
            op,
            format!(
                "the record of key {key} has status {status}, which this version of idem does \
                 not know: it was written by a newer schema version; upgrade idem"
            ),
        )
    })?;
    let token: i64 = row.try_get(at + 2).map_err(get_err)?;
    Ok(Record {
        name: row.try_get(at).map_err(get_err)?,
        key: *key,
        fingerprint: digest_of(op, "fingerprint", row.try_get(at + 1).map_err(get_err)?)?,
        token: token as u64,
        status,
        value: row.try_get(at + 4).map_err(get_err)?,
        created_at: row.try_get(at + 5).map_err(get_err)?,
        expires_at: row.try_get(at + 6).map_err(get_err)?,
        now: row.try_get(at + 7).map_err(get_err)?,
    })
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
        .fetch_optional(conn)
        .await
        .map_err(|e| pg_error("claim", e))?;
    let Some(row) = row else { return Ok(None) };
    let claimed: bool = row.try_get(0).map_err(|e| pg_error("claim", e))?;
    if claimed {
        let token: i64 = row.try_get(3).map_err(|e| pg_error("claim", e))?;
        return Ok(Some(ClaimOutcome::Claimed {
            token: token as u64,
        }));
    }
    Ok(Some(ClaimOutcome::Existing(record_from(
        "claim", claim.key, &row, 1,
    )?)))
}

/// Parses `url` and opens one connection with `options` (for the schema check, before any
/// pool): a server that is down fails here at once with what the connection said, not after
/// the pool's acquire timeout.
pub(crate) async fn connect_one(
    url: &str,
    options: &PostgresOptions,
) -> Result<(PgConnectOptions, sqlx::PgConnection), Error> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(Error::Config(
            "invalid PostgreSQL URL for idem: it must start with postgres:// or \
             postgresql:// (postgres://user:password@host:port/database)"
                .into(),
        ));
    }
    let mut connect = PgConnectOptions::from_str(url).map_err(|e| {
        Error::Config(format!(
            "invalid PostgreSQL URL for idem ({e}); expected \
             postgres://user:password@host:port/database"
        ))
    })?;
    if let Some(app) = &options.application_name {
        connect = connect.application_name(app);
    }
    let conn = tokio::time::timeout(options.acquire_timeout, connect.connect())
        .await
        .map_err(|_| {
            Error::store(
                BACKEND,
                "open",
                format!(
                    "no answer from the PostgreSQL server within {:?}",
                    options.acquire_timeout
                ),
            )
        })?
        .map_err(|e| pg_error("open", e))?;
    Ok((connect, conn))
}

/// The error of a claim that found its row hidden [`CLAIM_ATTEMPTS`] times in a row.
pub(crate) fn claim_exhausted(key: &Digest) -> Error {
    Error::store(
        BACKEND,
        "claim",
        format!(
            "the key {key} changed under {CLAIM_ATTEMPTS} claims in a row (each saw a row \
             committed after its snapshot); try again"
        ),
    )
}

impl PostgresStore {
    /// Opens a store on `url` (`postgres://user:password@host:port/database?…`) with the
    /// default options, creating or upgrading the schema.
    pub async fn open(url: &str) -> Result<PostgresStore, Error> {
        Self::open_with(url, PostgresOptions::default()).await
    }

    /// Opens a store on `url` with `options`.
    pub async fn open_with(url: &str, options: PostgresOptions) -> Result<PostgresStore, Error> {
        let table = Table::parse(&options.table)?;
        let (connect, mut conn) = connect_one(url, &options).await?;
        let checked =
            schema::ensure(&mut conn, &table, options.migrate_on_open, SCHEMA_VERSION).await;
        let _ = conn.close().await;
        checked?;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(options.min_connections)
            .acquire_timeout(options.acquire_timeout)
            .idle_timeout(options.idle_timeout)
            .max_lifetime(options.max_lifetime)
            // One round trip per step: no ping before each use. A dead connection fails its
            // step with `Error::Store` and is dropped; completions are retried (see
            // `complete_retry`).
            .test_before_acquire(false)
            .connect_lazy_with(connect);
        Ok(Self::assemble(pool, table, &options))
    }

    /// A store on the caller's pool (its settings are the caller's; the pool options of
    /// `options` are ignored). The schema is created or upgraded as `options` says.
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
        PostgresStore {
            inner: Arc::new(Inner {
                sql: Sql::new(&table, options.notify),
                pool,
                table,
                notifier,
                migrate_on_open: options.migrate_on_open,
                complete_retry: options.complete_retry,
            }),
        }
    }

    /// Creates or upgrades the schema to [`SCHEMA_VERSION`], for deployments that manage DDL
    /// themselves (open with `migrate_on_open(false)`, run this from a privileged role).
    /// Concurrent calls are serialized by an advisory lock. Returns the version it found.
    pub async fn migrate(&self) -> Result<i32, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| pg_error("migrate", e))?;
        schema::ensure(&mut conn, &self.inner.table, true, SCHEMA_VERSION).await
    }

    /// Applies the migrations up to `version` only (for tests of upgrades).
    #[doc(hidden)]
    pub async fn migrate_to(pool: &PgPool, table: &str, version: i32) -> Result<i32, Error> {
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
    pub async fn schema_version(&self) -> Result<i32, Error> {
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

    /// A handle on this store with the default policy (the store is shared, not copied).
    pub fn idem(&self) -> Idem {
        Idem::from_store(self.clone())
    }

    /// The SQL text of a step (`"claim"`, `"complete"`, `"release"`, `"renew"`, `"get"`,
    /// `"purge"`), for benchmarks that run the same statements through raw sqlx.
    #[doc(hidden)]
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

    pub(crate) fn sql_complete(&self) -> &str {
        &self.inner.sql.complete
    }

    pub(crate) fn sql_release(&self) -> &str {
        &self.inner.sql.release
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
            .bind(self.channel());
        let row = match conn {
            Some(c) => q.fetch_optional(c).await?,
            None => q.fetch_optional(&self.inner.pool).await?,
        };
        Ok(row.is_some())
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
    fn as_postgres(&self) -> Option<&PostgresStore> {
        Some(self)
    }

    fn backend(&self) -> &'static str {
        BACKEND
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

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            let row = sqlx::query(&self.inner.sql.force_release)
                .bind(&key.0[..])
                .bind(self.channel())
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| pg_error("force_release", e))?;
            row.map(|row| record_from("force_release", key, &row, 0))
                .transpose()
        })
    }
}
