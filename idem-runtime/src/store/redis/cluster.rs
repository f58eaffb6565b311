//! Redis Cluster: the connection a store runs its steps on (one server or a cluster), opening a
//! cluster connection, and the cluster's primaries for the operator's scans.
//!
//! Every record is one key whose hash tag is its digest and every script names exactly that
//! key, so redis-rs's cluster client sends each step to the primary that owns the key's slot and
//! follows `MOVED`/`ASK` redirections itself; nothing in the scripts changes.

use super::error::store_err;
use super::{RedisOptions, BACKEND};
use crate::error::{Error, StoreErrorKind};
use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The connection of a store: a managed connection to one server, or a cluster connection.
/// Both reconnect by themselves and are cheap to clone (one shared multiplexed connection).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// The addresses (`host`, `port`) of the cluster's primaries; `None` on a single server.
    pub(super) async fn primaries(&mut self) -> RedisResult<Option<Vec<(String, u16)>>> {
        let Conn::Cluster(c) = self else {
            return Ok(None);
        };
        let nodes: String = ::redis::FromRedisValue::from_redis_value(
            &c.route_command(
                ::redis::cmd("CLUSTER").arg("NODES"),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?,
        )?;
        Ok(Some(parse_primaries(&nodes)))
    }

    /// Runs `cmd` on the node at `host:port` (a cluster's primary, for a `SCAN` of its keys),
    /// or on the server.
    pub(super) async fn on_node(
        &mut self,
        node: Option<&(String, u16)>,
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    }),
                )
                .await
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// How many replicas acknowledged the writes so far on the connection to `key`'s primary
    /// (`WAIT numreplicas timeout`; on a cluster, sent to the primary that owns the key's slot,
    /// on the connection its scripts went over).
    pub(super) async fn wait_replicas(
        &mut self,
        key: &str,
        numreplicas: u32,
        timeout: std::time::Duration,
    ) -> RedisResult<u32> {
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(numreplicas).arg(timeout.as_millis() as u64);
        let reply = match self {
            Conn::Single(c) => wait.query_async(c).await?,
            Conn::Cluster(c) => {
                let route = Route::new(slot(key), SlotAddr::Master);
                c.route_command(
                    &wait,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await?
            }
        };
        ::redis::FromRedisValue::from_redis_value(&reply)
    }

    /// Runs the `count` commands of `pipe` on the node at `host:port`, or on the server. A
    /// cluster pipeline is otherwise refused unless its keys share a slot.
    pub(super) async fn pipeline_on_node(
        &mut self,
        node: Option<&(String, u16)>,
        pipe: &Pipeline,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                c.route_pipeline(
                    pipe,
                    0,
                    count,
                    SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    },
                )
                .await
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key, modulo 16384, as Redis computes it.
fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

/// The primaries in `CLUSTER NODES` output: `<id> <host:port@bus[,hostname]> <flags> …`, the
/// flags naming `master` (and not `fail`).
fn parse_primaries(nodes: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in nodes.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_id), Some(addr), Some(flags)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        if let Some((host, port)) = addr.rsplit_once(':') {
            if let Ok(port) = port.parse() {
                out.push((host.to_string(), port));
            }
        }
    }
    out.sort();
    out
}

/// Connects to the cluster that `nodes` belong to, within the options' timeouts.
pub(super) async fn connect(
    nodes: &[String],
    options: &RedisOptions,
) -> Result<ClusterConnection, Error> {
    let client = ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(options.connection_timeout)
        .response_timeout(options.response_timeout)
        .retries(options.retries)
        .build()
        .map_err(|e| Error::config(format!("invalid Redis Cluster nodes: {e}")))?;
    let budget = options.connection_timeout + options.response_timeout;
    let conn = match tokio::time::timeout(budget, client.get_async_connection()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(explain_open_error(nodes, options, e).await),
        Err(_) => {
            return Err(Error::store_kind(
                BACKEND,
                "open",
                StoreErrorKind::Unreachable,
                format!(
                    "no connection to the Redis Cluster at {} within {budget:?}",
                    list(nodes)
                ),
            ))
        }
    };
    let mut probe = conn.clone();
    check_slots(&mut probe, nodes, options).await?;
    Ok(conn)
}

/// A cluster whose slots are not all served would fail some keys and not others: refused at
/// open, naming what `CLUSTER INFO` says.
async fn check_slots(
    conn: &mut ClusterConnection,
    nodes: &[String],
    options: &RedisOptions,
) -> Result<(), Error> {
    let reply = conn
        .route_command(
            ::redis::cmd("CLUSTER").arg("INFO"),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await;
    let reply = match reply {
        Ok(reply) => reply,
        // A client that found no node to ask (no slot map at all) says little: ask the nodes.
        Err(e) => return Err(explain_open_error(nodes, options, e).await),
    };
    let info: String =
        ::redis::FromRedisValue::from_redis_value(&reply).map_err(|e| store_err("open", e))?;
    match unserved_slots(&info, nodes) {
        Some(refused) => Err(refused),
        None => Ok(()),
    }
}

/// The error for a cluster whose `CLUSTER INFO` says it does not serve every slot; `None` when
/// it does.
fn unserved_slots(info: &str, nodes: &[String]) -> Option<Error> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or("?")
            .to_string()
    };
    let state = field("cluster_state");
    if state == "ok" {
        return None;
    }
    Some(Error::store_kind(
        BACKEND,
        "open",
        StoreErrorKind::Unreachable,
        format!(
            "the Redis Cluster at {} is not serving every slot (cluster_state:{state}, \
             {} of 16384 slots assigned, {} ok): assign the slots (redis-cli --cluster fix) \
             or wait for the failover to finish",
            list(nodes),
            field("cluster_slots_assigned"),
            field("cluster_slots_ok"),
        ),
    ))
}

/// Why the cluster client could not connect, asked of the nodes one by one (its own error can
/// be as vague as "no connections found"): a node without cluster mode, or a cluster that does
/// not serve every slot, is named as such; otherwise the client's error stands.
async fn explain_open_error(
    nodes: &[String],
    options: &RedisOptions,
    e: ::redis::RedisError,
) -> Error {
    for node in nodes {
        let Ok(client) = ::redis::Client::open(node.as_str()) else {
            continue;
        };
        let probe = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            ::redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async::<String>(&mut conn)
                .await
        };
        match tokio::time::timeout(options.connection_timeout + options.response_timeout, probe)
            .await
        {
            Ok(Ok(info)) => {
                if let Some(refused) = unserved_slots(&info, nodes) {
                    return refused;
                }
            }
            Ok(Err(probe_err)) if probe_err.to_string().contains("cluster support disabled") => {
                return open_error(nodes, probe_err)
            }
            _ => {}
        }
    }
    open_error(nodes, e)
}

/// What a failed cluster connection means: a node that is a single server is named as such.
fn open_error(nodes: &[String], e: ::redis::RedisError) -> Error {
    let text = e.to_string();
    if text.contains("cluster support disabled") || text.contains("not in cluster mode") {
        return Error::store_kind(
            BACKEND,
            "open",
            StoreErrorKind::Unsupported,
            format!(
                "{} is a Redis server without cluster mode ({e}): open it with Idem::redis, \
                 or give the nodes of a cluster",
                list(nodes)
            ),
        );
    }
    if text.contains("slot") || text.contains("Slot") {
        return Error::store_kind(
            BACKEND,
            "open",
            StoreErrorKind::Unreachable,
            format!(
                "the Redis Cluster at {} does not serve every slot ({e}): assign the slots \
                 (redis-cli --cluster fix) or wait for the failover to finish",
                list(nodes)
            ),
        );
    }
    store_err("open", e)
}

/// The nodes, without passwords, for messages.
fn list(nodes: &[String]) -> String {
    nodes
        .iter()
        .map(|n| match (n.find("://"), n.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}{}", &n[..scheme + 3], &n[at + 1..])
            }
            _ => n.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primaries_are_the_live_masters() {
        let nodes = "\
a1 127.0.0.1:30002@40002 master - 0 1 2 connected 5461-10922
b2 127.0.0.1:30004@40004 slave a1 0 1 1 connected
c3 127.0.0.1:30001@40001,host.local myself,master - 0 0 1 connected 0-5460
d4 127.0.0.1:30003@40003 master,fail - 0 1 3 connected
";
        assert_eq!(
            parse_primaries(nodes),
            vec![
                ("127.0.0.1".to_string(), 30001),
                ("127.0.0.1".to_string(), 30002)
            ]
        );
    }

    #[test]
    fn slots_follow_the_hash_tag() {
        // Redis's own figures (`CLUSTER KEYSLOT`).
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), 3443);
        assert_eq!(slot("user1000"), 3443);
        assert_eq!(slot("foo{}{bar}"), 8363);
        assert_eq!(slot("{}x"), 10595);
        assert_eq!(slot("idem:v1:{abc}"), 7638);
    }

    #[test]
    fn node_lists_hide_passwords() {
        let nodes = [
            "redis://:secret@127.0.0.1:7000/".to_string(),
            "redis://h:7001".into(),
        ];
        assert_eq!(list(&nodes), "redis://127.0.0.1:7000/, redis://h:7001");
    }
}
