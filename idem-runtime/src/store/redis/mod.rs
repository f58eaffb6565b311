//! The Redis store (feature `redis`): one hash per key, one Lua script per protocol step.
//!
//! # Key layout
//!
//! Each logical key is **one** Redis hash, named
//!
//! ```text
//! <prefix>:v1:{<64 hex digits of the key digest>}
//! ```
//!
//! with the prefix `idem` unless [`RedisOptions::key_prefix`] says otherwise (so by default
//! `idem:v1:{9f86d0…}`). `v1` is the version of the record layout below. The digest already
//! covers the namespace, the scope and the key (see [`crate::key`]), so the namespace is not part
//! of the Redis key: it is kept in the `name` field, where an operator can read it, and a
//! namespace with odd characters can never produce an odd Redis key. The braces are a Redis
//! Cluster hash tag: the slot is computed from the digest alone, and every script touches
//! exactly one key, so the layout is Cluster-safe: [`RedisOptions::cluster`] opens the same store
//! on a Redis Cluster, each step sent to the primary that owns the key's slot.
//!
//! The hash's fields:
//!
//! | field | content |
//! |---|---|
//! | `status` | `0` in progress, `1` completed, `2` ended (released or force-released: kept for its token, see below), `3` parked (no expiry: kept until resolved) |
//! | `token` | the fencing token, decimal |
//! | `fingerprint` | the 32 raw bytes of the fingerprint digest |
//! | `value` | the stored result, raw bytes (completed records only) |
//! | `name` | the namespace |
//! | `created_at`, `expires_at` | ms since the Unix epoch on the server's clock, decimal |
//! | `attempt` | the attempt number, decimal (absent in records written before it: 1) |
//! | `keep_until` | until when the record is kept, ms (absent in records written before it: `expires_at`, and a lapsed one is then released, not abandoned) |
//! | `abandoned_at` | the `created_at` of the abandoned attempt this claim took over (takeovers only) |
//! | `nonce` | 16 random bytes naming the attempt that claimed it (see below) |
//! | `waiters` | `1` once a waiter asked to be told (absent otherwise) |
//!
//! A completion or release publishes on the channel named like the key (the same string) when
//! the record carries `waiters`; [`Store::changed`] subscribes there and then sets the mark
//! (`mark.lua`), which also tells it whether the record is still in progress. A completion
//! nobody waits for sends nothing: in a script, `PUBLISH` costs a call of its own, as much as
//! the read. An operator's forced release always publishes. On a cluster the scripts use
//! `SPUBLISH` and waiters `SSUBSCRIBE`: the channel hashes to the key's slot, so the message
//! stays on the shard that owns the key instead of crossing the cluster bus to every node.
//!
//! # Time, expiry and purging
//!
//! Every script reads the server's clock with `TIME` (allowed in scripts since Redis 5, whose
//! effects replication is the default), so processes with skewed clocks agree. The liveness rule
//! is applied on the `expires_at` field, and the key also gets a native expiry: a completed
//! record vanishes at the end of its TTL (`PEXPIREAT expires_at`); an in-progress one is kept
//! until `keep_until` and [`crate::protocol::KEEP_ENDED`] past it (`keep_until = now +
//! max(lease, ttl)`), so that an attempt whose lease lapsed is still found abandoned by the next
//! claim; a parked one has no expiry (`PERSIST`). There is no sweeper. [`Store::purge_expired`] therefore has nothing to do and
//! returns 0. Because the native expiry and `expires_at` are the same instant on the same clock,
//! a completed record that a claim can still read is live: a replay is one `HMGET`, without
//! `TIME` (each `redis.call` costs a script about as much as the read itself).
//!
//! A release or an operator's forced release does not delete the hash: it *ends* it (`status`
//! `2`, `expires_at = now`, the value dropped) and keeps its token, with a native expiry of
//! [`crate::protocol::KEEP_ENDED`]. A claim in the same millisecond then passes that token
//! instead of handing it out again (see [`crate::protocol::ended_at`]); by the time the key
//! expires the clock has moved on, and the token floor of a new claim is above it.
//!
//! # Failures
//!
//! A connection that drops is re-established by redis-rs's `ConnectionManager`; a step that
//! failed with an I/O error is sent again (at most [`RedisOptions::retries`] times). That is safe
//! because every step is idempotent under its own retry: `complete` answers "already completed
//! with this token" distinctly, so a retried completion whose first reply was lost still counts
//! as done, and `claim` carries a random nonce, so a claim whose reply was lost is recognised as
//! this attempt's own on the retry instead of looking like a duplicate in flight. Every step is
//! bounded by the connection and response timeouts: a hung or vanished server gives
//! [`Error::Store`], never a hang.
//!
//! Requires Redis 7.0 or newer (the scripts declare their flags with a `#!lua` shebang, so a
//! read-only replica or a server over `maxmemory` refuses a write script before it runs).

mod cluster;
mod connection;
mod error;
mod inspect;
mod notifier;
mod options;
mod resume;
mod scripts;

pub use options::RedisOptions;

use super::{
    millis, Backend, BoxFuture, Claim, ClaimOutcome, Complete, Record, ReleaseFeed, ReleaseHub,
    Resolve, Resolved, Status, Store, Takeover,
};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use ::redis::{Client, Script, Value};
use cluster::Conn;
use error::store_err;
use notifier::Notifier;
use scripts::Scripts;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BACKEND: Backend = Backend::Redis;

/// The largest lease or TTL a script is given: about 300 years, so that `now + ttl` stays an
/// exact integer in a Lua double and a valid `PEXPIREAT` time.
const MAX_DURATION_MS: i64 = 10_000_000_000_000;

/// Redis's own default `proto-max-bulk-len` (512 MB): the default [`RedisOptions::max_value_size`].
const DEFAULT_MAX_VALUE: usize = 512 * 1024 * 1024;

/// How long a waiter listens for a notification before it looks at the record again anyway
/// (covers a pub/sub connection that died without telling).
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// How long a waiter without pub/sub (when the pub/sub connection fails) sleeps before it looks
/// at the record again.
const POLL: Duration = Duration::from_millis(25);

/// The Redis store behind [`crate::Idem::redis`]. See the [module docs](self) for the layout.
pub struct RedisStore {
    conn: Conn,
    scripts: Scripts,
    options: RedisOptions,
    max_value: usize,
    /// `<prefix>:v1:{`
    key_head: String,
    /// Pub/sub: a server's channels, or a cluster's shard channels.
    notifier: Arc<Notifier>,
    /// The subscriber to operators' releases (`Store::releases`); one server only.
    releases: Option<Arc<ReleaseHub>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .field("max_value", &self.max_value)
            .finish_non_exhaustive()
    }
}

fn corrupt(op: &'static str, what: &str) -> Error {
    Error::store_kind(
        BACKEND,
        op,
        StoreErrorKind::Corrupt,
        format!("unexpected reply from the {op} script: {what} (was the key written by something else?)"),
    )
}

fn duration_ms(d: Duration) -> i64 {
    millis(d).min(MAX_DURATION_MS)
}

/// 16 bytes that no other claim uses: randomly keyed SipHash over a counter, the time and the
/// process id.
fn nonce() -> [u8; 16] {
    use std::hash::BuildHasher;
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let seed = (n, t, std::process::id());
    let a = std::collections::hash_map::RandomState::new().hash_one(seed);
    let b = std::collections::hash_map::RandomState::new().hash_one((seed, a));
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

impl RedisStore {
    /// Opens a store at `url` (`redis://[:password@]host[:port][/db]`, `unix:///path`) with
    /// the default [`RedisOptions`]. A URL that does not parse is [`Error::Config`].
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        RedisOptions::from_url(url)?.connect().await
    }

    /// A store on the application's own client (its server and connection settings), with
    /// `options` for the rest (their own server is not used).
    pub async fn from_client(client: Client, options: RedisOptions) -> Result<RedisStore, Error> {
        RedisStore::open_on(client, options).await
    }

    /// Opens a store at `url` with the default [`RedisOptions`].
    #[deprecated(since = "0.2.0", note = "use `RedisStore::connect`")]
    pub async fn open(url: &str) -> Result<RedisStore, Error> {
        RedisStore::connect(url).await
    }

    /// The options builder.
    #[deprecated(
        since = "0.2.0",
        note = "use `RedisOptions::from_url(url)?` or `RedisOptions::new()`"
    )]
    pub fn options() -> RedisOptions {
        RedisOptions::default()
    }

    /// Opens a store at `url` with `options`.
    #[deprecated(
        since = "0.2.0",
        note = "use `RedisOptions::from_url(url)?` with the settings, then `.connect()`"
    )]
    pub async fn open_with(url: &str, options: RedisOptions) -> Result<RedisStore, Error> {
        let client = RedisOptions::from_url(url)?.client;
        RedisStore::open_on(client, options).await
    }

    /// The Redis key of a digest: `<prefix>:v1:{<hex>}`.
    pub fn redis_key(&self, key: &Digest) -> String {
        let mut k = String::with_capacity(self.key_head.len() + 65);
        k.push_str(&self.key_head);
        k.push_str(&key.to_hex());
        k.push('}');
        k
    }

    /// The largest value this store will write, in bytes (the configured maximum, capped by
    /// the server's `proto-max-bulk-len`).
    pub fn max_value_size(&self) -> usize {
        self.max_value
    }

    async fn do_claim(&self, c: Claim<'_>) -> Result<ClaimOutcome, Error> {
        let key = self.redis_key(c.key);
        let lease = duration_ms(c.lease).to_string();
        let keep = duration_ms(c.lease.max(c.ttl)).to_string();
        let nonce = nonce();
        let args: [&[u8]; 5] = [
            c.name.as_bytes(),
            c.fingerprint.as_bytes(),
            lease.as_bytes(),
            &nonce,
            keep.as_bytes(),
        ];
        let tomb = tomb_key(&key);
        let (v, _) = self
            .run_keys("claim", &self.scripts.claim, &[&key, &tomb], &args)
            .await?;
        let Value::Array(items) = v else {
            return Err(corrupt("claim", "not an array"));
        };
        match items.first() {
            Some(Value::Int(1)) => {
                let token = items
                    .get(1)
                    .and_then(as_u64)
                    .ok_or_else(|| corrupt("claim", "token"))?;
                let attempt = match items.get(2) {
                    None | Some(Value::Nil) => 1,
                    Some(v) => as_u64(v)
                        .and_then(|a| u32::try_from(a).ok())
                        .ok_or_else(|| corrupt("claim", "attempt"))?,
                };
                let takeover = match items.get(3) {
                    None | Some(Value::Nil) => None,
                    Some(v) => Some(Takeover {
                        attempt,
                        abandoned_at: as_i64(v).ok_or_else(|| corrupt("claim", "abandoned_at"))?,
                    }),
                };
                self.claim_replicated(&key, c.key, token).await?;
                Ok(ClaimOutcome::Claimed { token, takeover })
            }
            Some(Value::Int(0)) => Ok(ClaimOutcome::Existing(parse_record(
                "claim",
                *c.key,
                &items[1..],
            )?)),
            _ => Err(corrupt("claim", "unknown tag")),
        }
    }

    async fn do_complete(&self, done: Complete<'_>) -> Result<bool, Error> {
        if done.value.len() > self.max_value {
            // Nothing can be stored, so nothing could be replayed: free the key for a retry.
            let released = self.do_release(done.key, done.token).await;
            return Err(Error::store_kind(
                BACKEND,
                "complete",
                StoreErrorKind::Capacity,
                format!(
                    "the result is {} bytes, over this store's limit of {} bytes \
                     (RedisOptions::max_value_size, capped by the server's proto-max-bulk-len); \
                     it was not stored, and the key {}",
                    done.value.len(),
                    self.max_value,
                    match released {
                        Ok(true) => "was released so a retry can run",
                        Ok(false) => "was no longer held by this attempt",
                        Err(_) => "could not be released: it lapses after its lease",
                    }
                ),
            ));
        }
        let key = self.redis_key(done.key);
        let token = done.token.to_string();
        let ttl = duration_ms(done.ttl).to_string();
        let tombstone = duration_ms(done.tombstone).to_string();
        let args: [&[u8]; 4] = [
            token.as_bytes(),
            done.value,
            ttl.as_bytes(),
            tombstone.as_bytes(),
        ];
        let tomb = tomb_key(&key);
        let (v, attempt) = self
            .run_keys("complete", &self.scripts.complete, &[&key, &tomb], &args)
            .await?;
        match v {
            Value::Int(1) => {
                self.completion_replicated(&key).await;
                Ok(true)
            }
            // Already completed with this token: by this very call when it was a retry.
            Value::Int(2) => Ok(attempt > 0),
            Value::Int(0) => Ok(false),
            _ => Err(corrupt("complete", "not 0, 1 or 2")),
        }
    }

    /// With [`RedisOptions::wait_for_replicas`]: the body may run only once enough replicas
    /// hold its claim; otherwise the claim is released and the call fails before the body.
    async fn claim_replicated(&self, rkey: &str, key: &Digest, token: u64) -> Result<(), Error> {
        let Some((wanted, timeout)) = self.options.replicas else {
            return Ok(());
        };
        let acked = self.conn.clone().wait_replicas(rkey, wanted, timeout).await;
        let why = match acked {
            Ok(n) if n >= wanted => return Ok(()),
            Ok(n) => {
                format!("only {n} of {wanted} replicas acknowledged the claim within {timeout:?}")
            }
            Err(e) => format!("WAIT for {wanted} replicas failed: {e}"),
        };
        let released = match self.do_release(key, token).await {
            Ok(_) => "it was released",
            Err(_) => "it could not be released and lapses after its lease",
        };
        Err(Error::store_kind(
            BACKEND,
            "claim",
            StoreErrorKind::Timeout,
            format!("{why}; {released}, and the body did not run"),
        ))
    }

    /// With [`RedisOptions::wait_for_replicas`]: a completion too few replicas hold is kept
    /// (its body has run, and the primary has it) and logged: a failover now could lose it.
    async fn completion_replicated(&self, rkey: &str) {
        let Some((wanted, timeout)) = self.options.replicas else {
            return;
        };
        match self.conn.clone().wait_replicas(rkey, wanted, timeout).await {
            Ok(n) if n >= wanted => {}
            Ok(n) => tracing::warn!(
                acknowledged = n,
                wanted,
                "idem: a completion is held by fewer Redis replicas than asked for"
            ),
            Err(e) => tracing::warn!(error = %e, "idem: WAIT after a completion failed"),
        }
    }

    async fn do_release(&self, key: &Digest, token: u64) -> Result<bool, Error> {
        let key = self.redis_key(key);
        let token = token.to_string();
        let (v, _) = self
            .run("release", &self.scripts.release, &key, &[token.as_bytes()])
            .await?;
        Ok(matches!(v, Value::Int(1)))
    }

    /// A fenced script that answers 1 or 0 (`ARGV` = token): park, abandon.
    async fn fenced(
        &self,
        op: &'static str,
        script: &Script,
        key: &Digest,
        token: u64,
    ) -> Result<bool, Error> {
        let key = self.redis_key(key);
        let token = token.to_string();
        let (v, _) = self.run(op, script, &key, &[token.as_bytes()]).await?;
        Ok(matches!(v, Value::Int(1)))
    }

    async fn do_resolve(&self, key: &Digest, resolution: Resolve<'_>) -> Result<Resolved, Error> {
        let rkey = self.redis_key(key);
        let (applied, value, ttl) = match resolution {
            Resolve::Applied { value, ttl } => ("1", value, duration_ms(ttl).to_string()),
            Resolve::NotApplied => ("0", &[][..], "0".to_string()),
        };
        let args: [&[u8]; 3] = [applied.as_bytes(), value, ttl.as_bytes()];
        let (v, _) = self
            .run("resolve", &self.scripts.resolve, &rkey, &args)
            .await?;
        let Value::Array(items) = v else {
            return Err(corrupt("resolve", "not an array"));
        };
        let record = match items.get(1) {
            None => None,
            Some(Value::Array(fields)) => Some(parse_record("resolve", *key, fields)?),
            Some(_) => return Err(corrupt("resolve", "not a record")),
        };
        Ok(match (items.first(), record) {
            (Some(Value::Int(1)), Some(r)) => Resolved::Done(r),
            (Some(Value::Int(0)), r) => Resolved::NotParked(r),
            _ => return Err(corrupt("resolve", "unknown tag")),
        })
    }

    async fn do_renew(&self, key: &Digest, token: u64, lease: Duration) -> Result<bool, Error> {
        let key = self.redis_key(key);
        let token = token.to_string();
        let lease = duration_ms(lease).to_string();
        let args: [&[u8]; 2] = [token.as_bytes(), lease.as_bytes()];
        let (v, _) = self.run("renew", &self.scripts.renew, &key, &args).await?;
        Ok(matches!(v, Value::Int(1)))
    }

    async fn read(
        &self,
        op: &'static str,
        script: &Script,
        key: &Digest,
    ) -> Result<Option<Record>, Error> {
        let rkey = self.redis_key(key);
        let (v, _) = self.run(op, script, &rkey, &[]).await?;
        match v {
            Value::Nil => Ok(None),
            Value::Array(items) => parse_record(op, *key, &items).map(Some),
            _ => Err(corrupt(op, "not a record")),
        }
    }

    /// Marks the record of `key` as waited for, so that its completion or release publishes;
    /// true while it is in progress (and so marked), false when it is not (any more).
    async fn mark_waiting(&self, key: &Digest) -> Result<bool, Error> {
        let rkey = self.redis_key(key);
        let (v, _) = self
            .run("mark_waiting", &self.scripts.mark, &rkey, &[])
            .await?;
        Ok(matches!(v, Value::Int(1)))
    }
}

/// The Redis key of a record's tombstone: `<record key>:tomb`, in the record's slot (the
/// digest is the hash tag).
fn tomb_key(record_key: &str) -> String {
    format!("{record_key}{TOMB_SUFFIX}")
}

/// What a tombstone's Redis key adds to its record's.
pub(super) const TOMB_SUFFIX: &str = ":tomb";

fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => std::str::from_utf8(as_bytes(v)?).ok()?.parse().ok(),
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => std::str::from_utf8(as_bytes(v)?).ok()?.parse().ok(),
    }
}

/// A record's `status` field.
fn status_of(v: &Value) -> Option<Status> {
    match as_bytes(v)? {
        b"0" => Some(Status::InProgress),
        b"1" => Some(Status::Completed),
        b"2" => Some(Status::Released),
        b"3" => Some(Status::Parked),
        _ => None,
    }
}

/// `{status, token, fingerprint, value, name, created_at, expires_at, now, attempt,
/// keep_until}` (`now` nil only for a completed or parked record found by a claim; `attempt`
/// and `keep_until` nil in a record written before they existed: 1 and `expires_at`).
fn parse_record(op: &'static str, key: Digest, f: &[Value]) -> Result<Record, Error> {
    if f.len() != 10 {
        return Err(corrupt(op, "a record has 10 fields"));
    }
    let status = status_of(&f[0]).ok_or_else(|| corrupt(op, "status"))?;
    let value = match &f[3] {
        Value::Nil => None,
        v => Some(as_bytes(v).ok_or_else(|| corrupt(op, "value"))?.to_vec()),
    };
    let created_at = as_i64(&f[5]).ok_or_else(|| corrupt(op, "created_at"))?;
    let expires_at = as_i64(&f[6]).ok_or_else(|| corrupt(op, "expires_at"))?;
    Ok(Record {
        name: as_bytes(&f[4])
            .and_then(|b| std::str::from_utf8(b).ok())
            .ok_or_else(|| corrupt(op, "name"))?
            .to_string(),
        key,
        fingerprint: as_bytes(&f[2])
            .and_then(Digest::from_slice)
            .ok_or_else(|| corrupt(op, "fingerprint"))?,
        token: as_u64(&f[1]).ok_or_else(|| corrupt(op, "token"))?,
        status,
        value,
        now: match (&f[7], status) {
            // The claim script skips TIME for a completed or parked record (the key's native
            // expiry, or its having none, already proves it live) and nothing decides on `now`
            // for one: this process's clock, kept inside the record's life, stands in.
            (Value::Nil, Status::Completed | Status::Parked) => super::local_now_ms()
                .clamp(created_at, expires_at.saturating_sub(1).max(created_at)),
            (v, _) => as_i64(v).ok_or_else(|| corrupt(op, "now"))?,
        },
        attempt: match &f[8] {
            Value::Nil => 1,
            v => as_u64(v)
                .and_then(|a| u32::try_from(a).ok())
                .filter(|a| *a >= 1)
                .ok_or_else(|| corrupt(op, "attempt"))?,
        },
        keep_until: match &f[9] {
            Value::Nil => expires_at,
            v => as_i64(v).ok_or_else(|| corrupt(op, "keep_until"))?,
        },
        created_at,
        expires_at,
    })
}

/// Parses a `get` or `force_release` script's reply (the array of a live record's 10 fields)
/// into the record of `key`, as the store does (the `record_decoding` fuzz target's entry
/// point; never panics: a reply that is not a record is [`Error::Store`], kind corrupt).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn parse_record_reply(key: Digest, fields: &[Value]) -> Result<Record, Error> {
    parse_record("get", key, fields)
}

impl Store for RedisStore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.do_claim(claim))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.do_complete(done))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.do_release(key, token))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.do_renew(key, token, lease))
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read("get", &self.scripts.get, key))
    }

    /// Redis expires records natively (`PEXPIREAT`), so there is never anything to purge: 0.
    fn purge_expired(&self, _limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Listens on the key's channel (one shared pub/sub connection for the whole store), then
    /// marks the record as waited for and learns whether it is still in progress, in one
    /// script: a change that landed before the mark is seen by it, one after it publishes.
    fn changed<'a>(&'a self, key: &'a Digest, timeout: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let notifier = &self.notifier;
            let channel = self.redis_key(key);
            let waiter = notifier.register(&channel);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Err(e) = notifier.subscribe(&channel).await {
                tracing::debug!(error = %e, "idem: redis pub/sub unavailable; polling");
                tokio::time::sleep(timeout.min(POLL)).await;
                return;
            }
            match self.mark_waiting(key).await {
                Ok(true) => {}
                // Changed already, or unreadable: let the caller look.
                Ok(false) | Err(_) => return,
            }
            let _ = tokio::time::timeout(timeout.min(WAIT_SLICE), notified).await;
        })
    }

    fn releases(&self) -> Option<ReleaseFeed> {
        self.releases.as_ref().map(ReleaseHub::subscribe)
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read("force_release", &self.scripts.force_release, key))
    }

    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.fenced("park", &self.scripts.park, key, token))
    }

    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.fenced("abandon", &self.scripts.abandon, key, token))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        Box::pin(self.do_resolve(key, resolution))
    }
    fn keep_args<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.keep_args_now(key, token, args))
    }

    fn abandoned_calls<'a>(
        &'a self,
        names: &'a [&'a str],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(self.abandoned_now(names, limit))
    }
}
