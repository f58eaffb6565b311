//! The operator's queries on the Redis store ([`Inspect`]): a `SCAN` over the store's
//! key prefix (on every primary of a cluster) (`<prefix>:v1:{*`, hashes only), 1,000 keys per round trip, with one pipelined
//! `HMGET` + `HSTRLEN` per batch, never a `KEYS` that would block the server. The server's
//! clock (`TIME`) decides what is live, as in the scripts. Values themselves are not read.

use super::{as_bytes, as_i64, as_u64, status_of, store_err, RedisStore};
use crate::error::Error;
use crate::key::Digest;
use crate::store::{
    count_states, finish_listing, BoxFuture, Filter, Inspect, KeyInfo, Stat, State, Status,
};
use ::redis::Value;

/// Keys asked for per `SCAN` round trip.
const SCAN_COUNT: usize = 1000;

impl RedisStore {
    /// Calls `each` with every record under this store's prefix, live or not.
    async fn scan_records(
        &self,
        op: &'static str,
        mut each: impl FnMut(KeyInfo),
    ) -> Result<(), Error> {
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = ::redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(|e| store_err(op, e))?;
        let now = secs * 1000 + micros / 1000;
        let pattern = format!("{}*", self.key_head);
        // A cluster's keys are spread over its primaries: each is scanned in turn.
        let primaries = conn.primaries().await.map_err(|e| store_err(op, e))?;
        let nodes: Vec<Option<&(String, u16)>> = match &primaries {
            Some(nodes) => nodes.iter().map(Some).collect(),
            None => vec![None],
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = ::redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("hash");
                let reply = conn
                    .on_node(node, &scan)
                    .await
                    .map_err(|e| store_err(op, e))?;
                let (next, keys): (u64, Vec<String>) =
                    ::redis::FromRedisValue::from_redis_value(&reply)
                        .map_err(|e| store_err(op, e))?;
                if !keys.is_empty() {
                    // The keys of one scan live on its node, so the pipeline goes there whole.
                    let mut pipe = ::redis::pipe();
                    for k in &keys {
                        pipe.cmd("HMGET").arg(k).arg(&[
                            "status",
                            "token",
                            "fingerprint",
                            "name",
                            "created_at",
                            "expires_at",
                            "attempt",
                            "keep_until",
                        ]);
                        pipe.cmd("HSTRLEN").arg(k).arg("value");
                    }
                    let replies: Vec<Value> = conn
                        .pipeline_on_node(node, &pipe, keys.len() * 2)
                        .await
                        .map_err(|e| store_err(op, e))?;
                    for (k, reply) in keys.iter().zip(replies.chunks(2)) {
                        // A key that expired between the SCAN and the HMGET reads as all nil.
                        if let Some(info) = self.key_info(k, reply, now) {
                            each(info);
                        }
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// A record from its Redis key and `[HMGET fields, HSTRLEN value]`; `None` for a key that
    /// is gone or is not one of ours.
    fn key_info(&self, redis_key: &str, reply: &[Value], now: i64) -> Option<KeyInfo> {
        // A record, or a tombstone (its hash has a record's fields, without the value).
        let rest = redis_key.strip_prefix(&self.key_head)?;
        let rest = rest.strip_suffix(super::TOMB_SUFFIX).unwrap_or(rest);
        let hex = rest.strip_suffix('}')?;
        let key = Digest::from_hex(hex)?;
        let Value::Array(f) = reply.first()? else {
            return None;
        };
        let status = status_of(f.first()?)?;
        let expires_at = as_i64(f.get(5)?)?;
        let size = match reply.get(1) {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
        Some(KeyInfo {
            name: String::from_utf8_lossy(as_bytes(f.get(3)?)?).into_owned(),
            key,
            fingerprint: Digest::from_slice(as_bytes(f.get(2)?)?)?,
            token: as_u64(f.get(1)?)?,
            status,
            value_size: size.filter(|_| status == Status::Completed),
            created_at: as_i64(f.get(4)?)?,
            expires_at,
            // Records written before these fields: attempt 1, kept until their end.
            attempt: match f.get(6)? {
                Value::Nil => 1,
                v => u32::try_from(as_u64(v)?).ok()?,
            },
            keep_until: match f.get(7)? {
                Value::Nil => expires_at,
                v => as_i64(v)?,
            },
            now,
        })
    }
}

impl Inspect for RedisStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let mut rows = Vec::new();
            self.scan_records("list", |info| {
                if filter.matches(&info) {
                    rows.push(info);
                }
            })
            .await?;
            Ok(finish_listing(rows, filter))
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let mut states = Vec::new();
            self.scan_records("stats", |info| {
                let state = State::of(info.status, info.expires_at, info.keep_until, info.now);
                states.push((info.name, state));
            })
            .await?;
            Ok(count_states(states))
        })
    }
}
