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
//! exactly one key, so the layout is Cluster-safe. (This store connects to a single server, a
//! primary or a proxy; it does not speak the Cluster protocol itself yet.)
//!
//! The hash's fields:
//!
//! | field | content |
//! |---|---|
//! | `status` | `0` in progress, `1` completed |
//! | `token` | the fencing token, decimal |
//! | `fingerprint` | the 32 raw bytes of the fingerprint digest |
//! | `value` | the stored result, raw bytes (completed records only) |
//! | `name` | the namespace |
//! | `created_at`, `expires_at` | ms since the Unix epoch on the server's clock, decimal |
//! | `nonce` | 16 random bytes naming the attempt that claimed it (see below) |
//! | `waiters` | `1` once a waiter asked to be told (absent otherwise) |
//!
//! A completion or release publishes on the channel named like the key (the same string) when
//! the record carries `waiters`; [`Store::changed`] subscribes there and then sets the mark
//! (`mark.lua`), which also tells it whether the record is still in progress. A completion
//! nobody waits for sends nothing: in a script, `PUBLISH` costs a call of its own, as much as
//! the read. An operator's forced release always publishes.
//!
//! # Time, expiry and purging
//!
//! Every script reads the server's clock with `TIME` (allowed in scripts since Redis 5, whose
//! effects replication is the default), so processes with skewed clocks agree. The liveness rule
//! is applied on the `expires_at` field, and the key also gets the native expiry `PEXPIREAT
//! expires_at`: an in-progress record vanishes at the end of its lease, a completed one at the
//! end of its TTL, without any sweeper. [`Store::purge_expired`] therefore has nothing to do and
//! returns 0. Because the native expiry and `expires_at` are the same instant on the same clock,
//! a completed record that a claim can still read is live: a replay is one `HMGET`, without
//! `TIME` (each `redis.call` costs a script about as much as the read itself).
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

use super::{millis, BoxFuture, Claim, ClaimOutcome, Complete, Record, Status, Store};
use crate::error::Error;
use crate::key::Digest;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use ::redis::{Client, ErrorKind, RedisError, Script, Value};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

mod inspect;

const BACKEND: &str = "redis";

/// The largest lease or TTL a script is given: about 300 years, so that `now + ttl` stays an
/// exact integer in a Lua double and a valid `PEXPIREAT` time.
const MAX_DURATION_MS: i64 = 10_000_000_000_000;

/// Redis's own default `proto-max-bulk-len` (512 MB): the default [`RedisOptions::max_value_size`].
const DEFAULT_MAX_VALUE: usize = 512 * 1024 * 1024;

/// Room left for the other arguments of a request under the server's bulk length limit.
const BULK_HEADROOM: usize = 4096;

/// How long a waiter listens for a notification before it looks at the record again anyway
/// (covers a pub/sub connection that died without telling).
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// Options of a [`RedisStore`]: a builder, `RedisOptions::new().key_prefix("app").open(url)`.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    key_prefix: String,
    connection_timeout: Duration,
    response_timeout: Duration,
    retries: u32,
    max_value_size: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            key_prefix: "idem".to_string(),
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
            retries: 2,
            max_value_size: DEFAULT_MAX_VALUE,
        }
    }
}

impl RedisOptions {
    /// The defaults: prefix `idem`, timeouts 2 s, 2 retries, values up to 512 MB.
    pub fn new() -> Self {
        Self::default()
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

    /// Opens a store at `url` (`redis://[:password@]host[:port][/db]`, `unix:///path`) with
    /// these options.
    pub async fn open(self, url: &str) -> Result<RedisStore, Error> {
        RedisStore::open_with(url, self).await
    }

    fn validate(&self) -> Result<(), Error> {
        let p = &self.key_prefix;
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
        if p.is_empty() || p.len() > 64 || !p.chars().all(ok_char) {
            return Err(Error::Config(format!(
                "invalid Redis key prefix {p:?}: use 1 to 64 characters of A-Z a-z 0-9 _ - . : \
                 (no spaces, no braces: braces would change the Redis Cluster hash tag)"
            )));
        }
        for (what, d) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::Config(format!(
                    "Redis {what} must be greater than zero"
                )));
            }
        }
        Ok(())
    }
}

const CLAIM_LUA: &str = include_str!("redis/claim.lua");
const COMPLETE_LUA: &str = include_str!("redis/complete.lua");
const RELEASE_LUA: &str = include_str!("redis/release.lua");
const RENEW_LUA: &str = include_str!("redis/renew.lua");
const GET_LUA: &str = include_str!("redis/get.lua");
const FORCE_RELEASE_LUA: &str = include_str!("redis/force_release.lua");
const MARK_LUA: &str = include_str!("redis/mark.lua");
const ALL_LUA: [&str; 7] = [
    CLAIM_LUA,
    COMPLETE_LUA,
    RELEASE_LUA,
    RENEW_LUA,
    GET_LUA,
    FORCE_RELEASE_LUA,
    MARK_LUA,
];

/// The seven scripts, hashed once; `EVALSHA` with a `SCRIPT LOAD` fallback on `NOSCRIPT` (after a
/// server restart or `SCRIPT FLUSH`).
struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    renew: Script,
    get: Script,
    force_release: Script,
    mark: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            claim: Script::new(CLAIM_LUA),
            complete: Script::new(COMPLETE_LUA),
            release: Script::new(RELEASE_LUA),
            renew: Script::new(RENEW_LUA),
            get: Script::new(GET_LUA),
            force_release: Script::new(FORCE_RELEASE_LUA),
            mark: Script::new(MARK_LUA),
        }
    }
}

/// The Redis store behind [`crate::Idem::redis`]. See the [module docs](self) for the layout.
pub struct RedisStore {
    conn: ConnectionManager,
    scripts: Scripts,
    options: RedisOptions,
    max_value: usize,
    /// `<prefix>:v1:{`
    key_head: String,
    notifier: Arc<Notifier>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("options", &self.options)
            .field("max_value", &self.max_value)
            .finish_non_exhaustive()
    }
}

/// A Redis error with a line saying what to do about it.
#[derive(Debug)]
struct Hinted {
    source: RedisError,
    hint: &'static str,
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if !self.hint.is_empty() {
            write!(f, " ({})", self.hint)?;
        }
        Ok(())
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn hint_for(e: &RedisError) -> &'static str {
    let text = e.to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
    {
        "the server needs a password: put it in the URL, redis://:PASSWORD@host:port/ \
         (or redis://USER:PASSWORD@host:port/ with ACL users)"
    } else if e.kind() == ErrorKind::ReadOnly || text.contains("READONLY") {
        "this server is a read-only replica: point the URL at the primary"
    } else if text.contains("OOM") {
        "the server is over maxmemory; idempotency records need maxmemory-policy noeviction \
         or a volatile-* policy and room to write"
    } else if e.is_connection_refusal() {
        "is redis-server running at this address?"
    } else if e.is_timeout() {
        "the server did not answer within the response timeout"
    } else {
        ""
    }
}

fn store_err(op: &'static str, e: RedisError) -> Error {
    let hint = hint_for(&e);
    Error::store(BACKEND, op, Hinted { source: e, hint })
}

fn corrupt(op: &'static str, what: &str) -> Error {
    Error::store(
        BACKEND,
        op,
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
    /// Opens a store at `url` with the default [`RedisOptions`].
    ///
    /// A URL that does not parse is [`Error::Config`]; a server that cannot be reached, refuses
    /// the password or is older than Redis 7 is [`Error::Store`] with `op = "open"`.
    pub async fn open(url: &str) -> Result<RedisStore, Error> {
        Self::open_with(url, RedisOptions::default()).await
    }

    /// The options builder: `RedisStore::options().key_prefix("app").open(url)`.
    pub fn options() -> RedisOptions {
        RedisOptions::default()
    }

    /// Opens a store at `url` with `options`.
    pub async fn open_with(url: &str, options: RedisOptions) -> Result<RedisStore, Error> {
        options.validate()?;
        let client =
            Client::open(url).map_err(|e| Error::Config(format!("invalid Redis URL: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(options.connection_timeout)
            .set_response_timeout(options.response_timeout)
            // One attempt per reconnection; `run` paces its own retries.
            .set_number_of_retries(0);
        let open = ConnectionManager::new_with_config(client.clone(), config);
        let budget = options.connection_timeout + options.response_timeout;
        let mut conn = match tokio::time::timeout(budget, open).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(store_err("open", e)),
            Err(_) => {
                return Err(Error::store(
                    BACKEND,
                    "open",
                    format!("no connection to the Redis server within {budget:?}"),
                ))
            }
        };

        let scripts = Scripts::new();
        // Load every script once (one pipelined round trip).
        let mut pipe = ::redis::pipe();
        for code in ALL_LUA {
            pipe.cmd("SCRIPT").arg("LOAD").arg(code);
        }
        let loaded = tokio::time::timeout(
            options.response_timeout,
            pipe.query_async::<Vec<String>>(&mut conn),
        )
        .await;
        match loaded {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.to_string().contains("shebang") || e.to_string().contains("#!") => {
                return Err(Error::store(
                    BACKEND,
                    "open",
                    format!(
                        "the server refused idem's scripts ({e}): Redis 7.0 or newer is needed"
                    ),
                ))
            }
            Ok(Err(e)) => return Err(store_err("open", e)),
            Err(_) => {
                return Err(Error::store(
                    BACKEND,
                    "open",
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
            notifier: Arc::new(Notifier::new(client, options.clone())),
            options,
        })
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

    /// Runs one script; a connection error is retried after the manager reconnects.
    async fn run(
        &self,
        op: &'static str,
        script: &Script,
        key: &str,
        args: &[&[u8]],
    ) -> Result<(Value, u32), Error> {
        let mut inv = script.key(key);
        for a in args {
            inv.arg(*a);
        }
        let budget = self.options.connection_timeout + self.options.response_timeout;
        let mut attempt = 0u32;
        loop {
            let mut conn = self.conn.clone();
            match tokio::time::timeout(budget, inv.invoke_async::<Value>(&mut conn)).await {
                Ok(Ok(v)) => return Ok((v, attempt)),
                Ok(Err(e))
                    if attempt < self.options.retries && e.is_io_error() && !e.is_timeout() =>
                {
                    attempt += 1;
                    tracing::debug!(op, attempt, error = %e, "idem: redis step retried");
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
                Ok(Err(e)) => return Err(store_err(op, e)),
                Err(_) => {
                    return Err(Error::store(
                        BACKEND,
                        op,
                        format!("no reply from the Redis server within {budget:?}"),
                    ))
                }
            }
        }
    }

    async fn do_claim(&self, c: Claim<'_>) -> Result<ClaimOutcome, Error> {
        let key = self.redis_key(c.key);
        let lease = duration_ms(c.lease).to_string();
        let nonce = nonce();
        let args: [&[u8]; 4] = [
            c.name.as_bytes(),
            c.fingerprint.as_bytes(),
            lease.as_bytes(),
            &nonce,
        ];
        let (v, _) = self.run("claim", &self.scripts.claim, &key, &args).await?;
        let Value::Array(items) = v else {
            return Err(corrupt("claim", "not an array"));
        };
        match items.first() {
            Some(Value::Int(1)) => {
                let token = items
                    .get(1)
                    .and_then(as_u64)
                    .ok_or_else(|| corrupt("claim", "token"))?;
                Ok(ClaimOutcome::Claimed { token })
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
            return Err(Error::store(
                BACKEND,
                "complete",
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
        let args: [&[u8]; 3] = [token.as_bytes(), done.value, ttl.as_bytes()];
        let (v, attempt) = self
            .run("complete", &self.scripts.complete, &key, &args)
            .await?;
        match v {
            Value::Int(1) => Ok(true),
            // Already completed with this token: by this very call when it was a retry.
            Value::Int(2) => Ok(attempt > 0),
            Value::Int(0) => Ok(false),
            _ => Err(corrupt("complete", "not 0, 1 or 2")),
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

/// `{status, token, fingerprint, value, name, created_at, expires_at, now}` (`now` nil only
/// for a completed record found by a claim).
fn parse_record(op: &'static str, key: Digest, f: &[Value]) -> Result<Record, Error> {
    if f.len() != 8 {
        return Err(corrupt(op, "a record has 8 fields"));
    }
    let status = match as_bytes(&f[0]) {
        Some(b"0") => Status::InProgress,
        Some(b"1") => Status::Completed,
        _ => return Err(corrupt(op, "status")),
    };
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
            // The claim script skips TIME for a completed record (the key's native expiry
            // already proves it live) and nothing decides on `now` for one: this process's
            // clock, kept inside the record's life, stands in.
            (Value::Nil, Status::Completed) => super::local_now_ms()
                .clamp(created_at, expires_at.saturating_sub(1).max(created_at)),
            (v, _) => as_i64(v).ok_or_else(|| corrupt(op, "now"))?,
        },
        created_at,
        expires_at,
    })
}

impl Store for RedisStore {
    fn backend(&self) -> &'static str {
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
            let channel = self.redis_key(key);
            let waiter = self.notifier.register(&channel);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Err(e) = self.notifier.subscribe(&channel).await {
                tracing::debug!(error = %e, "idem: redis pub/sub unavailable; polling");
                tokio::time::sleep(timeout.min(Duration::from_millis(25))).await;
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

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read("force_release", &self.scripts.force_release, key))
    }
}

/// The waiters of one channel.
struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// The subscribing half of the pub/sub connection and what it is subscribed to.
#[derive(Default)]
struct Subscriptions {
    sink: Option<PubSubSink>,
    channels: HashSet<String>,
    /// Bumped on every new connection, so a dispatcher that ends only resets its own.
    generation: u64,
}

/// One pub/sub connection per store, shared by every waiter: a channel is subscribed while a
/// waiter listens on it (and for [`LINGER`] after, so a wait loop does not subscribe anew on
/// every turn), and each message wakes that channel's waiters.
struct Notifier {
    client: Client,
    options: RedisOptions,
    waiters: Mutex<HashMap<String, Waiters>>,
    /// Subscribe and unsubscribe are serialised by this lock, so the "is anyone still
    /// waiting?" check and the command it decides are never interleaved.
    subs: tokio::sync::Mutex<Subscriptions>,
    dispatcher: Mutex<Option<tokio::task::AbortHandle>>,
}

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(1);

/// A registered waiter; unregisters (and unsubscribes when it was the last) on drop.
struct Waiter<'a> {
    notifier: &'a Arc<Notifier>,
    channel: String,
    notify: Arc<Notify>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let last = {
            let mut w = lock(&self.notifier.waiters);
            match w.get_mut(&self.channel) {
                Some(entry) if entry.count > 1 => {
                    entry.count -= 1;
                    false
                }
                Some(_) => {
                    w.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let notifier = Arc::downgrade(self.notifier);
                let channel = std::mem::take(&mut self.channel);
                rt.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    if let Some(n) = notifier.upgrade() {
                        n.unsubscribe(&channel).await;
                    }
                });
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

impl Notifier {
    fn new(client: Client, options: RedisOptions) -> Self {
        Notifier {
            client,
            options,
            waiters: Mutex::new(HashMap::new()),
            subs: tokio::sync::Mutex::new(Subscriptions::default()),
            dispatcher: Mutex::new(None),
        }
    }

    fn register<'a>(self: &'a Arc<Self>, channel: &str) -> Waiter<'a> {
        let mut w = lock(&self.waiters);
        let entry = w.entry(channel.to_string()).or_insert_with(|| Waiters {
            notify: Arc::new(Notify::new()),
            count: 0,
        });
        entry.count += 1;
        Waiter {
            notifier: self,
            channel: channel.to_string(),
            notify: entry.notify.clone(),
        }
    }

    /// Makes sure `channel` is subscribed, connecting the pub/sub connection first if there is
    /// none or it died (one reconnection per call).
    async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<(), RedisError> {
        let mut subs = self.subs.lock().await;
        if subs.sink.is_some() && subs.channels.contains(channel) {
            return Ok(());
        }
        for fresh in [false, true] {
            if subs.sink.is_none() || fresh {
                self.connect(&mut subs).await?;
            }
            let sink = subs.sink.as_mut().expect("connected above");
            let res = tokio::time::timeout(self.options.response_timeout, sink.subscribe(channel))
                .await
                .unwrap_or_else(|_| Err(timed_out("SUBSCRIBE")));
            match res {
                Ok(()) => {
                    subs.channels.insert(channel.to_string());
                    return Ok(());
                }
                Err(e) if !fresh => {
                    tracing::debug!(error = %e, "idem: redis pub/sub connection lost; reconnecting")
                }
                Err(e) => {
                    subs.sink = None;
                    return Err(e);
                }
            }
        }
        unreachable!("the second round returns")
    }

    async fn unsubscribe(&self, channel: &str) {
        let mut subs = self.subs.lock().await;
        if lock(&self.waiters).contains_key(channel) || !subs.channels.remove(channel) {
            return; // someone is waiting again, or the connection it was on is gone
        }
        if let Some(sink) = subs.sink.as_mut() {
            let r = tokio::time::timeout(self.options.response_timeout, sink.unsubscribe(channel));
            if !matches!(r.await, Ok(Ok(()))) {
                subs.sink = None;
                subs.channels.clear();
            }
        }
    }

    async fn connect(self: &Arc<Self>, subs: &mut Subscriptions) -> Result<(), RedisError> {
        subs.sink = None;
        subs.channels.clear();
        subs.generation += 1;
        let generation = subs.generation;
        let pubsub = tokio::time::timeout(
            self.options.connection_timeout,
            self.client.get_async_pubsub(),
        )
        .await
        .map_err(|_| timed_out("the pub/sub connection"))??;
        let (sink, mut stream) = pubsub.split();
        let weak: Weak<Notifier> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(n) = weak.upgrade() else { return };
                let waiters = lock(&n.waiters);
                if let Some(w) = waiters.get(msg.get_channel_name()) {
                    w.notify.notify_waiters();
                }
            }
            // The connection ended: forget it, and wake everyone so they look at their
            // records and subscribe again on a new connection.
            let Some(n) = weak.upgrade() else { return };
            {
                let mut subs = n.subs.lock().await;
                if subs.generation == generation {
                    subs.sink = None;
                    subs.channels.clear();
                }
            }
            for w in lock(&n.waiters).values() {
                w.notify.notify_waiters();
            }
        });
        if let Some(old) = lock(&self.dispatcher).replace(task.abort_handle()) {
            old.abort();
        }
        subs.sink = Some(sink);
        Ok(())
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.dispatcher).take() {
            task.abort();
        }
    }
}
