//! The operator's view of a store: list records, count them, open a store by URL without
//! creating anything, migrate one on purpose. What the `idem` command-line tool runs on.
//!
//! The queries themselves are the stores' ([`Inspect`], in [`crate::store`]); `show` and
//! `release` use the ordinary [`Store::get`] and [`Store::force_release`]. Failures come back as
//! [`Error`]s whose [`StoreErrorKind`](crate::StoreErrorKind) says what went wrong (a missing or
//! outdated schema, refused credentials, an unreachable server), whatever the backend.

use crate::codec::{self, Stored};
use crate::error::Error;
use crate::store::{Backend, Resolve, Store};

pub use crate::store::Resolved;

pub use crate::store::{
    summary_name, Cursor, Filter, Inspect, KeyInfo, Migrated, NameSummary, Overview, PageQuery,
    Stat, State,
};

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

/// An operator's verdict on a parked key as a tool gives it ([`resolve`]): the value as JSON,
/// since a tool does not know the function's result type.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The parked attempt's effect happened: callers get `value` as if the body had returned
    /// it (it must decode as the function's result type, or the next call gets an
    /// [`Error::Codec`]), replayed for `ttl`.
    Applied {
        /// The result, as JSON (`null` for a function returning `()` or `None`).
        value: serde_json::Value,
        /// How long it is kept and replayed.
        ttl: std::time::Duration,
    },
    /// It did not happen: the key is freed and the next call runs the body.
    NotApplied,
}

/// Resolves the parked key `key` ([`Store::resolve`]): [`Resolved::Done`] with the parked record
/// as it was, or [`Resolved::NotParked`] with the live record found (completed, in progress;
/// `None`: the key is free), nothing changed. The value is stored unsealed: a handle with a
/// keyring or compression reads it all the same.
pub async fn resolve(
    store: &dyn Store,
    key: &crate::key::Digest,
    verdict: &Verdict,
) -> Result<Resolved, Error> {
    let encoded;
    let resolution = match verdict {
        Verdict::Applied { value, ttl } => {
            encoded = codec::encode_ok(value)?;
            Resolve::Applied {
                value: &encoded,
                ttl: *ttl,
            }
        }
        Verdict::NotApplied => Resolve::NotApplied,
    };
    store.resolve(key, resolution).await
}

/// A stored result, split into its kind and its JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredValue<'a> {
    /// An `Ok` value, as JSON.
    Ok(&'a [u8]),
    /// A kept `Err` value (`on_error = keep`), as JSON.
    Err(&'a [u8]),
}

/// The encoded (format-1) result inside a record's stored value, decompressed (feature
/// `compression`); split it with [`stored_value`]. An encrypted value is [`Error::Codec`] of
/// kind [`UnknownKey`](crate::CodecErrorKind::UnknownKey): see [`open_value_with`].
pub fn open_value(record: &crate::store::Record) -> Result<std::borrow::Cow<'_, [u8]>, Error> {
    open_with_codec(&codec::Codec::new(None), record)
}

/// [`open_value`], decrypting with `keyring` (feature `encryption`).
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub fn open_value_with<'a>(
    record: &'a crate::store::Record,
    keyring: &crate::codec::Keyring,
) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
    let mut opener = codec::Codec::new(None);
    opener.keyring = Some(std::sync::Arc::new(keyring.clone()));
    open_with_codec(&opener, record)
}

fn open_with_codec<'a>(
    opener: &codec::Codec,
    record: &'a crate::store::Record,
) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
    let stored = record.value.as_deref().unwrap_or_default();
    opener.open("value", &record.name, &record.key, stored)
}

/// Splits a stored result into its kind and JSON; `Error::Codec` when it is not a value this
/// version of idem wrote.
pub fn stored_value(bytes: &[u8]) -> Result<StoredValue<'_>, Error> {
    Ok(match codec::split::<()>(bytes)? {
        Stored::Ok(json) => StoredValue::Ok(json),
        Stored::Err(json) => StoredValue::Err(json),
    })
}

/// Where a store keeps its records, and how the tool shows itself to the server.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Target {
    /// The SQL table (default `idem_records`).
    pub table: Option<String>,
    /// The Redis key prefix (default `idem`).
    pub prefix: Option<String>,
    /// The name the connections give themselves, where the server shows one (PostgreSQL's
    /// `application_name`).
    pub application_name: Option<String>,
}

impl Target {
    /// The table (SQL stores) and the key prefix (Redis); `None`: the store's default.
    pub fn new(table: Option<String>, prefix: Option<String>) -> Self {
        Target {
            table,
            prefix,
            application_name: None,
        }
    }

    /// The name the connections give themselves (PostgreSQL's `application_name`).
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }
}

/// The backend a URL names: `sqlite`, `postgres`, `mysql`, `redis` or `dynamodb`.
pub fn scheme(url: &str) -> Result<Backend, Error> {
    Ok(Backend::from_url(url)?)
}

#[cfg_attr(
    all(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "dynamodb"
    ),
    allow(dead_code) // every backend the scheme names is built in
)]
fn not_built(backend: Backend) -> Error {
    Error::config(format!(
        "this build of idem has no {backend} support: rebuild with the `{backend}` feature"
    ))
}

/// Opens the store at `url` for inspection, creating nothing: a database or schema that is
/// missing or out of date is an [`Error::Store`] of a schema kind
/// ([`StoreErrorKind::is_schema`](crate::StoreErrorKind::is_schema)) or of kind
/// [`DatabaseMissing`](crate::StoreErrorKind::DatabaseMissing).
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "dynamodb"
    )),
    allow(unused_variables) // `target` only names a table or prefix of a built-in backend
)]
pub async fn open(url: &str, target: &Target) -> Result<Box<dyn Inspect>, Error> {
    match scheme(url)? {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let mut options = crate::store::sqlite::SqliteOptions::from_url(url)?;
            if let Some(t) = &target.table {
                options = options.table(t);
            }
            Ok(Box::new(options.migrate_on_open(false).connect().await?))
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => Ok(Box::new(
            postgres_options(url, target)?
                .migrate_on_open(false)
                .connect()
                .await?,
        )),
        #[cfg(feature = "mysql")]
        Backend::Mysql => Ok(Box::new(
            mysql_options(url, target)?
                .migrate_on_open(false)
                .connect()
                .await?,
        )),
        #[cfg(feature = "redis")]
        Backend::Redis => Ok(Box::new(redis_options(url, target)?.connect().await?)),
        #[cfg(feature = "dynamodb")]
        Backend::DynamoDb => Ok(Box::new(
            dynamodb_options(url, target)?
                .create_table(false)
                .connect()
                .await?,
        )),
        other => Err(not_built(other)),
    }
}

/// A PostgreSQL store for one operator's command: two connections, no listener.
#[cfg(feature = "postgres")]
fn postgres_options(
    url: &str,
    target: &Target,
) -> Result<crate::store::postgres::PostgresOptions, Error> {
    let mut options = crate::store::postgres::PostgresOptions::from_url(url)?
        .max_connections(2)
        .notify(false);
    if let Some(t) = &target.table {
        options = options.table(t);
    }
    if let Some(name) = &target.application_name {
        options = options.application_name(name);
    }
    Ok(options)
}

/// A MySQL store for one operator's command: two connections. (MySQL shows no client-given
/// name to operators that sqlx can set, so `application_name` is not used.)
#[cfg(feature = "mysql")]
fn mysql_options(url: &str, target: &Target) -> Result<crate::store::mysql::MysqlOptions, Error> {
    let mut options = crate::store::mysql::MysqlOptions::from_url(url)?.max_connections(2);
    if let Some(t) = &target.table {
        options = options.table(t);
    }
    Ok(options)
}

/// A DynamoDB store for one operator's command: the table from the URL (`dynamodb://TABLE`) or
/// the target; region, credentials and endpoint from the URL and the AWS environment.
#[cfg(feature = "dynamodb")]
fn dynamodb_options(
    url: &str,
    target: &Target,
) -> Result<crate::store::dynamodb::DynamoDbOptions, Error> {
    let mut options = crate::store::dynamodb::DynamoDbOptions::from_url(url)?;
    if let Some(t) = &target.table {
        options = options.table(t);
    }
    Ok(options)
}

#[cfg(feature = "redis")]
fn redis_options(url: &str, target: &Target) -> Result<crate::store::redis::RedisOptions, Error> {
    let mut options = crate::store::redis::RedisOptions::from_url(url)?;
    if let Some(p) = &target.prefix {
        options = options.key_prefix(p);
    }
    Ok(options)
}

/// Creates or upgrades the schema of the store at `url` (a missing SQLite file is created);
/// for Redis, which has no schema, checks that the server takes idem's scripts.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "dynamodb"
    )),
    allow(unused_variables) // `target` only names a table or prefix of a built-in backend
)]
pub async fn migrate(url: &str, target: &Target) -> Result<Migrated, Error> {
    match scheme(url)? {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let mut options = crate::store::sqlite::SqliteOptions::from_url(url)?;
            if let Some(t) = &target.table {
                options = options.table(t);
            }
            options.migrate().await
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => postgres_options(url, target)?.migrate().await,
        #[cfg(feature = "mysql")]
        Backend::Mysql => mysql_options(url, target)?.migrate().await,
        #[cfg(feature = "redis")]
        Backend::Redis => redis_options(url, target)?.migrate().await,
        #[cfg(feature = "dynamodb")]
        Backend::DynamoDb => dynamodb_options(url, target)?.migrate().await,
        other => Err(not_built(other)),
    }
}
