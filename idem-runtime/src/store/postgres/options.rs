//! How to open a [`PostgresStore`]: the server, the table, the pool and the schema policy.

use super::schema::{self, Table};
use super::{connect_one, PostgresStore, SCHEMA_VERSION};
use crate::error::Error;
use crate::store::{Backend, Migrated, DEFAULT_TABLE};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::Connection;
use std::str::FromStr;
use std::time::Duration;

/// How to open a [`PostgresStore`]: `PostgresOptions::from_url(url)?.table("t").connect().await`,
/// or `"postgres://…".parse::<PostgresOptions>()?`.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub(super) connect: PgConnectOptions,
    pub(super) table: String,
    pub(super) max_connections: u32,
    pub(super) min_connections: u32,
    pub(super) acquire_timeout: Duration,
    pub(super) idle_timeout: Option<Duration>,
    pub(super) max_lifetime: Option<Duration>,
    pub(super) application_name: Option<String>,
    pub(super) migrate_on_open: bool,
    pub(super) notify: bool,
    pub(super) complete_retry: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            connect: PgConnectOptions::new(),
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

impl FromStr for PostgresOptions {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

impl PostgresOptions {
    /// The defaults: the server of the `PG*` environment variables (as `psql` finds it), table
    /// `idem_records`, 16 connections, 5 s acquire timeout, the schema created or upgraded on
    /// open, notifications on, completions retried for 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults on the server at `url` (`postgres://user:password@host:port/database?…`);
    /// anything else is [`Error::Config`].
    pub fn from_url(url: &str) -> Result<Self, Error> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::config(
                "invalid PostgreSQL URL for idem: it must start with postgres:// or \
                 postgresql:// (postgres://user:password@host:port/database)",
            ));
        }
        let connect = PgConnectOptions::from_str(url).map_err(|e| {
            Error::config(format!(
                "invalid PostgreSQL URL for idem ({e}); expected \
                 postgres://user:password@host:port/database"
            ))
        })?;
        Ok(PostgresOptions {
            connect,
            ..Self::default()
        })
    }

    /// The server's host name or address (or the directory of its Unix socket).
    pub fn host(mut self, host: &str) -> Self {
        self.connect = self.connect.host(host);
        self
    }

    /// The server's port (default 5432).
    pub fn port(mut self, port: u16) -> Self {
        self.connect = self.connect.port(port);
        self
    }

    /// The role to connect as.
    pub fn username(mut self, username: &str) -> Self {
        self.connect = self.connect.username(username);
        self
    }

    /// The role's password.
    pub fn password(mut self, password: &str) -> Self {
        self.connect = self.connect.password(password);
        self
    }

    /// The database.
    pub fn database(mut self, database: &str) -> Self {
        self.connect = self.connect.database(database);
        self
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
    /// that the schema is current (an `Error::Store` of kind `SchemaMissing`,
    /// `SchemaOutdated` or `SchemaNewer` when it is not), for deployments whose role may not
    /// run DDL: run [`PostgresOptions::migrate`] or the SQL of [`PostgresStore::migrations`]
    /// separately.
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

    /// The connect options with the application name.
    pub(super) fn connect_options(&self) -> PgConnectOptions {
        match &self.application_name {
            Some(app) => self.connect.clone().application_name(app),
            None => self.connect.clone(),
        }
    }

    /// Opens the store: checks (and with `migrate_on_open`, creates or upgrades) the schema on
    /// one connection, so that a server that is down fails here at once, then opens the pool.
    pub async fn connect(self) -> Result<PostgresStore, Error> {
        let table = Table::parse(&self.table)?;
        let connect = self.connect_options();
        let mut conn = connect_one(&connect, self.acquire_timeout).await?;
        let checked = schema::ensure(&mut conn, &table, self.migrate_on_open, SCHEMA_VERSION).await;
        let _ = conn.close().await;
        checked?;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(self.min_connections)
            .acquire_timeout(self.acquire_timeout)
            .idle_timeout(self.idle_timeout)
            .max_lifetime(self.max_lifetime)
            // One round trip per step: no ping before each use. A dead connection fails its
            // step with `Error::Store` and is dropped; completions are retried (see
            // `complete_retry`).
            .test_before_acquire(false)
            .connect_lazy_with(connect);
        Ok(PostgresStore::assemble(pool, table, &self))
    }

    /// Creates or upgrades the schema and says what it found; keeps no store open (what
    /// `idem migrate` runs, from a role that may create tables).
    pub async fn migrate(self) -> Result<Migrated, Error> {
        let table = Table::parse(&self.table)?;
        let mut conn = connect_one(&self.connect_options(), self.acquire_timeout).await?;
        let from = schema::ensure(&mut conn, &table, true, SCHEMA_VERSION).await;
        let _ = conn.close().await;
        Ok(Migrated::new(
            Backend::Postgres,
            from?,
            SCHEMA_VERSION,
            format!("table {}", table.display),
        ))
    }
}
