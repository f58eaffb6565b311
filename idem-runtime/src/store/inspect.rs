//! What an operator can ask a store: its live records, filtered, and counts by state.
//!
//! Every store answers [`Inspect::list`] and [`Inspect::stats`] with one query over the records
//! it keeps (one `SELECT` for SQL; a `SCAN` of the key prefix for Redis). Nothing here decides
//! what a record means for a call: that stays in [`crate::protocol`].

use super::{millis, BoxFuture, Record, Status, Store};
use crate::error::Error;
use crate::key::Digest;
use std::time::Duration;

/// Which records [`Inspect::list`] returns: live records only, oldest claim first.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Filter {
    /// Only this namespace.
    pub name: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only records claimed at least this long ago (by the store's clock).
    pub older_than: Option<Duration>,
    /// At most this many records.
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            name: None,
            status: None,
            older_than: None,
            limit: 100,
        }
    }
}

impl Filter {
    /// Every live record, at most 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only namespace `name` (`None`: every namespace).
    pub fn name(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }

    /// Only records with `status` (`None`: any). `Some(Status::Parked)` lists the parked keys,
    /// the ones waiting for an operator's resolve.
    pub fn status(mut self, status: Option<Status>) -> Self {
        self.status = status;
        self
    }

    /// Only records claimed at least this long ago (`None`: any age).
    pub fn older_than(mut self, age: Option<Duration>) -> Self {
        self.older_than = age;
        self
    }

    /// At most `limit` records.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// True when `info` passes every condition (for stores that filter client side).
    pub fn matches(&self, info: &KeyInfo) -> bool {
        self.name.as_deref().is_none_or(|n| n == info.name)
            && self.status.is_none_or(|s| s == info.status)
            && info.expires_at > info.now
            && info.created_at <= info.now.saturating_sub(self.older_than_ms())
    }

    /// The age threshold in milliseconds (0 without one).
    pub fn older_than_ms(&self) -> i64 {
        self.older_than.map_or(0, millis)
    }
}

/// One record as a listing shows it: everything but the stored value, whose size it gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The namespace.
    pub name: String,
    /// The key's digest.
    pub key: Digest,
    /// The fingerprint of the claiming attempt's arguments.
    pub fingerprint: Digest,
    /// The fencing token.
    pub token: u64,
    /// In progress, completed or parked (a listing shows live records).
    pub status: Status,
    /// The attempt number (1 unless the attempt took over an abandoned one).
    pub attempt: u32,
    /// Until when the store keeps the record.
    pub keep_until: i64,
    /// Size of the stored result in bytes (completed records).
    pub value_size: Option<u64>,
    /// When the current attempt claimed it (ms since the epoch, store clock).
    pub created_at: i64,
    /// End of the lease or of the TTL.
    pub expires_at: i64,
    /// The store's clock when it was read.
    pub now: i64,
}

impl From<&Record> for KeyInfo {
    fn from(r: &Record) -> Self {
        KeyInfo {
            name: r.name.clone(),
            key: r.key,
            fingerprint: r.fingerprint,
            token: r.token,
            status: r.status,
            attempt: r.attempt,
            keep_until: r.keep_until,
            value_size: r.value.as_ref().map(|v| v.len() as u64),
            created_at: r.created_at,
            expires_at: r.expires_at,
            now: r.now,
        }
    }
}

/// What [`Inspect::stats`] counts a record as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Live and in progress.
    InProgress,
    /// Live and completed.
    Completed,
    /// No longer live, still stored (expired, released, or abandoned and no longer kept): the
    /// next purge deletes it.
    Expired,
    /// Parked: an abandoned attempt whose outcome waits for an operator's resolve.
    Parked,
    /// Abandoned: in progress, its lease lapsed without a result or a release, still kept; the
    /// next call with the key takes it over.
    Abandoned,
}

impl State {
    /// The state of a record with this status, expiry and `keep_until` at `now`.
    pub fn of(status: Status, expires_at: i64, keep_until: i64, now: i64) -> State {
        if crate::protocol::abandoned(status, expires_at, keep_until, now) {
            return State::Abandoned;
        }
        match status {
            Status::Parked => State::Parked,
            _ if !crate::protocol::is_live(expires_at, now) => State::Expired,
            Status::InProgress => State::InProgress,
            Status::Completed => State::Completed,
            Status::Released => State::Expired,
        }
    }

    /// From the number the SQL stores' `CASE` computes: 0 in progress, 1 completed, 2 expired,
    /// 3 parked, 4 abandoned.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn from_code(code: i64) -> Option<State> {
        match code {
            0 => Some(State::InProgress),
            1 => Some(State::Completed),
            2 => Some(State::Expired),
            3 => Some(State::Parked),
            4 => Some(State::Abandoned),
            _ => None,
        }
    }
}

/// How many records of one namespace are in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The namespace.
    pub name: String,
    /// The state counted.
    pub state: State,
    /// How many.
    pub count: u64,
}

/// A store an operator can look into.
pub trait Inspect: Store {
    /// The live records that pass `filter`, oldest claim first, at most `filter.limit`.
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>>;

    /// Counts of every stored record by namespace and state, sorted by namespace.
    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>>;
}

/// Sorts and truncates a client-side listing the way the SQL stores order theirs.
pub(crate) fn finish_listing(mut rows: Vec<KeyInfo>, filter: &Filter) -> Vec<KeyInfo> {
    rows.sort_by_key(|r| (r.created_at, r.key));
    rows.truncate(filter.limit);
    rows
}

/// Adds up counts per `(name, state)` for stores that count client side.
pub(crate) fn count_states(items: impl IntoIterator<Item = (String, State)>) -> Vec<Stat> {
    let mut counts = std::collections::BTreeMap::<(String, State), u64>::new();
    for k in items {
        *counts.entry(k).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((name, state), count)| Stat { name, state, count })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        assert_eq!(State::of(Status::InProgress, 10, 20, 5), State::InProgress);
        assert_eq!(State::of(Status::Completed, 10, 10, 5), State::Completed);
        assert_eq!(State::of(Status::Completed, 10, 10, 10), State::Expired);
        assert_eq!(State::of(Status::InProgress, 10, 20, 15), State::Abandoned);
        assert_eq!(State::of(Status::InProgress, 10, 20, 21), State::Expired);
        assert_eq!(State::of(Status::Released, 10, 10, 10), State::Expired);
        assert_eq!(
            State::of(Status::Parked, i64::MAX, i64::MAX, 10),
            State::Parked
        );
        assert_eq!(State::from_code(2), Some(State::Expired));
        assert_eq!(State::from_code(3), Some(State::Parked));
        assert_eq!(State::from_code(4), Some(State::Abandoned));
        assert_eq!(State::from_code(5), None);
    }
}
