//! The connection of a Redis store: opening it (scripts loaded, limits read), running one
//! script with retries on a lost connection.

use super::cluster::{self, Conn};
use super::error::store_err;
use super::notifier::{Notifier, Source};
use super::scripts::{Publish, Scripts};
use super::{RedisOptions, RedisStore, BACKEND};
use crate::error::{Error, StoreErrorKind};
use crate::store::ReleaseHub;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, Script, Value};
use std::sync::Arc;
use std::time::Duration;

/// Room left for the other arguments of a request under the server's bulk length limit.
const BULK_HEADROOM: usize = 4096;

impl RedisStore {
    /// Connects with `options` on `client`: a managed connection for the steps, the scripts
    /// loaded, the server's value size limit read; the pub/sub connection opens with the first
    /// waiter.
    pub(super) async fn open_on(
        client: Client,
        options: RedisOptions,
    ) -> Result<RedisStore, Error> {
        options.validate()?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(options.connection_timeout)
            .set_response_timeout(options.response_timeout)
            // One attempt per reconnection; `run` paces its own retries.
            .set_number_of_retries(0);
        let open = ConnectionManager::new_with_config(client.clone(), config);
        let budget = options.connection_timeout + options.response_timeout;
        let conn = match tokio::time::timeout(budget, open).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(store_err("open", e)),
            Err(_) => {
                return Err(Error::store_kind(
                    BACKEND,
                    "open",
                    StoreErrorKind::Unreachable,
                    format!("no connection to the Redis server within {budget:?}"),
                ))
            }
        };
        let notifier = Notifier::new(Source::Server(client.clone()), options.clone());
        let mut store =
            RedisStore::open_with_conn(Conn::Single(conn), notifier, Publish::Channel, options)
                .await?;
        let channel = format!("{}:v1:released", store.options.key_prefix);
        let listen_options = store.options.clone();
        store.releases = Some(Arc::new(ReleaseHub::new(move |announce| {
            super::notifier::announce_releases(
                client.clone(),
                listen_options.clone(),
                channel.clone(),
                announce,
            )
        })));
        Ok(store)
    }

    /// Connects to the Redis Cluster that `nodes` belong to, with `options`. Waiters listen on
    /// shard channels (`SSUBSCRIBE`), which the notifier connects to when the first one waits.
    pub(super) async fn open_cluster(
        nodes: &[String],
        options: RedisOptions,
    ) -> Result<RedisStore, Error> {
        options.validate()?;
        let conn = cluster::connect(nodes, &options).await?;
        let notifier = Notifier::new(Source::Cluster(nodes.to_vec()), options.clone());
        let publish = Publish::ShardChannel;
        RedisStore::open_with_conn(Conn::Cluster(conn), notifier, publish, options).await
    }

    /// Loads the scripts on `conn` and reads the server's value size limit.
    async fn open_with_conn(
        mut conn: Conn,
        notifier: Notifier,
        publish: Publish,
        options: RedisOptions,
    ) -> Result<RedisStore, Error> {
        let scripts = Scripts::new(publish);
        // Load every script once: one pipelined round trip to a server; on a cluster one
        // `SCRIPT LOAD` each, which the client sends to every node.
        let loaded = tokio::time::timeout(options.response_timeout, async {
            match &conn {
                Conn::Single(_) => {
                    let mut pipe = ::redis::pipe();
                    for code in &scripts.sources {
                        pipe.cmd("SCRIPT").arg("LOAD").arg(code);
                    }
                    pipe.query_async::<Vec<String>>(&mut conn).await.map(drop)
                }
                Conn::Cluster(_) => {
                    for code in &scripts.sources {
                        ::redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(code)
                            .query_async::<Value>(&mut conn)
                            .await?;
                    }
                    Ok(())
                }
            }
        })
        .await;
        match loaded {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.to_string().contains("shebang") || e.to_string().contains("#!") => {
                return Err(Error::store_kind(
                    BACKEND,
                    "open",
                    StoreErrorKind::Unsupported,
                    format!(
                        "the server refused idem's scripts ({e}): Redis 7.0 or newer is needed"
                    ),
                ))
            }
            Ok(Err(e)) => return Err(store_err("open", e)),
            Err(_) => {
                return Err(Error::store_kind(
                    BACKEND,
                    "open",
                    StoreErrorKind::Timeout,
                    format!(
                        "the server did not answer within {:?}",
                        options.response_timeout
                    ),
                ))
            }
        }
        // CONFIG may be renamed or forbidden by ACLs: then our own limit is the only one.
        let mut max_value = options.max_value_size;
        let limit = tokio::time::timeout(
            options.response_timeout,
            ::redis::cmd("CONFIG")
                .arg("GET")
                .arg("proto-max-bulk-len")
                .query_async::<Vec<String>>(&mut conn),
        )
        .await;
        if let Ok(Ok(pair)) = limit {
            if let Some(n) = pair.get(1).and_then(|v| v.parse::<usize>().ok()) {
                max_value = max_value.min(n.saturating_sub(BULK_HEADROOM));
            }
        }

        let key_head = format!("{}:v1:{{", options.key_prefix);
        Ok(RedisStore {
            conn,
            scripts,
            max_value,
            key_head,
            notifier: Arc::new(notifier),
            releases: None,
            options,
        })
    }

    /// Runs one script; a connection error is retried after the manager reconnects.
    pub(super) async fn run(
        &self,
        op: &'static str,
        script: &Script,
        key: &str,
        args: &[&[u8]],
    ) -> Result<(Value, u32), Error> {
        self.run_keys(op, script, &[key], args).await
    }

    /// [`Self::run`] with several keys (all in one slot: a record's and its tombstone's).
    pub(super) async fn run_keys(
        &self,
        op: &'static str,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<(Value, u32), Error> {
        let mut inv = script.prepare_invoke();
        for key in keys {
            inv.key(*key);
        }
        for a in args {
            inv.arg(*a);
        }
        let budget = self.options.connection_timeout + self.options.response_timeout;
        let mut attempt = 0u32;
        loop {
            let mut conn = self.conn.clone();
            match tokio::time::timeout(budget, inv.invoke_async::<Value>(&mut conn)).await {
                Ok(Ok(v)) => return Ok((v, attempt)),
                // A lost connection, or a cluster that redirected or was reconfiguring after the
                // client's own retries (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`: the script did
                // not run there).
                Ok(Err(e))
                    if attempt < self.options.retries
                        && ((e.is_io_error() && !e.is_timeout()) || e.is_cluster_error()) =>
                {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "idem: redis step retried");
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
                Ok(Err(e)) => return Err(store_err(op, e)),
                Err(_) => {
                    return Err(Error::store_kind(
                        BACKEND,
                        op,
                        StoreErrorKind::Timeout,
                        format!("no reply from the Redis server within {budget:?}"),
                    ))
                }
            }
        }
    }
}
