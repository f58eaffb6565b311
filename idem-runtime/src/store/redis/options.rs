//! How to open a [`RedisStore`]: the server, the key prefix, timeouts, retries and the value
//! size limit.

use super::{RedisStore, DEFAULT_MAX_VALUE};
use crate::error::Error;
use crate::store::{Backend, Migrated};
use ::redis::Client;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The server of [`RedisOptions::new`].
const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";
/// The first part of every key unless [`RedisOptions::key_prefix`] says otherwise: Redis's
/// counterpart of the SQL stores' table, and kept as it is so that existing keys stay found.
pub(super) const DEFAULT_PREFIX: &str = "idem";

fn client(url: &str) -> Result<Client, Error> {
    Client::open(url).map_err(|e| Error::config(format!("invalid Redis URL: {e}")))
}

impl FromStr for RedisOptions {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::from_url(url)
    }
}

/// Options of a [`RedisStore`]: `RedisOptions::from_url(url)?.key_prefix("app").connect().await`,
/// or `"redis://…".parse::<RedisOptions>()?`.
#[derive(Clone)]
pub struct RedisOptions {
    pub(super) client: Client,
    /// The nodes of a Redis Cluster to start from, when this is one ([`RedisOptions::cluster`]).
    pub(super) cluster: Option<Vec<String>>,
    pub(super) key_prefix: String,
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) retries: u32,
    pub(super) max_value_size: usize,
    /// `WAIT numreplicas timeout` after a claim and a completion ([`RedisOptions::wait_for_replicas`]).
    pub(super) replicas: Option<(u32, Duration)>,
}

/// Everything but the client, whose connection info holds the password.
impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("cluster", &self.cluster.as_ref().map(Vec::len))
            .field("key_prefix", &self.key_prefix)
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("retries", &self.retries)
            .field("max_value_size", &self.max_value_size)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            client: client(DEFAULT_URL).expect("the default URL parses"),
            cluster: None,
            key_prefix: DEFAULT_PREFIX.to_string(),
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            retries: 2,
            max_value_size: DEFAULT_MAX_VALUE,
            replicas: None,
        }
    }
}

impl RedisOptions {
    /// The defaults, on the server at `redis://127.0.0.1:6379/`: prefix `idem`, timeouts 2 s,
    /// 2 retries, values up to 512 MB.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults on the server at `url` (`redis://[:password@]host[:port][/db]`,
    /// `rediss://…`, `unix:///path`); a URL that does not parse is [`Error::Config`].
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Ok(RedisOptions {
            client: client(url)?,
            ..Self::default()
        })
    }

    /// The defaults on a Redis Cluster, found from `nodes` (`redis://host:port/` of any of its
    /// nodes; one is enough, more help when one is down). The store follows the cluster's
    /// `MOVED` and `ASK` redirections and runs each step on the primary that owns the key's slot.
    /// An empty list or a URL that does not parse is [`Error::Config`].
    pub fn cluster(nodes: &[&str]) -> Result<Self, Error> {
        if nodes.is_empty() {
            return Err(Error::config(
                "a Redis Cluster needs at least one node URL, e.g. redis://127.0.0.1:7000/",
            ));
        }
        for node in nodes {
            client(node)?;
        }
        Ok(RedisOptions {
            cluster: Some(nodes.iter().map(|n| n.to_string()).collect()),
            ..Self::default()
        })
    }

    /// The defaults on an application's own client (its server and connection settings).
    pub fn from_client(client: Client) -> Self {
        RedisOptions {
            client,
            ..Self::default()
        }
    }

    /// The first part of every key (`<prefix>:v1:{<digest>}`): 1 to 64 characters of
    /// `A-Z a-z 0-9 _ - . :`. Handles with different prefixes on one server are separate
    /// idempotency spaces. A prefix with spaces, braces or other characters is refused with
    /// [`Error::Config`] when the store is opened.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long opening a connection may take (the first one and every reconnection).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the server may take to answer one request.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a step that failed with a connection error is sent again after the
    /// connection is re-established (0: never). Timeouts are not retried.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The largest result that is stored, in bytes (also capped by the server's
    /// `proto-max-bulk-len` when the server lets us read it). A larger result is refused with
    /// [`Error::Store`] before anything is sent, and its claim is released, so a retry can run.
    pub fn max_value_size(mut self, bytes: usize) -> Self {
        self.max_value_size = bytes;
        self
    }

    /// Durability against a failover: after each claim and each completion, `WAIT numreplicas
    /// timeout` on the key's primary. A claim that fewer than `numreplicas` replicas
    /// acknowledged within `timeout` is released and the call fails with a
    /// [`StoreErrorKind::Timeout`](crate::StoreErrorKind::Timeout) store error before its body
    /// runs (a retry may find the replicas back); a completion that too few acknowledged is
    /// kept and logged, since its body has already run. Off by default.
    ///
    /// Redis replicates asynchronously: without this, a claim the primary acknowledged and then
    /// lost in a failover (before its replica had it) is gone, and a retry runs the body again.
    /// With it, that window closes for every write a replica acknowledged; `WAIT` still does not
    /// make Redis strongly consistent (a failover may promote a replica that had not
    /// acknowledged). docs/redis.md has the measured cost and what a failover does. `timeout`
    /// must be shorter than the response timeout, and `numreplicas` at least 1.
    pub fn wait_for_replicas(mut self, numreplicas: u32, timeout: Duration) -> Self {
        self.replicas = Some((numreplicas, timeout));
        self
    }

    /// Opens the store: one managed connection, the scripts loaded.
    ///
    /// A server that cannot be reached, refuses the password or is older than Redis 7 is
    /// [`Error::Store`] with `op = "open"` and the matching
    /// [`StoreErrorKind`](crate::StoreErrorKind).
    pub async fn connect(self) -> Result<RedisStore, Error> {
        match self.cluster.clone() {
            Some(nodes) => RedisStore::open_cluster(&nodes, self).await,
            None => {
                let client = self.client.clone();
                RedisStore::open_on(client, self).await
            }
        }
    }

    /// Redis has no schema: checks that the server is reachable and takes idem's scripts, and
    /// says so (what `idem migrate` runs).
    pub async fn migrate(self) -> Result<Migrated, Error> {
        let location = format!("key prefix {}", self.key_prefix);
        self.connect().await?;
        Ok(Migrated::new(Backend::Redis, 0, 0, location))
    }

    /// Opens a store at `url` with these options.
    #[deprecated(
        since = "0.2.0",
        note = "use `RedisOptions::from_url(url)?` with the settings, then `.connect()`"
    )]
    pub async fn open(self, url: &str) -> Result<RedisStore, Error> {
        let client = client(url)?;
        RedisOptions {
            client,
            cluster: None,
            ..self
        }
        .connect()
        .await
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let p = &self.key_prefix;
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
        if p.is_empty() || p.len() > 64 || !p.chars().all(ok_char) {
            return Err(Error::config(format!(
                "invalid Redis key prefix {p:?}: use 1 to 64 characters of A-Z a-z 0-9 _ - . : \
                 (no spaces, no braces: braces would change the Redis Cluster hash tag)"
            )));
        }
        if let Some((n, timeout)) = self.replicas {
            if n == 0 || timeout.is_zero() || timeout >= self.response_timeout {
                return Err(Error::config(format!(
                    "Redis wait_for_replicas({n}, {timeout:?}): numreplicas must be at least 1 \
                     and the timeout above zero and shorter than the response timeout ({:?})",
                    self.response_timeout
                )));
            }
        }
        for (what, d) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::config(format!(
                    "Redis {what} must be greater than zero"
                )));
            }
        }
        Ok(())
    }
}
