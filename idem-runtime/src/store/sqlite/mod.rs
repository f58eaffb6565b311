//! The SQLite store: embedded and durable, on sqlx.
//!
//! One `WITHOUT ROWID` table keyed by the 32-byte digest, an index on `expires_at`, WAL, a
//! `busy_timeout`, `synchronous=FULL` by default. SQLite has no server clock: times come from
//! this process's clock, which every process on the machine shares.
//!
//! Statements per step: a replay is one read (`SELECT` of the live row); a fresh call is that
//! read, one conditional upsert (the claim) and one fenced `UPDATE` (the completion) — two write
//! statements. The upsert only fires when the existing row is not live, so two racing claims can
//! never both win: the loser's upsert returns no row and it reads the winner's.
//!
//! Open it as every store opens: [`SqliteStore::connect`] on a URL, [`SqliteOptions`] for
//! anything else, [`SqliteStore::from_pool`] on a pool the application already has.

mod inspect;
mod options;
mod resume;
mod schema;
mod statements;

pub use options::SqliteOptions;
pub use schema::SCHEMA_VERSION;
use statements::Statements;

use super::{
    claim_keep_until, local_now_ms, millis, Backend, BoxFuture, Claim, ClaimOutcome, Complete,
    Migrated, Migration, Record, Resolve, Resolved, Status, Store,
};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
};
use sqlx::{ConnectOptions, Row};
use std::time::Duration;

const BACKEND: Backend = Backend::Sqlite;
/// Rows one purge statement deletes; see `purge_expired`.
const PURGE_CHUNK: u64 = 100;
/// The longest pause between two purge statements.
const PURGE_MAX_PAUSE: Duration = Duration::from_millis(20);

/// The SQLite store behind [`crate::Idem::sqlite`].
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The table in use (see the schema module for files written by idem 0.1).
    table: String,
    sql: Statements,
    /// For an in-memory database: one connection outside the pool, never used, that keeps the
    /// shared-cache database alive. The pool closes a connection whose query future was dropped
    /// mid-statement (a caller's timeout, a cancelled renewal); were it the last one, SQLite
    /// would free the database and the next connection would open an empty one.
    _keeper: Option<std::sync::Mutex<SqliteConnection>>,
}
/// True for a plain SQL identifier: letters, digits and `_`, not starting with a digit.
pub(crate) fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

fn err(op: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| sqlx_error(op, e)
}

/// A sqlx failure as an `idem::Error` of this store, with its kind.
fn sqlx_error(op: &'static str, e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            StoreErrorKind::Unreachable
        }
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
            match code & 0xff {
                5 | 6 => StoreErrorKind::Busy,
                8 => StoreErrorKind::ReadOnly,
                13 => StoreErrorKind::Capacity,
                14 => StoreErrorKind::DatabaseMissing,
                23 => StoreErrorKind::Permission,
                11 | 26 => StoreErrorKind::Corrupt,
                // SQLITE_ERROR is every "prepare failed"; the message tells a missing table.
                1 if db.message().contains("no such table") => StoreErrorKind::SchemaMissing,
                _ => StoreErrorKind::Query,
            }
        }
        _ => StoreErrorKind::Query,
    };
    Error::store_kind(BACKEND, op, kind, e)
}

/// Puts a file database in WAL mode, once, before the pool opens. The switch needs an exclusive
/// lock that SQLite's busy handler does not wait for: processes opening a new file together
/// (three schedulers, a test suite's parallel tests) get SQLITE_BUSY at once. So it is retried
/// here until `busy_timeout`. WAL is a property of the file: the pool's connections open in it
/// without asking again.
async fn enable_wal(
    connect: &SqliteConnectOptions,
    busy_timeout: Duration,
) -> Result<(), sqlx::Error> {
    let deadline = std::time::Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(2);
    let mut conn = connect.connect().await?;
    let result = loop {
        match sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut conn)
            .await
        {
            Err(sqlx::Error::Database(e))
                if is_busy(&*e) && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => break other.map(drop),
        }
    };
    let _ = sqlx::Connection::close(conn).await;
    result
}

/// SQLITE_BUSY or SQLITE_LOCKED, whatever the extended code.
fn is_busy(e: &dyn sqlx::error::DatabaseError) -> bool {
    e.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

impl SqliteStore {
    /// Opens `url` (`sqlite::memory:`, `sqlite://file.db`) with the default options, creating
    /// a missing file and the schema.
    pub async fn connect(url: &str) -> Result<SqliteStore, Error> {
        SqliteOptions::from_url(url)?.connect().await
    }

    /// A store on the application's own pool (its settings are the application's; the pool
    /// settings of `options` are ignored, its table and schema policy are not).
    pub async fn from_pool(pool: SqlitePool, options: SqliteOptions) -> Result<SqliteStore, Error> {
        let store = SqliteStore::assemble(pool, &options, None).await?;
        if options.migrate_on_open {
            schema::ensure(&store).await?;
        } else {
            schema::check(&store).await?;
        }
        Ok(store)
    }

    /// Opens `url` with the default options.
    #[deprecated(since = "0.2.0", note = "use `SqliteStore::connect`")]
    pub async fn open(url: &str) -> Result<SqliteStore, Error> {
        SqliteStore::connect(url).await
    }

    /// Options for opening `url`.
    #[deprecated(
        since = "0.2.0",
        note = "use `SqliteOptions::from_url(url)?` or `url.parse()`"
    )]
    pub fn options(url: &str) -> SqliteOptions {
        SqliteOptions::unchecked(url)
    }

    /// Opens the pool without any DDL.
    async fn connect_with(options: &SqliteOptions) -> Result<SqliteStore, Error> {
        let connect = options.connect_options()?;
        if !options.migrate_on_open && !options.in_memory() {
            let file = connect.get_filename();
            if !file.exists() {
                return Err(options::no_file(file));
            }
        }
        let open_err = |e: sqlx::Error| {
            let what = format!(
                "cannot open the SQLite database `{}`: {e}",
                options.display()
            );
            match sqlx_error("open", e) {
                Error::Store(s) => Error::store_kind(BACKEND, "open", s.kind, what),
                other => other,
            }
        };
        // sqlx opens `sqlite::memory:` as a named shared-cache database, which lives while any
        // connection to it is open: the keeper holds one for the life of the store.
        let in_memory = options.in_memory();
        let keeper = if in_memory {
            let conn = connect.connect().await.map_err(open_err)?;
            Some(std::sync::Mutex::new(conn))
        } else {
            None
        };
        let pool = if in_memory {
            // One pooled connection: shared-cache connections lock whole tables, and one
            // connection serialises the calls as well as SQLite would.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            enable_wal(&connect, options.busy_timeout)
                .await
                .map_err(open_err)?;
            SqlitePoolOptions::new().max_connections(options.max_connections_value())
        };
        let pool = pool.connect_with(connect).await.map_err(open_err)?;
        SqliteStore::assemble(pool, options, keeper).await
    }

    /// The store on `pool`, its table resolved (see the schema module) and validated.
    async fn assemble(
        pool: SqlitePool,
        options: &SqliteOptions,
        keeper: Option<std::sync::Mutex<SqliteConnection>>,
    ) -> Result<SqliteStore, Error> {
        if !valid_identifier(&options.table) {
            return Err(Error::config(format!(
                "SQLite table name `{}` is not a plain identifier (letters, digits, `_`)",
                options.table
            )));
        }
        let table = if options.default_table {
            let mut conn = pool.acquire().await.map_err(err("open"))?;
            schema::resolve_default(&mut conn, &options.table).await?
        } else {
            options.table.clone()
        };
        Ok(SqliteStore {
            pool,
            sql: Statements::new(&table),
            table,
            _keeper: keeper,
        })
    }

    /// The pool, for tests and for operators' tools.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table the records are in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates or upgrades the schema (for a store opened with `migrate_on_open(false)`), and
    /// says what it found.
    pub async fn migrate(&self) -> Result<Migrated, Error> {
        let from = schema::ensure(self).await?;
        Ok(Migrated::new(
            BACKEND,
            from,
            SCHEMA_VERSION,
            format!("table {}", self.table),
        ))
    }

    /// The migrations of `table`, as SQL a DBA can review and run.
    pub fn migrations(table: &str) -> Result<Vec<Migration>, Error> {
        if !valid_identifier(table) {
            return Err(Error::config(format!(
                "SQLite table name `{table}` is not a plain identifier (letters, digits, `_`)"
            )));
        }
        Ok(schema::migrations(table))
    }

    async fn select(&self, key: &Digest, now: i64) -> Result<Option<Record>, Error> {
        let row = sqlx::query(&self.sql.select)
            .bind(key.as_bytes())
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("read"))?;
        row.map(|r| record(key, &r, now)).transpose()
    }

    async fn claim_now(&self, c: Claim<'_>) -> Result<ClaimOutcome, Error> {
        // A live row is found with one read; only a free key takes a write, which replaces
        // the row read (if it is still that row) and knows from it whether it takes over an
        // abandoned attempt.
        loop {
            let now = local_now_ms();
            let row = sqlx::query(&self.sql.select_any)
                .bind(c.key.as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(err("read"))?;
            let old = row.map(|r| record(c.key, &r, now)).transpose()?;
            // Live, or a tombstone. The upsert below replaces only the row read (its token),
            // which was neither, and time only takes a row further from either.
            if let Some(r) = old.as_ref().and_then(super::occupying) {
                return Ok(ClaimOutcome::Existing(r));
            }
            let takeover = old.as_ref().and_then(crate::protocol::takeover_of);
            let token: Option<i64> = sqlx::query_scalar(&self.sql.claim)
                .bind(c.key.as_bytes())
                .bind(c.name)
                .bind(c.fingerprint.as_bytes())
                .bind(crate::protocol::next_token(None, now) as i64)
                .bind(now)
                .bind(now.saturating_add(millis(c.lease)))
                .bind(claim_keep_until(now, &c))
                .bind(old.as_ref().map(|r| r.token as i64))
                .bind(i64::from(takeover.map_or(1, |t| t.attempt)))
                .fetch_optional(&self.pool)
                .await
                .map_err(err("claim"))?;
            if let Some(token) = token {
                return Ok(ClaimOutcome::Claimed {
                    token: token as u64,
                    takeover,
                });
            }
            // Another attempt claimed it between the read and the upsert: read its row.
        }
    }

    async fn resolve_now(&self, key: &Digest, resolution: Resolve<'_>) -> Result<Resolved, Error> {
        // Read the live record, then resolve it if it is still that parked record.
        loop {
            let now = local_now_ms();
            let r = match self.select(key, now).await? {
                Some(r) if r.status == Status::Parked => r,
                other => return Ok(Resolved::NotParked(other)),
            };
            let (status, value, end) = match resolution {
                Resolve::Applied { value, ttl } => (
                    Status::Completed,
                    Some(value),
                    now.saturating_add(millis(ttl)),
                ),
                Resolve::NotApplied => (Status::Released, None, crate::protocol::ended_at(now)),
            };
            let done = sqlx::query(&self.sql.resolve)
                .bind(key.as_bytes())
                .bind(r.token as i64)
                .bind(i64::from(status.as_i16()))
                .bind(value)
                .bind(end)
                .execute(&self.pool)
                .await
                .map_err(err("resolve"))?;
            if done.rows_affected() == 1 {
                return Ok(Resolved::Done(r));
            }
        }
    }

    /// One fenced statement: `?1` key, `?2` token, `?3` now, then the step's own parameters.
    async fn fenced(
        &self,
        sql: &str,
        op: &'static str,
        key: &Digest,
        token: u64,
        now: i64,
        extra: Extra<'_>,
    ) -> Result<bool, Error> {
        let q = sqlx::query(sql)
            .bind(key.as_bytes())
            .bind(token as i64)
            .bind(now);
        let q = match extra {
            Extra::ExpiresAt(at) => q.bind(at),
            Extra::Value(value, at, keep) => q.bind(value).bind(at).bind(keep),
        };
        let done = q.execute(&self.pool).await.map_err(err(op))?;
        Ok(done.rows_affected() == 1)
    }
}

/// The parameters a fenced step adds after key, token and now.
enum Extra<'a> {
    ExpiresAt(i64),
    /// The value, `expires_at` and `keep_until` of a completion.
    Value(&'a [u8], i64, i64),
}

fn record(key: &Digest, r: &SqliteRow, now: i64) -> Result<Record, Error> {
    let corrupt = |what: &str| {
        Error::store_kind(
            BACKEND,
            "read",
            StoreErrorKind::Corrupt,
            format!("the row of key {key} has an invalid {what}"),
        )
    };
    let get = |e: sqlx::Error| sqlx_error("read", e);
    let fingerprint: Vec<u8> = r.try_get("fingerprint").map_err(get)?;
    let status: i64 = r.try_get("status").map_err(get)?;
    let token: i64 = r.try_get("token").map_err(get)?;
    let attempt: i64 = r.try_get("attempt").map_err(get)?;
    Ok(Record {
        name: r.try_get("name").map_err(get)?,
        key: *key,
        fingerprint: Digest::from_slice(&fingerprint).ok_or_else(|| corrupt("fingerprint"))?,
        token: token as u64,
        status: Status::from_column(status).ok_or_else(|| corrupt("status"))?,
        value: r.try_get("value").map_err(get)?,
        created_at: r.try_get("created_at").map_err(get)?,
        expires_at: r.try_get("expires_at").map_err(get)?,
        attempt: u32::try_from(attempt).map_err(|_| corrupt("attempt"))?,
        keep_until: r.try_get("keep_until").map_err(get)?,
        now,
    })
}

impl Store for SqliteStore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.claim_now(claim))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let now = local_now_ms();
        let expires_at = now.saturating_add(millis(done.ttl));
        let keep = crate::protocol::completed_keep_until(expires_at, done.tombstone);
        Box::pin(self.fenced(
            &self.sql.complete,
            "complete",
            done.key,
            done.token,
            now,
            Extra::Value(done.value, expires_at, keep),
        ))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let now = local_now_ms();
        let end = crate::protocol::ended_at(now);
        Box::pin(self.fenced(
            &self.sql.release,
            "release",
            key,
            token,
            now,
            Extra::ExpiresAt(end),
        ))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let now = local_now_ms();
        Box::pin(self.fenced(
            &self.sql.renew,
            "renew",
            key,
            token,
            now,
            Extra::ExpiresAt(now.saturating_add(millis(lease))),
        ))
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.select(key, local_now_ms()))
    }

    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let now = local_now_ms();
        Box::pin(self.fenced(
            &self.sql.park,
            "park",
            key,
            token,
            now,
            Extra::ExpiresAt(i64::MAX),
        ))
    }

    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let now = local_now_ms();
        Box::pin(self.fenced(
            &self.sql.abandon,
            "abandon",
            key,
            token,
            now,
            Extra::ExpiresAt(crate::protocol::ended_at(now)),
        ))
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

    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async move {
            // In chunks, with a pause after each. A DELETE holds the database's one write lock
            // until it commits, and the calls that need it meanwhile sleep in SQLite's busy
            // handler (1, 2, 5, 10 … ms between polls): a purge that takes the lock again the
            // moment it lets go starves them. With 1 000-row statements back to back, calls
            // beside a purge had a p99 three times their quiet one at 1 M rows, 3–12 times at
            // 10 M; with 100-row chunks and a pause of half a chunk's time, 1.2 and 1.5 times
            // (`benches/growth.rs`, 16 callers). The purge is slower (55–71 µs a row instead of
            // 10–83), but it is the background work, and still deletes about 15 000 rows a
            // second, more than SQLite can claim.
            let limit = u64::try_from(limit).unwrap_or(u64::MAX);
            sqlx::query(&self.sql.strip)
                .bind(local_now_ms())
                .bind(i64::try_from(limit.min(PURGE_CHUNK)).unwrap_or(i64::MAX))
                .execute(&self.pool)
                .await
                .map_err(err("purge"))?;
            let mut total = 0u64;
            loop {
                let want = (limit - total).min(PURGE_CHUNK);
                let started = std::time::Instant::now();
                let done = sqlx::query(&self.sql.purge)
                    .bind(local_now_ms())
                    .bind(i64::try_from(want).unwrap_or(i64::MAX))
                    .execute(&self.pool)
                    .await
                    .map_err(err("purge"))?
                    .rows_affected();
                total += done;
                if done < want || total >= limit {
                    return Ok(total);
                }
                tokio::time::sleep((started.elapsed() / 2).min(PURGE_MAX_PAUSE)).await;
            }
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move {
            // Read the live record, then end it if it is still the same: a record that changed
            // in between (renewed, completed, taken over) is read again.
            loop {
                let now = local_now_ms();
                let Some(r) = self.select(key, now).await? else {
                    return Ok(None);
                };
                let done = sqlx::query(&self.sql.force_release)
                    .bind(key.as_bytes())
                    .bind(crate::protocol::ended_at(now))
                    .bind(r.token as i64)
                    .bind(i64::from(r.status.as_i16()))
                    .bind(r.expires_at)
                    .execute(&self.pool)
                    .await
                    .map_err(err("force_release"))?;
                if done.rows_affected() == 1 {
                    return Ok(Some(r));
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `migrate_on_open`, nothing is created: a missing file is an error, and so is a
    /// file without the schema; after a migration the same options open it.
    #[tokio::test]
    async fn open_without_migrating_creates_nothing() {
        let path = std::env::temp_dir().join(format!(
            "idem-nomigrate-{}-{}.db",
            std::process::id(),
            local_now_ms()
        ));
        let url = format!("sqlite://{}", path.display());
        let strict = || {
            SqliteOptions::from_url(&url)
                .unwrap()
                .migrate_on_open(false)
        };
        let kind = |r: Result<SqliteStore, Error>| r.err().and_then(|e| e.store_error_kind());
        assert_eq!(
            kind(strict().connect().await),
            Some(StoreErrorKind::DatabaseMissing)
        );
        assert!(!path.exists());
        let plain = SqliteStore::connect_with(&SqliteOptions::from_url(&url).unwrap())
            .await
            .unwrap();
        drop(plain);
        assert_eq!(
            kind(strict().connect().await),
            Some(StoreErrorKind::SchemaMissing)
        );
        let m = SqliteOptions::from_url(&url)
            .unwrap()
            .migrate()
            .await
            .unwrap();
        assert_eq!((m.from, m.to), (0, SCHEMA_VERSION));
        strict().connect().await.unwrap();
        let again = SqliteOptions::from_url(&url)
            .unwrap()
            .migrate()
            .await
            .unwrap();
        assert_eq!(again.from, SCHEMA_VERSION);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
