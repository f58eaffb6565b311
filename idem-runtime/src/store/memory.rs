//! The in-memory store: process-local, sharded, no lock held across an await.
//!
//! Each shard is a `HashMap` keyed by digest (the digest is already uniform, so the map hashes
//! it by eight of its bytes instead of running SipHash again) and a min-heap of expiry
//! times. Every write evicts a few expired entries from its own shard, so memory stays bounded
//! by the live keys without a full scan ever blocking a caller. Heap entries that a renewal or a
//! completion made stale are dropped when they surface. A record stays until the clock has
//! moved past its `keep_until` (`protocol::may_forget`): a released one's token is not handed
//! out again, an abandoned one is still taken over, and a parked one never goes.

use super::{
    count_states, finish_listing, local_now_ms, millis, Backend, BoxFuture, Claim, ClaimOutcome,
    Complete, Filter, Inspect, KeyInfo, Record, Resolve, Resolved, Stat, State, Status, Store,
    Takeover,
};
use crate::error::Error;
use crate::key::Digest;
use crate::protocol::{
    abandoned, completed_keep_until, ended_at, holds, is_live, may_forget, next_token, occupied,
    tombstoned,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

const SHARDS: usize = 64;
/// How many expired entries one write may evict from its shard.
const EVICT_PER_WRITE: usize = 4;

/// Hashes a digest by eight of its bytes: it is already a uniform hash. Not its first eight:
/// the first byte picks the shard, so within a shard the low bits the map indexes by would all
/// be alike.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        match bytes.get(8..16) {
            Some(middle) => {
                let mut b = [0u8; 8];
                b.copy_from_slice(middle);
                self.0 ^= u64::from_le_bytes(b);
            }
            // Only a digest's 32 bytes are hashed here; anything shorter is folded in whole.
            None => {
                for &byte in bytes {
                    self.0 = self.0.rotate_left(8) ^ u64::from(byte);
                }
            }
        }
    }
    /// A slice's length prefix: every digest is 32 bytes long.
    fn write_usize(&mut self, _: usize) {}
}

struct Entry {
    name: Box<str>,
    fingerprint: Digest,
    token: u64,
    status: Status,
    value: Option<Vec<u8>>,
    created_at: i64,
    expires_at: i64,
    attempt: u32,
    keep_until: i64,
}

#[derive(Default)]
struct ShardState {
    entries: HashMap<Digest, Entry, BuildHasherDefault<DigestHasher>>,
    expiry: BinaryHeap<Reverse<(i64, Digest)>>,
}

impl ShardState {
    /// Removes up to `limit` entries that may be forgotten (the heap holds `keep_until`s);
    /// returns how many it removed.
    fn evict(&mut self, now: i64, limit: usize) -> u64 {
        let mut removed = 0;
        while removed < limit as u64 {
            match self.expiry.peek() {
                Some(Reverse((at, _))) if may_forget(*at, now) => {}
                _ => break,
            }
            let Reverse((at, key)) = self.expiry.pop().expect("peeked");
            if let Some(e) = self.entries.get_mut(&key) {
                // A tombstone's value goes at the end of its TTL (filed at `expires_at`): it
                // is never replayed, only its fingerprint matters.
                if e.expires_at == at && tombstoned(e.status, e.expires_at, e.keep_until, now) {
                    e.value = None;
                    continue;
                }
                // Only the heap entry that matches the record's current `keep_until` may evict
                // it, and never a live record.
                if e.keep_until == at
                    && may_forget(e.keep_until, now)
                    && !is_live(e.expires_at, now)
                {
                    self.entries.remove(&key);
                    removed += 1;
                }
            }
        }
        removed
    }

    fn live(&mut self, key: &Digest, now: i64) -> Option<&mut Entry> {
        self.entries
            .get_mut(key)
            .filter(|e| is_live(e.expires_at, now))
    }

    /// Sets the record's `expires_at` and `keep_until`, and files it for eviction at the
    /// latter (a parked record's `i64::MAX` is never filed: it never goes by itself).
    fn set_ends(&mut self, key: &Digest, expires_at: i64, keep_until: i64) {
        if let Some(e) = self.entries.get_mut(key) {
            e.expires_at = expires_at;
            e.keep_until = keep_until;
        }
        if keep_until != i64::MAX {
            self.expiry.push(Reverse((keep_until, *key)));
        }
    }

    /// Ends the record of `key` at `now` (`protocol::ended_at`): released, no longer live, its
    /// token kept for the next claim, evicted once the clock has moved on.
    fn end(&mut self, key: &Digest, now: i64) {
        let at = ended_at(now);
        if let Some(e) = self.entries.get_mut(key) {
            e.status = Status::Released;
            e.value = None;
        }
        self.set_ends(key, at, at);
    }
}

struct Shard {
    state: Mutex<ShardState>,
    changed: Notify,
}

/// The in-memory store behind [`crate::Idem::memory`].
pub struct MemoryStore {
    shards: Box<[Shard]>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

fn record(key: &Digest, e: &Entry, now: i64) -> Record {
    Record {
        // `String::from`, not `to_string`: a `Box<str>` would go through `Display`.
        name: String::from(&*e.name),
        key: *key,
        fingerprint: e.fingerprint,
        token: e.token,
        status: e.status,
        value: e.value.clone(),
        created_at: e.created_at,
        expires_at: e.expires_at,
        attempt: e.attempt,
        keep_until: e.keep_until,
        now,
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    state: Mutex::new(ShardState::default()),
                    changed: Notify::new(),
                })
                .collect(),
        }
    }

    fn shard(&self, key: &Digest) -> &Shard {
        &self.shards[key.0[0] as usize % SHARDS]
    }

    fn lock(&self, key: &Digest) -> MutexGuard<'_, ShardState> {
        // A poisoned shard only means a panic elsewhere while it was held; every critical
        // section below leaves the map consistent, so keep serving.
        self.shard(key)
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Live records now held, over all shards (for metrics and tests).
    pub fn len(&self) -> usize {
        let now = local_now_ms();
        self.shards
            .iter()
            .map(|s| {
                let st = s.state.lock().unwrap_or_else(|p| p.into_inner());
                st.entries
                    .values()
                    .filter(|e| is_live(e.expires_at, now))
                    .count()
            })
            .sum()
    }

    /// True when no live record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every record held, live or not yet evicted (for the operator's `list`).
    pub fn records(&self) -> Vec<Record> {
        let now = local_now_ms();
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            out.extend(st.entries.iter().map(|(k, e)| record(k, e, now)));
        }
        out
    }

    /// Claims the key if no live record holds it, else returns the live record; one critical
    /// section under the shard's lock.
    fn claim_now(&self, c: Claim<'_>) -> ClaimOutcome {
        let now = local_now_ms();
        let mut st = self.lock(c.key);
        if let Some(e) = st.live(c.key, now) {
            return ClaimOutcome::Existing(record(c.key, e, now));
        }
        if let Some(e) = st
            .entries
            .get(c.key)
            .filter(|e| occupied(e.status, e.expires_at, e.keep_until, now))
        {
            // A tombstone: found without its value.
            let mut found = record(c.key, e, now);
            found.value = None;
            return ClaimOutcome::Existing(found);
        }
        // A write (a replay is not one): what keeps memory bounded by the live keys.
        st.evict(now, EVICT_PER_WRITE);
        let previous = st.entries.get(c.key);
        let takeover = previous
            .filter(|e| abandoned(e.status, e.expires_at, e.keep_until, now))
            .map(|e| Takeover {
                attempt: e.attempt.saturating_add(1),
                abandoned_at: e.created_at,
            });
        let token = next_token(previous.map(|e| e.token), now);
        // A takeover keeps a resumable call's arguments (see `store::resume`).
        let kept = previous
            .filter(|_| takeover.is_some())
            .and_then(|e| e.value.clone());
        let expires_at = now.saturating_add(millis(c.lease));
        let keep_until = super::claim_keep_until(now, &c);
        st.entries.insert(
            *c.key,
            Entry {
                name: c.name.into(),
                fingerprint: *c.fingerprint,
                token,
                status: Status::InProgress,
                value: kept,
                created_at: now,
                expires_at,
                attempt: takeover.map_or(1, |t| t.attempt),
                keep_until,
            },
        );
        st.set_ends(c.key, expires_at, keep_until);
        ClaimOutcome::Claimed { token, takeover }
    }

    /// Applies `f` to the record if `token` holds it (`protocol::holds`).
    fn fenced(&self, key: &Digest, token: u64, f: impl FnOnce(&mut ShardState, i64)) -> bool {
        let now = local_now_ms();
        let mut st = self.lock(key);
        let held = matches!(
            st.entries.get(key),
            Some(e) if holds(e.status, e.token, e.expires_at, token, now)
        );
        if held {
            f(&mut st, now);
        }
        held
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> Backend {
        Backend::Memory
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        let out = self.claim_now(claim);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(done.key, done.token, |st, now| {
            let expires_at = now.saturating_add(millis(done.ttl));
            let keep_until = completed_keep_until(expires_at, done.tombstone);
            if let Some(e) = st.entries.get_mut(done.key) {
                e.status = Status::Completed;
                e.value = Some(done.value.into());
            }
            st.set_ends(done.key, expires_at, keep_until);
            if keep_until != expires_at {
                // Filed at the TTL's end too, where eviction drops the tombstone's value.
                st.expiry.push(Reverse((expires_at, *done.key)));
            }
        });
        if ok {
            self.shard(done.key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, now| st.end(key, now));
        if ok {
            self.shard(key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, now| {
            let expires_at = now.saturating_add(millis(lease));
            let keep_until = st.entries.get(key).map_or(expires_at, |e| e.keep_until);
            st.set_ends(key, expires_at, keep_until.max(expires_at));
        });
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        let now = local_now_ms();
        let mut st = self.lock(key);
        let out = st.live(key, now).map(|e| record(key, e, now));
        drop(st);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        let now = local_now_ms();
        let mut removed = 0u64;
        for s in self.shards.iter() {
            let left = limit.saturating_sub(removed as usize);
            if left == 0 {
                break;
            }
            removed += s
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .evict(now, left);
        }
        Box::pin(std::future::ready(Ok(removed)))
    }

    fn changed<'a>(&'a self, key: &'a Digest, timeout: Duration) -> BoxFuture<'a, ()> {
        let notified = self.shard(key).changed.notified();
        // The cap covers a change that landed between the caller's last read and this call.
        let cap = timeout.min(Duration::from_millis(20));
        Box::pin(async move {
            let _ = tokio::time::timeout(cap, notified).await;
        })
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        let now = local_now_ms();
        let mut st = self.lock(key);
        // Only a live record is released; it is ended, not removed, so its token stays.
        let out = st.live(key, now).map(|e| record(key, e, now));
        if out.is_some() {
            st.end(key, now);
        }
        drop(st);
        if out.is_some() {
            self.shard(key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(out)))
    }

    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, _| {
            if let Some(e) = st.entries.get_mut(key) {
                e.status = Status::Parked;
            }
            st.set_ends(key, i64::MAX, i64::MAX);
        });
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, now| {
            // `keep_until` stays as the claim set it: the next claim takes the record over.
            if let Some(e) = st.entries.get_mut(key) {
                e.expires_at = ended_at(now);
            }
        });
        if ok {
            self.shard(key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        let now = local_now_ms();
        let mut st = self.lock(key);
        let found = st.live(key, now).map(|e| record(key, e, now));
        let out = match found {
            Some(r) if r.status == Status::Parked => {
                match resolution {
                    Resolve::Applied { value, ttl } => {
                        let end = now.saturating_add(millis(ttl));
                        if let Some(e) = st.entries.get_mut(key) {
                            e.status = Status::Completed;
                            e.value = Some(value.into());
                        }
                        st.set_ends(key, end, end);
                    }
                    Resolve::NotApplied => st.end(key, now),
                }
                Resolved::Done(r)
            }
            other => Resolved::NotParked(other),
        };
        drop(st);
        if matches!(out, Resolved::Done(_)) {
            self.shard(key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(out)))
    }

    fn keep_args<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, _| {
            if let Some(e) = st.entries.get_mut(key) {
                e.value = Some(args.into());
            }
        });
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn abandoned_calls<'a>(
        &'a self,
        names: &'a [&'a str],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        let mut rows = self.records();
        rows.retain(|r| names.contains(&r.name.as_str()));
        let rows = super::resume::finish_abandoned(rows, limit);
        Box::pin(std::future::ready(Ok(rows)))
    }
}

impl Inspect for MemoryStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        let rows = self
            .records()
            .iter()
            .map(KeyInfo::from)
            .filter(|r| filter.matches(r))
            .collect();
        Box::pin(std::future::ready(Ok(finish_listing(rows, filter))))
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        let counts = count_states(self.records().into_iter().map(|r| {
            (
                r.name,
                State::of(r.status, r.expires_at, r.keep_until, r.now),
            )
        }));
        Box::pin(std::future::ready(Ok(counts)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory store answers like the SQL ones: live records only, filters composed,
    /// oldest first, expired ones counted apart.
    #[tokio::test]
    async fn lists_and_counts() {
        let store = MemoryStore::new();
        let fp = crate::key::fingerprint_digest(b"fp");
        for (i, (name, ttl)) in [("a", 60_000), ("a", 60_000), ("b", 1), ("c", 0)]
            .into_iter()
            .enumerate()
        {
            let key = crate::key::key_digest(name, None, &[i as u8]);
            let claim = Claim {
                name,
                key: &key,
                fingerprint: &fp,
                lease: Duration::from_secs(60),
                ttl: Duration::ZERO,
            };
            let ClaimOutcome::Claimed { token, .. } = store.claim(claim).await.unwrap() else {
                panic!("fresh key")
            };
            if ttl > 0 {
                let done = Complete {
                    key: &key,
                    token,
                    value: b"abc",
                    ttl: Duration::from_millis(ttl),
                    tombstone: std::time::Duration::ZERO,
                };
                assert!(store.complete(done).await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let all = store.list(&Filter::default()).await.unwrap();
        assert_eq!(all.len(), 3, "the expired record is not listed");
        assert!(all.windows(2).all(|w| w[0].created_at <= w[1].created_at));
        let filter = Filter::new().name(Some("a".into()));
        let a = store.list(&filter).await.unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].value_size, Some(3));
        let filter = filter.limit(1);
        assert_eq!(store.list(&filter).await.unwrap().len(), 1);
        let filter = filter.older_than(Some(Duration::from_secs(60)));
        assert!(store.list(&filter).await.unwrap().is_empty());
        let filter = Filter::new().status(Some(Status::InProgress));
        let c = store.list(&filter).await.unwrap();
        assert_eq!(
            (c.len(), c[0].name.as_str(), c[0].value_size),
            (1, "c", None)
        );

        let stats = store.stats().await.unwrap();
        let stat = |name: &str, state| Stat {
            name: name.into(),
            state,
            count: 0,
        };
        let expect = [
            Stat {
                count: 2,
                ..stat("a", State::Completed)
            },
            Stat {
                count: 1,
                ..stat("b", State::Expired)
            },
            Stat {
                count: 1,
                ..stat("c", State::InProgress)
            },
        ];
        assert_eq!(stats, expect);
    }
}
