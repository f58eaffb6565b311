//! How to open a [`SqliteStore`]: a URL or a file, the table, the pool and the schema policy.

use super::{schema, SqliteStore, BACKEND};
use crate::error::{Error, StoreErrorKind};
use crate::store::{Migrated, DEFAULT_TABLE};
use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Options of a [`SqliteStore`]: `SqliteOptions::from_url(url)?.table("t").connect().await`,
/// or `"sqlite://app.db".parse::<SqliteOptions>()?`.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    source: Source,
    pub(super) table: String,
    /// True when the table was left at its default (a file written by an earlier idem then
    /// keeps the table it has; see the module docs).
    pub(super) default_table: bool,
    pub(super) busy_timeout: Duration,
    synchronous: SqliteSynchronous,
    max_connections: u32,
    pub(super) migrate_on_open: bool,
}

/// Where the database is.
#[derive(Debug, Clone)]
enum Source {
    Url(String),
    File(PathBuf),
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            source: Source::Url("sqlite::memory:".into()),
            table: DEFAULT_TABLE.into(),
            default_table: true,
            busy_timeout: Duration::from_secs(5),
            synchronous: SqliteSynchronous::Full,
            max_connections: 4,
            migrate_on_open: true,
        }
    }
}

impl FromStr for SqliteOptions {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

impl SqliteOptions {
    /// The defaults, on a private in-memory database (`sqlite::memory:`): table
    /// `idem_records`, 4 connections, 5 s busy timeout, `synchronous=FULL`, the schema
    /// created on open. Name a file with [`filename`](Self::filename).
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults on the database at `url` (`sqlite::memory:`, `sqlite://file.db`,
    /// `sqlite:file.db?mode=rwc`); a URL that does not parse is [`Error::Config`].
    pub fn from_url(url: &str) -> Result<Self, Error> {
        parse(url)?;
        Ok(Self::unchecked(url))
    }

    /// The defaults on `url`, parsed only when the store connects.
    pub(super) fn unchecked(url: &str) -> Self {
        SqliteOptions {
            source: Source::Url(url.to_string()),
            ..Self::default()
        }
    }

    /// The database file (created when missing, unless
    /// [`migrate_on_open`](Self::migrate_on_open) is off).
    pub fn filename(mut self, path: impl Into<PathBuf>) -> Self {
        self.source = Source::File(path.into());
        self
    }

    /// The table name (default `idem_records`); letters, digits and `_` only.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_string();
        self.default_table = false;
        self
    }

    /// How long a statement waits for a lock held by another connection or process before it
    /// fails with `Error::Store` of kind [`Busy`](StoreErrorKind::Busy) (default 5 s).
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

    /// Create the file and the schema when missing, and upgrade an older schema (default
    /// `true`). With `false`, nothing is created or changed: a missing file is an error of kind
    /// [`DatabaseMissing`](StoreErrorKind::DatabaseMissing), a missing or older schema one of
    /// kind [`SchemaMissing`](StoreErrorKind::SchemaMissing) /
    /// [`SchemaOutdated`](StoreErrorKind::SchemaOutdated): for tools that must not create a
    /// database by mistake.
    pub fn migrate_on_open(mut self, yes: bool) -> Self {
        self.migrate_on_open = yes;
        self
    }

    /// Opens the database, creating a missing file and the schema (unless
    /// [`migrate_on_open`](Self::migrate_on_open) is off).
    pub async fn connect(self) -> Result<SqliteStore, Error> {
        let store = SqliteStore::connect_with(&self).await?;
        if self.migrate_on_open {
            schema::ensure(&store).await?;
        } else {
            schema::check(&store).await?;
        }
        Ok(store)
    }

    /// Creates the file and brings the schema up to date, and says what it found; keeps no
    /// store open (what `idem migrate` runs).
    pub async fn migrate(self) -> Result<Migrated, Error> {
        let store = SqliteStore::connect_with(&self.migrate_on_open(true)).await?;
        let from = schema::ensure(&store).await?;
        Ok(Migrated::new(
            super::Backend::Sqlite,
            from,
            schema::SCHEMA_VERSION,
            format!("table {}", store.table),
        ))
    }

    /// The connect options, with the busy timeout and durability settings.
    pub(super) fn connect_options(&self) -> Result<SqliteConnectOptions, Error> {
        let connect = match &self.source {
            Source::Url(url) => parse(url)?,
            Source::File(path) => SqliteConnectOptions::new().filename(path),
        };
        Ok(connect
            .create_if_missing(self.migrate_on_open)
            .busy_timeout(self.busy_timeout)
            .synchronous(self.synchronous))
    }

    /// True for an in-memory database.
    pub(super) fn in_memory(&self) -> bool {
        match &self.source {
            Source::Url(url) => url.contains(":memory:") || url.contains("mode=memory"),
            Source::File(_) => false,
        }
    }

    /// The database as the user named it, for messages.
    pub(super) fn display(&self) -> String {
        match &self.source {
            Source::Url(url) => url.clone(),
            Source::File(path) => path.display().to_string(),
        }
    }

    pub(super) fn max_connections_value(&self) -> u32 {
        self.max_connections
    }
}

fn parse(url: &str) -> Result<SqliteConnectOptions, Error> {
    SqliteConnectOptions::from_str(url)
        .map_err(|e| Error::config(format!("`{url}` is not a SQLite URL: {e}")))
}

/// The error of a strict open on a file that does not exist.
pub(super) fn no_file(path: &std::path::Path) -> Error {
    Error::store_kind(
        BACKEND,
        "open",
        StoreErrorKind::DatabaseMissing,
        format!(
            "there is no SQLite database file at {}: check the path, or create it by opening \
             it with migrate_on_open",
            path.display()
        ),
    )
}
