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

use super::{
    local_now_ms, millis, BoxFuture, Claim, ClaimOutcome, Complete, Record, Status, Store,
};
use crate::error::Error;
use crate::key::Digest;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use std::str::FromStr;
use std::time::Duration;

/// The schema version this code writes; a database with a higher one is refused.
const SCHEMA_VERSION: i64 = 1;
/// Rows one purge statement deletes; see `purge_expired`.
const PURGE_CHUNK: u64 = 100;
/// The longest pause between two purge statements.
const PURGE_MAX_PAUSE: Duration = Duration::from_millis(20);
const COLUMNS: &str = "name, fingerprint, token, status, value, created_at, expires_at";

/// Options of a [`SqliteStore`]; see [`SqliteStore::options`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    url: String,
    table: String,
    busy_timeout: Duration,
    synchronous: SqliteSynchronous,
    max_connections: u32,
    migrate_on_open: bool,
}

/// The SQLite store behind [`crate::Idem::sqlite`].
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Statements,
    /// For an in-memory database: one connection outside the pool, never used, that keeps the
    /// shared-cache database alive. The pool closes a connection whose query future was dropped
    /// mid-statement (a caller's timeout, a cancelled renewal); were it the last one, SQLite
    /// would free the database and the next connection would open an empty one.
    _keeper: Option<std::sync::Mutex<SqliteConnection>>,
}

/// The statements, built once at open because the table name is configurable.
#[derive(Debug)]
struct Statements {
    select: String,
    claim: String,
    complete: String,
    release: String,
    renew: String,
    purge: String,
    force_release: String,
    list: String,
    stats: String,
}

impl Statements {
    fn new(t: &str) -> Self {
        Statements {
            select: format!("SELECT {COLUMNS} FROM {t} WHERE key = ?1 AND expires_at > ?2"),
            // The token is `protocol::next_token`: max(previous + 1, now in µs).
            claim: format!(
                "INSERT INTO {t} (key, name, fingerprint, token, status, value, created_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, 0, NULL, ?5, ?6) \
                 ON CONFLICT(key) DO UPDATE SET name = excluded.name, \
                 fingerprint = excluded.fingerprint, token = max({t}.token + 1, excluded.token), \
                 status = 0, value = NULL, created_at = excluded.created_at, \
                 expires_at = excluded.expires_at \
                 WHERE {t}.expires_at <= excluded.created_at \
                 RETURNING token"
            ),
            complete: format!(
                "UPDATE {t} SET status = 1, value = ?3, expires_at = ?4 \
                 WHERE key = ?1 AND token = ?2 AND status = 0"
            ),
            release: format!("DELETE FROM {t} WHERE key = ?1 AND token = ?2 AND status = 0"),
            renew: format!(
                "UPDATE {t} SET expires_at = ?3 WHERE key = ?1 AND token = ?2 AND status = 0"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE key IN \
                 (SELECT key FROM {t} WHERE expires_at <= ?1 LIMIT ?2)"
            ),
            force_release: format!("DELETE FROM {t} WHERE key = ?1 RETURNING {COLUMNS}"),
            // `?1` now, `?2` newest claim time, `?3` name or NULL, `?4` status or NULL. The
            // value itself is left out (it may be large); its length is what a listing shows.
            list: format!(
                "SELECT key, name, fingerprint, token, status, NULL AS value, \
                 length(value) AS size, created_at, expires_at FROM {t} \
                 WHERE expires_at > ?1 AND created_at <= ?2 AND (?3 IS NULL OR name = ?3) \
                 AND (?4 IS NULL OR status = ?4) ORDER BY created_at, key LIMIT ?5"
            ),
            stats: format!(
                "SELECT name, CASE WHEN expires_at <= ?1 THEN 2 ELSE status END AS state, \
                 count(*) AS n FROM {t} GROUP BY name, state ORDER BY name, state"
            ),
        }
    }
}

/// True for a plain SQL identifier: letters, digits and `_`, not starting with a digit.
pub(crate) fn valid_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

fn err(op: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::store("sqlite", op, e)
}

impl SqliteOptions {
    /// The table name (default `idem_keys`); letters, digits and `_` only.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_string();
        self
    }

    /// How long a statement waits for a lock held by another connection or process before it
    /// fails with `Error::Store` (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// `PRAGMA synchronous` (default `FULL`: a completed record survives a power loss).
    pub fn synchronous(mut self, synchronous: SqliteSynchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// Connections in the pool (default 4; an in-memory database always uses one).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Create the file and the schema when missing (default `true`). With `false`, a missing
    /// file is an error and so is a schema that is not current (`Error::Config`): for tools
    /// that must not create a database by mistake.
    pub fn migrate_on_open(mut self, yes: bool) -> Self {
        self.migrate_on_open = yes;
        self
    }

    /// Opens the database, creating a missing file and the schema (unless
    /// [`migrate_on_open`](Self::migrate_on_open) is off).
    pub async fn open(self) -> Result<SqliteStore, Error> {
        let store = self.connect().await?;
        if self.migrate_on_open {
            store.migrate(&self.table).await?;
        } else {
            let v = store.schema_version(&self.table).await?;
            if v != SCHEMA_VERSION {
                return Err(Error::Config(not_migrated(&self.table, v)));
            }
        }
        Ok(store)
    }

    /// Opens the pool without any DDL.
    async fn connect(&self) -> Result<SqliteStore, Error> {
        if !valid_identifier(&self.table) {
            return Err(Error::Config(format!(
                "SQLite table name `{}` is not a plain identifier (letters, digits, `_`)",
                self.table
            )));
        }
        let connect = SqliteConnectOptions::from_str(&self.url)
            .map_err(|e| Error::Config(format!("`{}` is not a SQLite URL: {e}", self.url)))?;
        let in_memory = self.url.contains(":memory:") || self.url.contains("mode=memory");
        let connect = connect
            .create_if_missing(self.migrate_on_open)
            .busy_timeout(self.busy_timeout)
            .synchronous(self.synchronous);
        let open_err = |e: sqlx::Error| {
            Error::store(
                "sqlite",
                "open",
                format!("cannot open the SQLite database `{}`: {e}", self.url),
            )
        };
        // sqlx opens `sqlite::memory:` as a named shared-cache database, which lives while any
        // connection to it is open: the keeper holds one for the life of the store.
        let keeper = if in_memory {
            let conn = connect.connect().await.map_err(open_err)?;
            Some(std::sync::Mutex::new(conn))
        } else {
            None
        };
        let (connect, pool) = if in_memory {
            // One pooled connection: shared-cache connections lock whole tables, and one
            // connection serialises the calls as well as SQLite would.
            (
                connect,
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None),
            )
        } else {
            enable_wal(&connect, self.busy_timeout)
                .await
                .map_err(open_err)?;
            (
                connect,
                SqlitePoolOptions::new().max_connections(self.max_connections),
            )
        };
        let pool = pool.connect_with(connect).await.map_err(open_err)?;
        Ok(SqliteStore {
            pool,
            sql: Statements::new(&self.table),
            _keeper: keeper,
        })
    }
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
    /// Opens `url` (`sqlite::memory:`, `sqlite://file.db`) with the default options.
    pub async fn open(url: &str) -> Result<SqliteStore, Error> {
        SqliteStore::options(url).open().await
    }

    /// Options for opening `url`.
    pub fn options(url: &str) -> SqliteOptions {
        SqliteOptions {
            url: url.to_string(),
            table: "idem_keys".into(),
            busy_timeout: Duration::from_secs(5),
            synchronous: SqliteSynchronous::Full,
            max_connections: 4,
            migrate_on_open: true,
        }
    }

    /// The pool, for tests and for operators' tools.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates or upgrades the schema; returns the version found before (0: none).
    async fn migrate(&self, t: &str) -> Result<i64, Error> {
        // IMMEDIATE: take the write lock up front, waiting `busy_timeout` for it. A deferred
        // transaction that read the schema and then writes fails at once (SQLITE_BUSY, no
        // waiting) when another process migrated in between, as processes starting together do.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(err("migrate"))?;
        let ddl = [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 key BLOB PRIMARY KEY NOT NULL, name TEXT NOT NULL, fingerprint BLOB NOT NULL, \
                 token INTEGER NOT NULL, status INTEGER NOT NULL, value BLOB, \
                 created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID"
            ),
            format!("CREATE INDEX IF NOT EXISTS {t}_expires ON {t} (expires_at)"),
            format!("CREATE TABLE IF NOT EXISTS {t}_schema (version INTEGER NOT NULL)"),
        ];
        for stmt in &ddl {
            sqlx::query(stmt)
                .execute(&mut *tx)
                .await
                .map_err(err("migrate"))?;
        }
        let version: Option<i64> =
            sqlx::query_scalar(&format!("SELECT max(version) FROM {t}_schema"))
                .fetch_one(&mut *tx)
                .await
                .map_err(err("migrate"))?;
        match version {
            None => {
                sqlx::query(&format!("INSERT INTO {t}_schema (version) VALUES (?1)"))
                    .bind(SCHEMA_VERSION)
                    .execute(&mut *tx)
                    .await
                    .map_err(err("migrate"))?;
            }
            Some(v) if v > SCHEMA_VERSION => {
                return Err(Error::Config(format!(
                    "the SQLite table `{t}` has schema version {v}, written by a newer idem; \
                     this version reads {SCHEMA_VERSION}: upgrade idem"
                )))
            }
            Some(_) => {}
        }
        tx.commit().await.map_err(err("migrate"))?;
        Ok(version.unwrap_or(0))
    }

    /// The schema version of table `t` (0 when the table or its version table is missing);
    /// creates nothing.
    async fn schema_version(&self, t: &str) -> Result<i64, Error> {
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?1, ?2)",
        )
        .bind(t)
        .bind(format!("{t}_schema"))
        .fetch_one(&self.pool)
        .await
        .map_err(err("open"))?;
        if tables < 2 {
            return Ok(0);
        }
        let v: Option<i64> = sqlx::query_scalar(&format!("SELECT max(version) FROM {t}_schema"))
            .fetch_one(&self.pool)
            .await
            .map_err(err("open"))?;
        Ok(v.unwrap_or(0))
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
        // A live row is found with one read; only a free key takes a write.
        loop {
            let now = local_now_ms();
            if let Some(r) = self.select(c.key, now).await? {
                return Ok(ClaimOutcome::Existing(r));
            }
            let token: Option<i64> = sqlx::query_scalar(&self.sql.claim)
                .bind(c.key.as_bytes())
                .bind(c.name)
                .bind(c.fingerprint.as_bytes())
                .bind(crate::protocol::next_token(None, now) as i64)
                .bind(now)
                .bind(now.saturating_add(millis(c.lease)))
                .fetch_optional(&self.pool)
                .await
                .map_err(err("claim"))?;
            if let Some(token) = token {
                return Ok(ClaimOutcome::Claimed {
                    token: token as u64,
                });
            }
            // Another attempt claimed it between the read and the upsert: read its row.
        }
    }

    /// One fenced statement: `?1` key, `?2` token, then the step's own parameters.
    async fn fenced(
        &self,
        sql: &str,
        op: &'static str,
        key: &Digest,
        token: u64,
        extra: Extra<'_>,
    ) -> Result<bool, Error> {
        let q = sqlx::query(sql).bind(key.as_bytes()).bind(token as i64);
        let q = match extra {
            Extra::None => q,
            Extra::ExpiresAt(at) => q.bind(at),
            Extra::Value(value, at) => q.bind(value).bind(at),
        };
        let done = q.execute(&self.pool).await.map_err(err(op))?;
        Ok(done.rows_affected() == 1)
    }
}

/// The parameters a fenced step adds after key and token.
enum Extra<'a> {
    None,
    ExpiresAt(i64),
    Value(&'a [u8], i64),
}

fn record(key: &Digest, r: &SqliteRow, now: i64) -> Result<Record, Error> {
    let corrupt = |what: &str| {
        Error::store(
            "sqlite",
            "read",
            format!("the row of key {key} has an invalid {what}"),
        )
    };
    let get = |e: sqlx::Error| Error::store("sqlite", "read", e);
    let fingerprint: Vec<u8> = r.try_get("fingerprint").map_err(get)?;
    let status: i64 = r.try_get("status").map_err(get)?;
    let token: i64 = r.try_get("token").map_err(get)?;
    Ok(Record {
        name: r.try_get("name").map_err(get)?,
        key: *key,
        fingerprint: Digest::from_slice(&fingerprint).ok_or_else(|| corrupt("fingerprint"))?,
        token: token as u64,
        status: i16::try_from(status)
            .ok()
            .and_then(Status::from_i16)
            .ok_or_else(|| corrupt("status"))?,
        value: r.try_get("value").map_err(get)?,
        created_at: r.try_get("created_at").map_err(get)?,
        expires_at: r.try_get("expires_at").map_err(get)?,
        now,
    })
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.claim_now(claim))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let expires_at = local_now_ms().saturating_add(millis(done.ttl));
        Box::pin(self.fenced(
            &self.sql.complete,
            "complete",
            done.key,
            done.token,
            Extra::Value(done.value, expires_at),
        ))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.fenced(&self.sql.release, "release", key, token, Extra::None))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let expires_at = local_now_ms().saturating_add(millis(lease));
        Box::pin(self.fenced(
            &self.sql.renew,
            "renew",
            key,
            token,
            Extra::ExpiresAt(expires_at),
        ))
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.select(key, local_now_ms()))
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
            let now = local_now_ms();
            let row = sqlx::query(&self.sql.force_release)
                .bind(key.as_bytes())
                .fetch_optional(&self.pool)
                .await
                .map_err(err("force_release"))?;
            row.map(|r| record(key, &r, now)).transpose()
        })
    }
}

fn not_migrated(t: &str, found: i64) -> String {
    if found == 0 {
        format!("the SQLite database has no idem table `{t}`: create it with `idem migrate` (or open it once with migrate_on_open)")
    } else {
        format!(
            "the SQLite table `{t}` has schema version {found}, this version of idem reads \
             {SCHEMA_VERSION}: run `idem migrate` (or upgrade idem if the table is newer)"
        )
    }
}

/// Opens an existing, current database for the operator's tools, creating nothing.
pub(crate) async fn open_existing(
    url: &str,
    table: Option<&str>,
) -> Result<SqliteStore, crate::admin::OpenError> {
    use crate::admin::OpenError;
    let mut options = SqliteStore::options(url).migrate_on_open(false);
    if let Some(t) = table {
        options = options.table(t);
    }
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    if !in_memory {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| Error::Config(format!("`{url}` is not a SQLite URL: {e}")))?;
        let file = connect.get_filename();
        if !file.exists() {
            return Err(OpenError::NotMigrated {
                what: format!(
                    "there is no SQLite database file at {}: check the path, or create it \
                     with `idem migrate`",
                    file.display()
                ),
            });
        }
    }
    let store = options.connect().await?;
    let found = store.schema_version(&options.table).await?;
    if found < SCHEMA_VERSION {
        return Err(OpenError::NotMigrated {
            what: not_migrated(&options.table, found),
        });
    }
    if found > SCHEMA_VERSION {
        return Err(Error::Config(not_migrated(&options.table, found)).into());
    }
    Ok(store)
}

/// Creates the file and the schema at `url` when missing; says what it found.
pub(crate) async fn migrate_url(
    url: &str,
    table: Option<&str>,
) -> Result<crate::admin::Migrated, Error> {
    let mut options = SqliteStore::options(url);
    if let Some(t) = table {
        options = options.table(t);
    }
    let store = options.connect().await?;
    let from = store.migrate(&options.table).await?;
    Ok(crate::admin::Migrated {
        backend: "sqlite",
        from,
        to: SCHEMA_VERSION,
        location: format!("table {}", options.table),
    })
}

impl crate::admin::Inspect for SqliteStore {
    fn list<'a>(
        &'a self,
        filter: &'a crate::admin::Filter,
    ) -> BoxFuture<'a, Result<Vec<crate::admin::KeyInfo>, Error>> {
        Box::pin(async move {
            let now = local_now_ms();
            let rows = sqlx::query(&self.sql.list)
                .bind(now)
                .bind(now.saturating_sub(filter.older_than_ms()))
                .bind(filter.name.as_deref())
                .bind(filter.status.map(|s| i64::from(s.as_i16())))
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(err("list"))?;
            rows.iter()
                .map(|r| {
                    let get = |e: sqlx::Error| Error::store("sqlite", "list", e);
                    let key: Vec<u8> = r.try_get("key").map_err(get)?;
                    let key = Digest::from_slice(&key).ok_or_else(|| {
                        Error::store("sqlite", "list", "a stored key is not 32 bytes")
                    })?;
                    let size: Option<i64> = r.try_get("size").map_err(get)?;
                    let rec = record(&key, r, now)?;
                    Ok(crate::admin::KeyInfo {
                        value_size: size.map(|n| n as u64),
                        ..crate::admin::KeyInfo::from(&rec)
                    })
                })
                .collect()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<crate::admin::Stat>, Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.stats)
                .bind(local_now_ms())
                .fetch_all(&self.pool)
                .await
                .map_err(err("stats"))?;
            rows.iter()
                .map(|r| {
                    let get = |e: sqlx::Error| Error::store("sqlite", "stats", e);
                    let state: i64 = r.try_get("state").map_err(get)?;
                    let count: i64 = r.try_get("n").map_err(get)?;
                    Ok(crate::admin::Stat {
                        name: r.try_get("name").map_err(get)?,
                        state: crate::admin::State::from_code(state).ok_or_else(|| {
                            Error::store("sqlite", "stats", format!("unknown status {state}"))
                        })?,
                        count: count as u64,
                    })
                })
                .collect()
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
        let strict = || SqliteStore::options(&url).migrate_on_open(false);
        assert!(matches!(strict().open().await, Err(Error::Store(_))));
        assert!(!path.exists());
        let plain = SqliteStore::options(&url).connect().await.unwrap();
        drop(plain);
        match strict().open().await {
            Err(Error::Config(m)) => assert!(m.contains("idem migrate"), "{m}"),
            other => panic!("{other:?}"),
        }
        let m = migrate_url(&url, None).await.unwrap();
        assert_eq!((m.from, m.to), (0, SCHEMA_VERSION));
        strict().open().await.unwrap();
        assert_eq!(migrate_url(&url, None).await.unwrap().from, SCHEMA_VERSION);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
}
