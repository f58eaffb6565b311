//! The Redis store's side of resumable calls (see [`crate::store::resume`]), on one server and
//! on a cluster alike: a sorted set per namespace, `<prefix>:resume:{<name>}` (its own hash
//! slot on a cluster), of the keys whose calls kept arguments, scored by when they did. A
//! resumer reads the oldest members, reads each record, and removes the members whose record
//! is no longer in progress (completed, released, parked, purged): the set holds the resumable
//! calls in flight, never the whole keyspace.
//!
//! The member is added before the record's value is written (two keys in two slots cannot be
//! one script on a cluster): a process that dies in between leaves a member whose record has no
//! arguments, which the next read drops once the record is no longer in progress.

use super::{corrupt, parse_record, store_err, RedisStore};
use crate::error::Error;
use crate::key::Digest;
use crate::store::resume::finish_abandoned;
use crate::store::{local_now_ms, Record, Status};
use ::redis::{Script, Value};
use std::sync::LazyLock;

static KEEP_ARGS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("keep_args.lua")));

/// How many members a read looks at per name, beyond the records asked for: members of calls
/// still running sit among them.
const READ_AHEAD: usize = 100;

impl RedisStore {
    /// The sorted set of namespace `name`.
    fn resume_set(&self, name: &str) -> String {
        let prefix = self.key_head.trim_end_matches("v1:{");
        format!("{prefix}resume:{{{name}}}")
    }

    /// `Store::keep_args`: the key joins its namespace's set (the name read from the record
    /// the claim wrote), then the fenced script keeps the arguments.
    pub(super) async fn keep_args_now(
        &self,
        key: &Digest,
        token: u64,
        args: &[u8],
    ) -> Result<bool, Error> {
        let rkey = self.redis_key(key);
        let mut conn = self.conn.clone();
        let name: Option<String> = ::redis::cmd("HGET")
            .arg(&rkey)
            .arg("name")
            .query_async(&mut conn)
            .await
            .map_err(|e| store_err("keep_args", e))?;
        if let Some(name) = name {
            ::redis::cmd("ZADD")
                .arg(self.resume_set(&name))
                .arg(local_now_ms())
                .arg(key.to_hex())
                .query_async::<Value>(&mut conn)
                .await
                .map_err(|e| store_err("keep_args", e))?;
        }
        let token = token.to_string();
        let (v, _) = self
            .run("keep_args", &KEEP_ARGS, &rkey, &[token.as_bytes(), args])
            .await?;
        Ok(matches!(v, Value::Int(1)))
    }

    /// `Store::abandoned_calls`: each name's oldest members, their records read, the members
    /// of records no longer in progress removed.
    pub(super) async fn abandoned_now(
        &self,
        names: &[&str],
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let op = "abandoned_calls";
        let mut conn = self.conn.clone();
        let mut rows = Vec::new();
        for name in names {
            let set = self.resume_set(name);
            let members: Vec<String> = ::redis::cmd("ZRANGE")
                .arg(&set)
                .arg(0)
                .arg((limit + READ_AHEAD) as i64)
                .query_async(&mut conn)
                .await
                .map_err(|e| store_err(op, e))?;
            let (secs, micros): (i64, i64) = ::redis::cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(|e| store_err(op, e))?;
            let now = secs * 1000 + micros / 1000;
            for member in members {
                let Some(key) = Digest::from_hex(&member) else {
                    continue;
                };
                let fields: Vec<Value> = ::redis::cmd("HMGET")
                    .arg(self.redis_key(&key))
                    .arg(&[
                        "status",
                        "token",
                        "fingerprint",
                        "value",
                        "name",
                        "created_at",
                        "expires_at",
                        "attempt",
                        "keep_until",
                    ])
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| store_err(op, e))?;
                if fields.len() != 9 {
                    return Err(corrupt(op, "HMGET answers every field"));
                }
                if matches!(fields[0], Value::Nil) {
                    self.forget(&set, &member).await?;
                    continue;
                }
                let mut f = fields;
                f.insert(7, Value::BulkString(now.to_string().into_bytes()));
                let record = parse_record(op, key, &f)?;
                let gone = record.status != Status::InProgress
                    || crate::protocol::may_forget(record.keep_until, now);
                if gone {
                    self.forget(&set, &member).await?;
                } else if record.name == *name {
                    rows.push(record);
                }
            }
        }
        Ok(finish_abandoned(rows, limit))
    }

    async fn forget(&self, set: &str, member: &str) -> Result<(), Error> {
        let mut conn = self.conn.clone();
        ::redis::cmd("ZREM")
            .arg(set)
            .arg(member)
            .query_async::<Value>(&mut conn)
            .await
            .map_err(|e| store_err("abandoned_calls", e))?;
        Ok(())
    }
}
