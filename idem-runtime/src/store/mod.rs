//! The `Store` trait: one atomic operation on the backend per protocol step.
//!
//! A store decides nothing about what a record *means*; the runtime's [`crate::protocol`] does.
//! A store only has to make each step atomic and to apply the one liveness rule:
//!
//! > a record is **live** while `now < expires_at`, on the store's own clock.
//!
//! An in-progress record's `expires_at` is the end of its lease; a completed record's is the end
//! of its TTL; a released one's is the moment it was released. A record that is not live is,
//! for every step, the same as no record at all, except that a claim reads its token.
//!
//! Fencing tokens: a claim that creates or takes over a record gives it the token
//! [`crate::protocol::next_token`] of the previous token and the store's clock, so a token is
//! never reused for a key, not even after the record was purged and created anew. For that, a
//! release *ends* the record instead of deleting it ([`crate::protocol::ended_at`]), and a record
//! is deleted only once [`crate::protocol::may_forget`] allows. `complete`, `release` and
//! `renew` act only when the caller's token holds the record ([`crate::protocol::holds`]: in
//! progress, that token, live).

use crate::error::Error;
use crate::key::Digest;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

mod executor;
mod inspect;
mod migration;
mod releases;

pub use crate::backend::{Backend, UnknownScheme};
pub use crate::record::{ClaimOutcome, Record, Status};
#[cfg(any(feature = "postgres", feature = "mysql"))]
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
pub mod dynamodb;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// A boxed, `Send` future: what every store method returns, so `Store` is object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// The column encoding of the SQL stores.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
impl Status {
    /// The status as stored in a column: 0 in progress, 1 completed.
    pub(crate) fn as_i16(self) -> i16 {
        match self {
            Status::InProgress => 0,
            Status::Completed => 1,
        }
    }

    /// The status from its column value.
    pub(crate) fn from_i16(v: i16) -> Option<Status> {
        match v {
            0 => Some(Status::InProgress),
            1 => Some(Status::Completed),
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
}

/// A backend for idempotency records. Each method is **one atomic operation** on the backend
/// (one statement, one transaction, one script, one critical section).
pub trait Store: Send + Sync + 'static {
    /// Which backend this is, for errors, traces and metrics (a store outside this crate
    /// answers [`Backend::Other`] with its short name).
    fn backend(&self) -> Backend;

    /// Atomically: if no live record exists, write an in-progress record (fingerprint, new
    /// token, `expires_at = now + lease`) and return `Claimed`; otherwise return the live record.
    /// The new token is [`protocol::next_token`](crate::protocol::next_token) of the token of the
    /// record that is there and no longer live (lapsed, expired or ended), if any.
    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// Atomically: if this token holds the record ([`protocol::holds`](crate::protocol::holds):
    /// in progress, this token, live), make it completed with this value and
    /// `expires_at = now + ttl`, and return `true`; otherwise change nothing, `false`.
    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically: if this token holds the record, end it and return `true`: it stays, with its
    /// token, no longer live (`expires_at =`
    /// [`protocol::ended_at`](crate::protocol::ended_at)`(now)`), so the next claim passes the
    /// token. Deleting it would let a claim in the same millisecond get the same token.
    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>>;

    /// Atomically: if this token holds the record, set `expires_at = now + lease` and return
    /// `true`.
    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The live record of a key, if any.
    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>>;

    /// Deletes at most `limit` records that ended before now
    /// ([`protocol::may_forget`](crate::protocol::may_forget): `expires_at < now`, so one that
    /// ended this millisecond keeps its token for claims in it); returns how many it deleted.
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
    /// review), as [`Store::release`] ends one: no longer live, its token kept. Returns the
    /// record as it was, or `None` when the key had no live record (nothing is changed then).
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
