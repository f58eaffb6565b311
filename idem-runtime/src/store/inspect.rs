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
    /// List tombstones (completed, their result expired, still kept: `tombstone = …`) instead
    /// of live records.
    pub tombstones: bool,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            name: None,
            status: None,
            older_than: None,
            limit: 100,
            tombstones: false,
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

    /// Tombstones instead of live records (`true`), or live records (`false`, the default).
    pub fn tombstones(mut self, tombstones: bool) -> Self {
        self.tombstones = tombstones;
        self
    }

    /// True when `info` passes every condition (for stores that filter client side).
    pub fn matches(&self, info: &KeyInfo) -> bool {
        let listed = if self.tombstones {
            crate::protocol::tombstoned(info.status, info.expires_at, info.keep_until, info.now)
        } else {
            info.expires_at > info.now
        };
        self.name.as_deref().is_none_or(|n| n == info.name)
            && self.status.is_none_or(|s| s == info.status)
            && listed
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
    /// A tombstone: completed, its result expired, its digest and fingerprint still kept
    /// (`tombstone = …`); a call with the key gets `Error::Expired`.
    Tombstone,
}

impl State {
    /// The state of a record with this status, expiry and `keep_until` at `now`.
    pub fn of(status: Status, expires_at: i64, keep_until: i64, now: i64) -> State {
        if crate::protocol::abandoned(status, expires_at, keep_until, now) {
            return State::Abandoned;
        }
        if crate::protocol::tombstoned(status, expires_at, keep_until, now) {
            return State::Tombstone;
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
    /// 3 parked, 4 abandoned, 5 tombstone.
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
            5 => Some(State::Tombstone),
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

/// Where a page of [`Inspect::page`] resumes: after the record with this expiry and key (the
/// last one of the previous page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The last record's `expires_at`.
    pub expires_at: i64,
    /// The last record's key.
    pub key: Digest,
}

impl Cursor {
    /// The cursor after `info`.
    pub fn after(info: &KeyInfo) -> Cursor {
        Cursor {
            expires_at: info.expires_at,
            key: info.key,
        }
    }

    /// True when `info` comes after the cursor in [`Inspect::page`]'s order.
    pub fn precedes(&self, info: &KeyInfo) -> bool {
        (info.expires_at, info.key) > (self.expires_at, self.key)
    }
}

/// Which records [`Inspect::page`] returns: the live records `filter` selects (its `limit`
/// is the page's size), soonest expiry first then by key, after `after`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PageQuery {
    /// Namespace, status, age and page size.
    pub filter: Filter,
    /// Only the steps of the call with this key (namespaces `<key hex>/<step>`).
    pub steps_of: Option<Digest>,
    /// Only records after this one.
    pub after: Option<Cursor>,
}

impl PageQuery {
    /// The first page of `filter`.
    pub fn new(filter: Filter) -> Self {
        PageQuery {
            filter,
            steps_of: None,
            after: None,
        }
    }

    /// Only the steps of the call with key `parent` (`None`: any record).
    pub fn steps_of(mut self, parent: Option<Digest>) -> Self {
        self.steps_of = parent;
        self
    }

    /// The page after `cursor` (`None`: the first).
    pub fn after(mut self, cursor: Option<Cursor>) -> Self {
        self.after = cursor;
        self
    }

    /// The namespace prefix of `steps_of`: `<hex>/`.
    pub fn steps_prefix(&self) -> Option<String> {
        self.steps_of.map(|k| format!("{}/", k.to_hex()))
    }

    /// True when `info` passes every condition (for stores that page client side).
    pub fn matches(&self, info: &KeyInfo) -> bool {
        self.filter.matches(info)
            && self
                .steps_prefix()
                .is_none_or(|p| info.name.starts_with(&p))
            && self.after.is_none_or(|c| c.precedes(info))
    }
}

/// The namespace a summary counts a record under: a step's (`<parent key hex>/<step>`) is
/// `*/<step>`, so that the steps of every call add up on one line; any other is itself.
pub fn summary_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.split_at_checked(64) {
        Some((hex, rest)) if rest.starts_with('/') && Digest::from_hex(hex).is_some() => {
            std::borrow::Cow::Owned(format!("*{rest}"))
        }
        _ => std::borrow::Cow::Borrowed(name),
    }
}

/// One namespace in [`Inspect::overview`]: its records by state, its oldest attempt in flight
/// and how many of its keys expire soon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameSummary {
    /// The namespace, as [`summary_name`] groups it.
    pub name: String,
    /// Live records in progress.
    pub in_progress: u64,
    /// Live completed records.
    pub completed: u64,
    /// Records no longer live, still stored (abandoned attempts among them).
    pub expired: u64,
    /// Parked keys: abandoned attempts whose outcome waits for an operator.
    pub parked: u64,
    /// When the oldest live in-progress attempt claimed its key (ms since the epoch, store
    /// clock).
    pub oldest_in_progress: Option<i64>,
    /// Live records whose lease or TTL ends within the horizon asked for.
    pub expiring_soon: u64,
}

/// What [`Inspect::overview`] answers: one summary per namespace, sorted by name, and the
/// store's clock when it counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overview {
    /// One line per namespace (steps grouped by [`summary_name`]).
    pub names: Vec<NameSummary>,
    /// The store's clock (ms since the epoch).
    pub now: i64,
}

impl Overview {
    /// Adds one record (its summary name, state, claim and expiry) to the counts: for stores
    /// that count client side.
    pub fn add(&mut self, info: &KeyInfo, soon: Duration) {
        let s = self.entry(&info.name);
        match State::of(info.status, info.expires_at, info.keep_until, info.now) {
            State::Expired | State::Abandoned => s.expired += 1,
            State::Parked => s.parked += 1,
            state => {
                if state == State::InProgress {
                    s.in_progress += 1;
                    s.oldest_in_progress = Some(
                        s.oldest_in_progress
                            .map_or(info.created_at, |t| t.min(info.created_at)),
                    );
                } else {
                    s.completed += 1;
                }
                if info.expires_at <= info.now.saturating_add(millis(soon)) {
                    s.expiring_soon += 1;
                }
            }
        }
    }

    /// Adds `count` expired records of namespace `name` (grouped by [`summary_name`]).
    pub fn add_expired(&mut self, name: &str, count: u64) {
        self.entry(name).expired += count;
    }

    /// The summary of `name`'s group, inserted in order when new.
    fn entry(&mut self, name: &str) -> &mut NameSummary {
        let name = summary_name(name);
        let at = match self.names.binary_search_by(|s| s.name.as_str().cmp(&name)) {
            Ok(i) => i,
            Err(i) => {
                self.names.insert(
                    i,
                    NameSummary {
                        name: name.into_owned(),
                        ..NameSummary::default()
                    },
                );
                i
            }
        };
        &mut self.names[at]
    }
}

/// A store an operator can look into.
pub trait Inspect: Store {
    /// The live records that pass `filter`, oldest claim first, at most `filter.limit`.
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>>;

    /// Counts of every stored record by namespace and state, sorted by namespace.
    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>>;

    /// One page of live records for a board: those `query` selects, soonest expiry first then
    /// by key, after its cursor. The SQL stores answer from their expiry index, without
    /// `OFFSET`; by default, and on Redis and DynamoDB, the records are listed and paged
    /// client side.
    fn page<'a>(&'a self, query: &'a PageQuery) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let all = query.filter.clone().limit(usize::MAX);
            let mut rows: Vec<KeyInfo> = self
                .list(&all)
                .await?
                .into_iter()
                .filter(|r| query.matches(r))
                .collect();
            rows.sort_by_key(|r| (r.expires_at, r.key));
            rows.truncate(query.filter.limit);
            Ok(rows)
        })
    }

    /// The parked keys (abandoned attempts waiting for an operator's [`Store::resolve`]) of
    /// namespace `name` (`None`: every namespace), oldest claim first, at most `limit`. A parked
    /// record never lapses (`expires_at = keep_until = i64::MAX`), so the SQL stores find them
    /// through their `keep_until` index; by default, and on Redis and DynamoDB, this is
    /// [`Inspect::list`] with [`Filter::status`] `Parked`.
    fn parked<'a>(
        &'a self,
        name: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let filter = Filter::new()
                .name(name.map(str::to_owned))
                .status(Some(Status::Parked))
                .limit(limit);
            self.list(&filter).await
        })
    }

    /// Every namespace's records by state, its oldest attempt in flight, and how many of its
    /// live records expire within `soon`; the SQL stores count in one statement. By default,
    /// and on Redis and DynamoDB, from a listing of the live records and [`Inspect::stats`].
    fn overview(&self, soon: Duration) -> BoxFuture<'_, Result<Overview, Error>> {
        Box::pin(async move {
            let live = self.list(&Filter::new().limit(usize::MAX)).await?;
            let mut overview = Overview::default();
            for info in &live {
                overview.now = overview.now.max(info.now);
                overview.add(info, soon);
            }
            for stat in self.stats().await? {
                if stat.state == State::Expired {
                    overview.add_expired(&stat.name, stat.count);
                }
            }
            if overview.now == 0 {
                overview.now = super::local_now_ms();
            }
            Ok(overview)
        })
    }
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
        assert_eq!(State::from_code(5), Some(State::Tombstone));
        assert_eq!(State::from_code(6), None);
    }

    fn info(name: &str, key: u8, status: Status, created_at: i64, expires_at: i64) -> KeyInfo {
        KeyInfo {
            name: name.into(),
            key: Digest([key; 32]),
            fingerprint: Digest([0; 32]),
            token: 1,
            status,
            value_size: None,
            created_at,
            expires_at,
            now: 1_000,
            attempt: 1,
            keep_until: expires_at,
        }
    }

    #[test]
    fn steps_are_summed_under_their_step_name() {
        let parent = Digest([9; 32]).to_hex();
        assert_eq!(summary_name(&format!("{parent}/charge")), "*/charge");
        assert_eq!(summary_name("orders/charge"), "orders/charge");
        assert_eq!(
            summary_name(&format!("{}/x", "z".repeat(64))),
            format!("{}/x", "z".repeat(64))
        );
        let mut o = Overview::default();
        let soon = Duration::from_millis(100);
        o.add(
            &info(
                &format!("{parent}/charge"),
                1,
                Status::InProgress,
                500,
                1_050,
            ),
            soon,
        );
        o.add(
            &info(
                &format!("{}/charge", Digest([8; 32]).to_hex()),
                2,
                Status::InProgress,
                300,
                5_000,
            ),
            soon,
        );
        o.add(&info("orders", 3, Status::Completed, 0, 9_000), soon);
        o.add(&info("orders", 4, Status::Completed, 0, 900), soon);
        o.add_expired("orders", 2);
        assert_eq!(o.names.len(), 2);
        let step = &o.names[0];
        assert_eq!(step.name, "*/charge");
        assert_eq!(
            (
                step.in_progress,
                step.oldest_in_progress,
                step.expiring_soon
            ),
            (2, Some(300), 1)
        );
        let orders = &o.names[1];
        assert_eq!((orders.completed, orders.expired), (1, 3));
    }

    #[test]
    fn pages_resume_after_their_cursor() {
        let parent = Digest([9; 32]);
        let q = PageQuery::new(Filter::new())
            .steps_of(Some(parent))
            .after(Some(Cursor {
                expires_at: 2_000,
                key: Digest([5; 32]),
            }));
        let step = format!("{}/charge", parent.to_hex());
        assert!(q.matches(&info(&step, 6, Status::Completed, 0, 2_000)));
        assert!(!q.matches(&info(&step, 5, Status::Completed, 0, 2_000)));
        assert!(!q.matches(&info(&step, 9, Status::Completed, 0, 1_999)));
        assert!(!q.matches(&info("orders", 9, Status::Completed, 0, 3_000)));
    }
}
