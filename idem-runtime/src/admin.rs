//! The operator's view of a store: list records, count them, open a store by URL without
//! creating anything, migrate one on purpose. What the `idem` command-line tool runs on.
//!
//! Nothing here decides what a record means for a call (that stays in [`crate::protocol`]):
//! every store answers [`Inspect::list`] and [`Inspect::stats`] with one query over the records
//! it keeps (one `SELECT` for SQL; a `SCAN` of the key prefix for Redis), and `show` / `release`
//! use the ordinary [`Store::get`] and [`Store::force_release`].

use crate::codec::{self, Stored};
use crate::error::Error;
use crate::key::Digest;
use crate::store::{BoxFuture, Record, Status, Store};
use std::fmt;
use std::time::Duration;

/// Which records [`Inspect::list`] returns: live records only, oldest claim first.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Filter {
    /// Only this namespace.
    pub name: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only records claimed at least this long ago (by the store's clock).
    pub older_than: Option<Duration>,
    /// At most this many records.
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            name: None,
            status: None,
            older_than: None,
            limit: 100,
        }
    }
}

impl Filter {
    /// Every live record, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only namespace `name` (`None`: every namespace).
    pub fn name(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }

    /// Only records with `status` (`None`: both).
    pub fn status(mut self, status: Option<Status>) -> Self {
        self.status = status;
        self
    }

    /// Only records claimed at least this long ago (`None`: any age).
    pub fn older_than(mut self, age: Option<Duration>) -> Self {
        self.older_than = age;
        self
    }

    /// At most `limit` records.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// True when `info` passes every condition (for stores that filter client side).
    pub fn matches(&self, info: &KeyInfo) -> bool {
        self.name.as_deref().is_none_or(|n| n == info.name)
            && self.status.is_none_or(|s| s == info.status)
            && info.expires_at > info.now
            && info.created_at <= info.now.saturating_sub(self.older_than_ms())
    }

    /// The age threshold in milliseconds (0 without one).
    pub fn older_than_ms(&self) -> i64 {
        self.older_than.map_or(0, crate::store::millis)
    }
}

/// One record as a listing shows it: everything but the stored value, whose size it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The namespace.
    pub name: String,
    /// The key's digest.
    pub key: Digest,
    /// The fingerprint of the claiming attempt's arguments.
    pub fingerprint: Digest,
    /// The fencing token.
    pub token: u64,
    /// In progress or completed.
    pub status: Status,
    /// Size of the stored result in bytes (completed records).
    pub value_size: Option<u64>,
    /// When the current attempt claimed it (ms since the epoch, store clock).
    pub created_at: i64,
    /// End of the lease or of the TTL.
    pub expires_at: i64,
    /// The store's clock when it was read.
    pub now: i64,
}

impl From<&Record> for KeyInfo {
    fn from(r: &Record) -> Self {
        KeyInfo {
            name: r.name.clone(),
            key: r.key,
            fingerprint: r.fingerprint,
            token: r.token,
            status: r.status,
            value_size: r.value.as_ref().map(|v| v.len() as u64),
            created_at: r.created_at,
            expires_at: r.expires_at,
            now: r.now,
        }
    }
}

/// What [`Inspect::stats`] counts a record as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Live and in progress.
    InProgress,
    /// Live and completed.
    Completed,
    /// No longer live, still stored: the next purge deletes it.
    Expired,
}

impl State {
    /// The state of a record with this status and expiry at `now`.
    pub fn of(status: Status, expires_at: i64, now: i64) -> State {
        match status {
            _ if !crate::protocol::is_live(expires_at, now) => State::Expired,
            Status::InProgress => State::InProgress,
            Status::Completed => State::Completed,
        }
    }

    /// From the number a SQL `CASE` computes: 0 in progress, 1 completed, 2 expired.
    pub fn from_code(code: i64) -> Option<State> {
        match code {
            0 => Some(State::InProgress),
            1 => Some(State::Completed),
            2 => Some(State::Expired),
            _ => None,
        }
    }
}

/// How many records of one namespace are in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The namespace.
    pub name: String,
    /// The state counted.
    pub state: State,
    /// How many.
    pub count: u64,
}

/// A store an operator can look into.
pub trait Inspect: Store {
    /// The live records that pass `filter`, oldest claim first, at most `filter.limit`.
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>>;

    /// Counts of every stored record by namespace and state, sorted by namespace.
    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>>;
}

/// Sorts and truncates a client-side listing the way the SQL stores order theirs.
pub(crate) fn finish_listing(mut rows: Vec<KeyInfo>, filter: &Filter) -> Vec<KeyInfo> {
    rows.sort_by_key(|r| (r.created_at, r.key));
    rows.truncate(filter.limit);
    rows
}

/// Adds up counts per `(name, state)` for stores that count client side.
pub(crate) fn count_states(items: impl IntoIterator<Item = (String, State)>) -> Vec<Stat> {
    let mut counts = std::collections::BTreeMap::<(String, State), u64>::new();
    for k in items {
        *counts.entry(k).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((name, state), count)| Stat { name, state, count })
        .collect()
}

/// Deletes expired records in batches of `batch`, calling `progress` with the running total
/// after every batch. Returns the total.
pub async fn purge_expired(
    store: &dyn Store,
    batch: usize,
    mut progress: impl FnMut(u64),
) -> Result<u64, Error> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let start = crate::observe::TIME_BACKGROUND.then(std::time::Instant::now);
        let n = store.purge_expired(batch).await?;
        if let Some(start) = start {
            crate::observe::store_latency(store.backend(), "purge", start.elapsed());
        }
        total += n;
        progress(total);
        if (n as usize) < batch {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// A stored result, split into its kind and its JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredValue<'a> {
    /// An `Ok` value, as JSON.
    Ok(&'a [u8]),
    /// A kept `Err` value (`on_error = keep`), as JSON.
    Err(&'a [u8]),
}

/// Splits a stored result into its kind and JSON; `Error::Codec` when it is not a value this
/// version of idem wrote.
pub fn stored_value(bytes: &[u8]) -> Result<StoredValue<'_>, Error> {
    Ok(match codec::split::<()>(bytes)? {
        Stored::Ok(json) => StoredValue::Ok(json),
        Stored::Err(json) => StoredValue::Err(json),
    })
}

/// Where a store keeps its records: the table or the key prefix (`None`: the store's default).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Target {
    /// The SQL table (SQLite default `idem_keys`, PostgreSQL default `idem_records`).
    pub table: Option<String>,
    /// The Redis key prefix (default `idem`).
    pub prefix: Option<String>,
}

impl Target {
    /// The table (SQL stores) and the key prefix (Redis); `None`: the store's default.
    pub fn new(table: Option<String>, prefix: Option<String>) -> Self {
        Target { table, prefix }
    }
}

/// Why [`open`] could not give a store.
#[derive(Debug)]
pub enum OpenError {
    /// The schema is missing or older than this version of idem reads: run a migration.
    NotMigrated {
        /// What was found, for the message (`no SQLite database file at …`, `table … at
        /// version 0`).
        what: String,
    },
    /// Any other failure: a bad URL ([`Error::Config`]), an unreachable server, no rights.
    Error(Error),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotMigrated { what } => write!(f, "{what}"),
            OpenError::Error(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<Error> for OpenError {
    fn from(e: Error) -> Self {
        OpenError::Error(e)
    }
}

/// The backend a URL names: `sqlite`, `postgres` or `redis`.
pub fn scheme(url: &str) -> Result<&'static str, Error> {
    let head = url.split(':').next().unwrap_or_default();
    match head {
        "sqlite" => Ok("sqlite"),
        "postgres" | "postgresql" => Ok("postgres"),
        "redis" | "rediss" | "unix" | "redis+unix" => Ok("redis"),
        _ => Err(Error::Config(format!(
            "unsupported store URL scheme `{head}`: use sqlite://FILE, \
             postgres://USER@HOST:PORT/DATABASE or redis://HOST:PORT/"
        ))),
    }
}

fn not_built(backend: &str) -> Error {
    Error::Config(format!(
        "this build of idem has no {backend} support: rebuild with the `{backend}` feature"
    ))
}

/// Opens the store at `url` for inspection, creating nothing: a database that was never
/// migrated is [`OpenError::NotMigrated`].
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
    allow(unused_variables) // `target` only names a table or prefix of a built-in backend
)]
pub async fn open(url: &str, target: &Target) -> Result<Box<dyn Inspect>, OpenError> {
    match scheme(url)? {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Box::new(
            crate::store::sqlite::open_existing(url, target.table.as_deref()).await?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" => Ok(Box::new(
            crate::store::postgres::inspect::open_existing(url, target.table.as_deref()).await?,
        )),
        #[cfg(feature = "redis")]
        "redis" => {
            let mut options = crate::store::redis::RedisStore::options();
            if let Some(p) = &target.prefix {
                options = options.key_prefix(p);
            }
            Ok(Box::new(options.open(url).await?))
        }
        other => Err(not_built(other).into()),
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The backend.
    pub backend: &'static str,
    /// The schema version found before (0: none).
    pub from: i64,
    /// The schema version now (equal to `from` when nothing was to do; 0 for Redis, which has
    /// no schema).
    pub to: i64,
    /// Where: the table, or the key prefix.
    pub location: String,
}

/// Creates or upgrades the schema of the store at `url` (a missing SQLite file is created).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "redis")),
    allow(unused_variables) // `target` only names a table or prefix of a built-in backend
)]
pub async fn migrate(url: &str, target: &Target) -> Result<Migrated, Error> {
    match scheme(url)? {
        #[cfg(feature = "sqlite")]
        "sqlite" => crate::store::sqlite::migrate_url(url, target.table.as_deref()).await,
        #[cfg(feature = "postgres")]
        "postgres" => {
            crate::store::postgres::inspect::migrate_url(url, target.table.as_deref()).await
        }
        #[cfg(feature = "redis")]
        "redis" => {
            // No schema; opening checks the server (version, rights to load the scripts).
            let prefix = target.prefix.clone().unwrap_or_else(|| "idem".into());
            crate::store::redis::RedisStore::options()
                .key_prefix(&prefix)
                .open(url)
                .await?;
            Ok(Migrated {
                backend: "redis",
                from: 0,
                to: 0,
                location: format!("key prefix {prefix}"),
            })
        }
        other => Err(not_built(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(scheme("sqlite://a.db").unwrap(), "sqlite");
        assert_eq!(scheme("sqlite::memory:").unwrap(), "sqlite");
        assert_eq!(scheme("postgresql://u@h/d").unwrap(), "postgres");
        assert_eq!(scheme("redis://127.0.0.1/").unwrap(), "redis");
        assert!(matches!(scheme("mysql://x"), Err(Error::Config(_))));
        assert!(matches!(scheme("idem_records"), Err(Error::Config(_))));
    }

    /// The memory store answers like the SQL ones: live records only, filters composed,
    /// oldest first, expired ones counted apart.
    #[tokio::test]
    async fn memory_store_lists_and_counts() {
        use crate::store::memory::MemoryStore;
        use crate::store::{Claim, ClaimOutcome, Complete};
        let store = MemoryStore::new();
        let fp = crate::key::fingerprint_digest(b"fp");
        for (i, (name, ttl)) in [("a", 60_000), ("a", 60_000), ("b", 1), ("c", 0)]
            .into_iter()
            .enumerate()
        {
            let key = crate::key::key_digest(name, None, &[i as u8]);
            let claim = Claim {
                name,
                key: &key,
                fingerprint: &fp,
                lease: Duration::from_secs(60),
            };
            let ClaimOutcome::Claimed { token } = store.claim(claim).await.unwrap() else {
                panic!("fresh key")
            };
            if ttl > 0 {
                let done = Complete {
                    key: &key,
                    token,
                    value: b"abc",
                    ttl: Duration::from_millis(ttl),
                };
                assert!(store.complete(done).await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let all = store.list(&Filter::default()).await.unwrap();
        assert_eq!(all.len(), 3, "the expired record is not listed");
        assert!(all.windows(2).all(|w| w[0].created_at <= w[1].created_at));
        let filter = Filter::new().name(Some("a".into()));
        let a = store.list(&filter).await.unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].value_size, Some(3));
        let filter = filter.limit(1);
        assert_eq!(store.list(&filter).await.unwrap().len(), 1);
        let filter = filter.older_than(Some(Duration::from_secs(60)));
        assert!(store.list(&filter).await.unwrap().is_empty());
        let filter = Filter::new().status(Some(Status::InProgress));
        let c = store.list(&filter).await.unwrap();
        assert_eq!(
            (c.len(), c[0].name.as_str(), c[0].value_size),
            (1, "c", None)
        );

        let stats = store.stats().await.unwrap();
        let stat = |name: &str, state| Stat {
            name: name.into(),
            state,
            count: 0,
        };
        let expect = [
            Stat {
                count: 2,
                ..stat("a", State::Completed)
            },
            Stat {
                count: 1,
                ..stat("b", State::Expired)
            },
            Stat {
                count: 1,
                ..stat("c", State::InProgress)
            },
        ];
        assert_eq!(stats, expect);
    }

    #[test]
    fn states() {
        assert_eq!(State::of(Status::InProgress, 10, 5), State::InProgress);
        assert_eq!(State::of(Status::Completed, 10, 5), State::Completed);
        assert_eq!(State::of(Status::Completed, 10, 10), State::Expired);
        assert_eq!(State::from_code(2), Some(State::Expired));
        assert_eq!(State::from_code(3), None);
    }
}
