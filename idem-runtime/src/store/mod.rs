//! The `Store` trait: one atomic operation on the backend per protocol step.
//!
//! A store decides nothing about what a record *means*; the runtime's [`crate::protocol`] does.
//! A store only has to make each step atomic and to apply the one liveness rule:
//!
//! > a record is **live** while `now < expires_at`, on the store's own clock.
//!
//! An in-progress record's `expires_at` is the end of its lease; a completed record's is the end
//! of its TTL; a released one's is the moment it was released; a parked one's is never
//! (`i64::MAX`). A record that is not live is, for every step, the same as no record at all,
//! except that a claim reads its token, and, when it is **abandoned** (in progress, its lease
//! lapsed, still kept: [`crate::protocol::abandoned`]), takes it over: the claim learns the
//! attempt number and when the abandoned attempt began ([`Takeover`]).
//!
//! Records are kept until `keep_until` ([`Record::keep_until`]), not merely `expires_at`: a
//! claim keeps its record as long as its result would have been kept (`now + max(lease, ttl)`),
//! so that an attempt that died is still told from a free key when the next call comes.
//!
//! Fencing tokens: a claim that creates or takes over a record gives it the token
//! [`crate::protocol::next_token`] of the previous token and the store's clock, so a token is
//! never reused for a key, not even after the record was purged and created anew. For that, a
//! release *ends* the record instead of deleting it ([`crate::protocol::ended_at`]), and a record
//! is deleted only once [`crate::protocol::may_forget`] of its `keep_until` allows. `complete`, `release` and
//! `renew` act only when the caller's token holds the record ([`crate::protocol::holds`]: in
//! progress, that token, live).

use crate::error::Error;
use crate::key::Digest;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

mod disabled;
mod executor;
mod inspect;
mod migration;
mod releases;
pub mod resume;

pub use crate::backend::{Backend, UnknownScheme};
pub use crate::record::{ClaimOutcome, Record, Status, Takeover};
pub(crate) use disabled::DisabledStore;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use executor::Connection;
pub use executor::Executor;
pub(crate) use inspect::{count_states, finish_listing};
pub use inspect::{
    summary_name, Cursor, Filter, Inspect, KeyInfo, NameSummary, Overview, PageQuery, Stat, State,
};
pub use migration::{Migrated, Migration, SchemaVersion, DEFAULT_TABLE};
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_imports)
)]
pub(crate) use releases::{Announce, ReleaseHub};
pub use releases::{ReleaseFeed, ReleaseNote};

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb;
pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

/// A boxed, `Send` future: what every store method returns, so `Store` is object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// The column encoding of the SQL stores.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
impl Status {
    /// The status as stored in a column: 0 in progress, 1 completed, 2 released, 3 parked.
    pub(crate) fn as_i16(self) -> i16 {
        match self {
            Status::InProgress => 0,
            Status::Completed => 1,
            Status::Released => 2,
            Status::Parked => 3,
        }
    }

    /// The status from its column value.
    pub(crate) fn from_i16(v: i16) -> Option<Status> {
        match v {
            0 => Some(Status::InProgress),
            1 => Some(Status::Completed),
            2 => Some(Status::Released),
            3 => Some(Status::Parked),
            _ => None,
        }
    }

    /// The status from an integer column of any width (SQLite's INTEGER, MySQL's TINYINT,
    /// PostgreSQL's SMALLINT): `None` for a value this version does not know.
    pub(crate) fn from_column(v: impl Into<i64>) -> Option<Status> {
        i16::try_from(v.into()).ok().and_then(Status::from_i16)
    }
}

/// A request to claim a key.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    /// The namespace (kept beside the digest so operators can list keys by name).
    pub name: &'a str,
    /// The key's digest.
    pub key: &'a Digest,
    /// The fingerprint of this attempt's arguments.
    pub fingerprint: &'a Digest,
    /// How long the claim lives without renewal.
    pub lease: Duration,
    /// How long a result of this call would be kept: the claim keeps its record until
    /// `now + max(lease, ttl)` (`keep_until`), so that an attempt that dies is remembered as
    /// abandoned as long as its result would have been.
    pub ttl: Duration,
}

/// An operator's verdict on a parked key ([`Store::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve<'a> {
    /// The parked attempt's effect happened: the record becomes completed with this encoded
    /// value, kept and replayed for `ttl`.
    Applied {
        /// The encoded result callers get.
        value: &'a [u8],
        /// How long it is kept and replayed.
        ttl: Duration,
    },
    /// It did not happen: the record is released, and the next call runs the body.
    NotApplied,
}

/// What [`Store::resolve`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The key was parked and is now resolved; the record as it was (parked).
    Done(Record),
    /// The key was not parked: nothing was changed. The live record found (completed, in
    /// progress), or `None` when the key is free.
    NotParked(Option<Record>),
}

/// A request to store a finished result.
#[derive(Debug, Clone, Copy)]
pub struct Complete<'a> {
    /// The key's digest.
    pub key: &'a Digest,
    /// The token the claim returned.
    pub token: u64,
    /// The encoded result.
    pub value: &'a [u8],
    /// How long the result is kept and replayed.
    pub ttl: Duration,
    /// How long the record is kept after `ttl` as a tombstone, without its value
    /// ([`crate::protocol::tombstoned`]): `keep_until = expires_at + tombstone`. Zero: none
    /// (`keep_until = expires_at`, as before).
    pub tombstone: Duration,
}

/// A backend for idempotency records. Each method is **one atomic operation** on the backend
/// (one statement, one transaction, one script, one critical section).
pub trait Store: Send + Sync + 'static {
    /// Which backend this is, for errors, traces and metrics (a store outside this crate
    /// answers [`Backend::Other`] with its short name).
    fn backend(&self) -> Backend;

    /// Atomically: if no live record exists, write an in-progress record (fingerprint, new
    /// token, `expires_at = now + lease`, `keep_until = now + max(lease, ttl)`) and return
    /// `Claimed`; otherwise return the live record. The new token is
    /// [`protocol::next_token`](crate::protocol::next_token) of the token of the record that is
    /// there and no longer live (lapsed, expired or ended), if any. When that record is
    /// abandoned ([`protocol::abandoned`](crate::protocol::abandoned)), the claim takes it over:
    /// `attempt` is its attempt + 1 and `Claimed::takeover` says so, with its `created_at`;
    /// otherwise `attempt` is 1 and `takeover` is `None`.
    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// Atomically: if this token holds the record ([`protocol::holds`](crate::protocol::holds):
    /// in progress, this token, live), make it completed with this value and
    /// `expires_at = now + ttl`, `keep_until = expires_at + tombstone`
    /// ([`protocol::completed_keep_until`](crate::protocol::completed_keep_until)), and return
    /// `true`; otherwise change nothing, `false`. A claim finds a kept tombstone as it finds a
    /// live record ([`protocol::occupied`](crate::protocol::occupied)), and returns it without
    /// its value.
    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically: if this token holds the record, end it and return `true`: it stays, with its
    /// token, [`Status::Released`] and no longer live (`expires_at = keep_until =`
    /// [`protocol::ended_at`](crate::protocol::ended_at)`(now)`), so the next claim passes the
    /// token (and does not take it for abandoned). Deleting it would let a claim in the same
    /// millisecond get the same token.
    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically: if this token holds the record, set `expires_at = now + lease` (and raise
    /// `keep_until` to it if it was below, so a record is never forgotten while live) and
    /// return `true`.
    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The live record of a key, if any.
    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>>;

    /// Deletes at most `limit` records kept until before now
    /// ([`protocol::may_forget`](crate::protocol::may_forget): `keep_until < now`, so one that
    /// ended this millisecond keeps its token for claims in it, an abandoned one is kept as long
    /// as its claim asked, and a parked one never goes); returns how many it deleted.
    /// Bounded so that it never holds the backend for long: call it in a loop to drain.
    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>>;

    /// The largest value this store can hold, in bytes, if it has a limit of its own below
    /// [`crate::DEFAULT_MAX_VALUE_LEN`] (DynamoDB's item limit, say). A handle refuses a larger
    /// result before it reaches the store ([`crate::CodecErrorKind::TooLarge`], key released).
    /// The default: no limit of its own.
    fn max_value_len(&self) -> Option<usize> {
        None
    }

    /// Resolves when the record of `key` may have changed (completed or released), or after
    /// `timeout`. A store without notifications polls: the default sleeps a short interval.
    fn changed<'a>(&'a self, key: &'a Digest, timeout: Duration) -> BoxFuture<'a, ()> {
        let _ = key;
        Box::pin(tokio::time::sleep(timeout.min(Duration::from_millis(25))))
    }

    /// A feed of the keys force-released on this store ([`Store::force_release`]) by any
    /// instance or tool, for what an instance keeps about completed records (the handle's local
    /// cache) to forget them at once. `None` (the default): the store publishes no releases.
    /// PostgreSQL (`LISTEN`, unless opened with `notify(false)`) and a single Redis server
    /// (pub/sub) have one. Make it on a Tokio runtime: the store's listener starts with the
    /// first feed.
    fn releases(&self) -> Option<ReleaseFeed> {
        None
    }

    /// Ends the live record of `key` whatever its state (an operator's release after an incident
    /// review), as [`Store::release`] ends one: [`Status::Released`], no longer live, its token
    /// kept. A parked key may be force-released too: that frees it, and the next call runs the
    /// body (as [`Resolve::NotApplied`] does, without looking). Returns the record as it was,
    /// or `None` when the key had no live record (nothing is changed then).
    fn force_release<'a>(&'a self, key: &'a Digest)
        -> BoxFuture<'a, Result<Option<Record>, Error>>;

    /// An [`Executor`] that runs this store's claim, completion and release on `conn`, a
    /// caller's connection inside its transaction, with the same statements as the store's own
    /// steps (the transactional mode: `Call::in_transaction`). `None` (the default) when this
    /// store is not of that connection's database.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn in_transaction<'a>(&'a self, conn: Connection<'a>) -> Option<Box<dyn Executor + 'a>> {
        let _ = conn;
        None
    }

    /// Atomically: if this token holds the record ([`protocol::holds`](crate::protocol::holds)),
    /// park it: [`Status::Parked`], `expires_at = keep_until = i64::MAX` (it never lapses: only
    /// an operator's [`Store::resolve`] or [`Store::force_release`] ends it), and return
    /// `true`; otherwise change nothing, `false`. Every later claim finds it live.
    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically: if this token holds the record, abandon it: `expires_at =`
    /// [`protocol::ended_at`](crate::protocol::ended_at)`(now)`, status still in progress and
    /// `keep_until` as the claim set it, so the next claim takes it over as abandoned (with the
    /// next attempt number); return `true`. Otherwise change nothing, `false`. (For an attempt
    /// that took over and could not decide what the abandoned one did.)
    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically, only if the record of `key` is [`Status::Parked`]: [`Resolve::Applied`]
    /// makes it completed with the value (its token kept, `expires_at = keep_until = now +
    /// ttl`); [`Resolve::NotApplied`] releases it (`expires_at = keep_until =`
    /// [`protocol::ended_at`](crate::protocol::ended_at)`(now)`). Returns the parked record as
    /// it was. Anything else (completed, in progress, free) is left as it is:
    /// [`Resolved::NotParked`] with the live record found.
    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>>;

    /// Atomically: if this token holds the record, keep `args` (a resumable call's encoded
    /// arguments) as its value while it is in progress, and return `true`; otherwise change
    /// nothing, `false`. A completion replaces them with the result; a claim that takes the
    /// record over as abandoned keeps them. See [`resume`] for how each store finds them. The
    /// default: this store cannot resume calls.
    fn keep_args<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (key, token, args);
        Box::pin(std::future::ready(Err(resume::unsupported(self.backend()))))
    }

    /// At most `limit` abandoned records ([`protocol::abandoned`](crate::protocol::abandoned))
    /// of the namespaces `names` that keep arguments ([`Store::keep_args`]), the longest
    /// lapsed first: what a resumer finishes. Read from an index, never a scan of every record
    /// (see [`resume`]). The default: this store cannot resume calls.
    fn abandoned_calls<'a>(
        &'a self,
        names: &'a [&'a str],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        let _ = (names, limit);
        Box::pin(std::future::ready(Err(resume::unsupported(self.backend()))))
    }
}

/// `keep_until` of a new claim: `now + max(lease, ttl)` (see [`Claim::ttl`]).
pub(crate) fn claim_keep_until(now: i64, claim: &Claim<'_>) -> i64 {
    now.saturating_add(millis(claim.lease.max(claim.ttl)))
}

/// What a claim that read `record` (at `record.now`) answers without writing: the record when
/// it is live, the record without its value when it is a tombstone
/// ([`crate::protocol::occupied`]), `None` when the claim may take the key.
#[cfg_attr(not(any(feature = "sqlite", feature = "dynamodb")), allow(dead_code))]
pub(crate) fn occupying(record: &Record) -> Option<Record> {
    let (status, expires_at, keep_until, now) = (
        record.status,
        record.expires_at,
        record.keep_until,
        record.now,
    );
    if crate::protocol::is_live(expires_at, now) {
        return Some(record.clone());
    }
    crate::protocol::occupied(status, expires_at, keep_until, now).then(|| Record {
        value: None,
        ..record.clone()
    })
}

/// Milliseconds since the Unix epoch on this process's clock (for stores that have no clock of
/// their own: the memory and SQLite stores).
pub(crate) fn local_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A duration as whole milliseconds, saturating (for `now + ttl` arithmetic in every store).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
