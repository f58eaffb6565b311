//! How to open a [`MysqlStore`]: the server, the table, the pool and the schema policy.

use super::schema::{self, Table, SCHEMA_VERSION};
use super::{connect_one, migrated, MysqlStore};
use crate::error::Error;
use crate::store::Migrated;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::Connection;
use std::str::FromStr;
use std::time::Duration;

/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "idem_records";

/// How to open a [`MysqlStore`]: `MysqlOptions::from_url(url)?.table("t").connect().await`, or
/// `"mysql://…".parse::<MysqlOptions>()?`.
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    pub(super) connect: MySqlConnectOptions,
    pub(super) table: String,
    max_connections: u32,
    min_connections: u32,
    pub(super) acquire_timeout: Duration,
    idle_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
    pub(super) migrate_on_open: bool,
    pub(super) complete_retry: Duration,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        MysqlOptions {
            connect: MySqlConnectOptions::new(),
            table: DEFAULT_TABLE.to_string(),
            max_connections: 16,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            max_lifetime: Some(Duration::from_secs(1800)),
            migrate_on_open: true,
            complete_retry: Duration::from_secs(10),
        }
    }
}

impl FromStr for MysqlOptions {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

impl MysqlOptions {
    /// The defaults: `localhost:3306` as `root`, table `idem_records`, 16 connections, 5 s
    /// acquire timeout, the schema created or upgraded on open, completions retried for 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults on the server at `url` (`mysql://user:password@host:port/database?…`, or
    /// `mariadb://…`); anything else is [`Error::Config`].
    pub fn from_url(url: &str) -> Result<Self, Error> {
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err(Error::Config(
                "invalid MySQL URL for idem: it must start with mysql:// or mariadb:// \
                 (mysql://user:password@host:port/database)"
                    .into(),
            ));
        }
        let connect = MySqlConnectOptions::from_str(url).map_err(|e| {
            Error::Config(format!(
                "invalid MySQL URL for idem ({e}); expected \
                 mysql://user:password@host:port/database"
            ))
        })?;
        Ok(MysqlOptions {
            connect,
            ..Self::default()
        })
    }

    /// The server's host name or address.
    pub fn host(mut self, host: &str) -> Self {
        self.connect = self.connect.host(host);
        self
    }

    /// The server's port (default 3306).
    pub fn port(mut self, port: u16) -> Self {
        self.connect = self.connect.port(port);
        self
    }

    /// The user to connect as.
    pub fn username(mut self, username: &str) -> Self {
        self.connect = self.connect.username(username);
        self
    }

    /// The user's password.
    pub fn password(mut self, password: &str) -> Self {
        self.connect = self.connect.password(password);
        self
    }

    /// The database.
    pub fn database(mut self, database: &str) -> Self {
        self.connect = self.connect.database(database);
        self
    }

    /// The table (`name` or `database.name`; letters, digits, `_`). Anything else is refused
    /// with `Error::Config` at open: the name is validated, then quoted, never interpolated raw.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Most connections the store's pool opens (default 16). Ignored by
    /// [`MysqlStore::from_pool`], whose pool is the caller's.
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

    /// Idle connections are closed after this (default 10 min; `None`: never). Keep it below
    /// the server's `wait_timeout`, after which the server closes them itself.
    pub fn idle_timeout(mut self, d: Option<Duration>) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Connections are replaced after this (default 30 min; `None`: never).
    pub fn max_lifetime(mut self, d: Option<Duration>) -> Self {
        self.max_lifetime = d;
        self
    }

    /// Create or upgrade the schema on open (default `true`). With `false`, open only checks
    /// that the schema is current, for deployments whose user may not run DDL: run
    /// [`MysqlOptions::migrate`] or the SQL of [`MysqlStore::migrations`] separately.
    pub fn migrate_on_open(mut self, yes: bool) -> Self {
        self.migrate_on_open = yes;
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

    /// Opens the store: checks (and with `migrate_on_open`, creates or upgrades) the schema on
    /// one connection, so that a server that is down fails here at once, then opens the pool.
    pub async fn connect(self) -> Result<MysqlStore, Error> {
        let table = Table::parse(&self.table)?;
        let mut conn = connect_one(&self.connect, self.acquire_timeout).await?;
        let checked = schema::ensure(&mut conn, &table, self.migrate_on_open, SCHEMA_VERSION).await;
        let _ = conn.close().await;
        checked?;
        let pool = MySqlPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(self.min_connections)
            .acquire_timeout(self.acquire_timeout)
            .idle_timeout(self.idle_timeout)
            .max_lifetime(self.max_lifetime)
            // One round trip per statement: no ping before each use. A dead connection fails
            // its step with `Error::Store` and is dropped; completions are retried (see
            // `complete_retry`).
            .test_before_acquire(false)
            .connect_lazy_with(self.connect.clone());
        Ok(MysqlStore::assemble(pool, table, &self))
    }

    /// Creates or upgrades the schema and says what it found; keeps no store open (what
    /// `idem migrate` runs, from a user that may create tables, before the application opens
    /// with `migrate_on_open(false)`).
    pub async fn migrate(self) -> Result<Migrated, Error> {
        let table = Table::parse(&self.table)?;
        let mut conn = connect_one(&self.connect, self.acquire_timeout).await?;
        let from = schema::ensure(&mut conn, &table, true, SCHEMA_VERSION).await;
        let _ = conn.close().await;
        Ok(migrated(&table, from?))
    }
}
