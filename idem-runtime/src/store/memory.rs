//! The in-memory store: process-local, sharded, no lock held across an await.
//!
//! Each shard is a `HashMap` keyed by digest (the digest is already uniform, so the map hashes
//! it with its first eight bytes instead of running SipHash again) and a min-heap of expiry
//! times. Every write evicts a few expired entries from its own shard, so memory stays bounded
//! by the live keys without a full scan ever blocking a caller. Heap entries that a renewal or a
//! completion made stale are dropped when they surface.

use super::{
    local_now_ms, millis, BoxFuture, Claim, ClaimOutcome, Complete, Record, Status, Store,
};
use crate::error::Error;
use crate::key::Digest;
use crate::protocol::{is_live, next_token};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;

const SHARDS: usize = 64;
/// How many expired entries one write may evict from its shard.
const EVICT_PER_WRITE: usize = 4;

/// Hashes a digest by its first eight bytes: it is already a uniform hash.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(b);
        }
    }
}

struct Entry {
    name: Box<str>,
    fingerprint: Digest,
    token: u64,
    status: Status,
    value: Option<Vec<u8>>,
    created_at: i64,
    expires_at: i64,
}

#[derive(Default)]
struct ShardState {
    entries: HashMap<Digest, Entry, BuildHasherDefault<DigestHasher>>,
    expiry: BinaryHeap<Reverse<(i64, Digest)>>,
}

impl ShardState {
    /// Removes up to `limit` expired entries; returns how many it removed.
    fn evict(&mut self, now: i64, limit: usize) -> u64 {
        let mut removed = 0;
        while removed < limit as u64 {
            match self.expiry.peek() {
                Some(Reverse((at, _))) if !is_live(*at, now) => {}
                _ => break,
            }
            let Reverse((at, key)) = self.expiry.pop().expect("peeked");
            if let Some(e) = self.entries.get(&key) {
                // Only the heap entry that matches the record's current expiry may evict it.
                if e.expires_at == at && !is_live(e.expires_at, now) {
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

    fn set_expiry(&mut self, key: Digest, at: i64) {
        self.expiry.push(Reverse((at, key)));
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

    fn claim_now(&self, c: Claim<'_>) -> ClaimOutcome {
        let now = local_now_ms();
        let mut st = self.lock(c.key);
        st.evict(now, EVICT_PER_WRITE);
        if let Some(e) = st.live(c.key, now) {
            return ClaimOutcome::Existing(record(c.key, e, now));
        }
        let previous = st.entries.get(c.key).map(|e| e.token);
        let token = next_token(previous, now);
        let expires_at = now.saturating_add(millis(c.lease));
        st.entries.insert(
            *c.key,
            Entry {
                name: c.name.into(),
                fingerprint: *c.fingerprint,
                token,
                status: Status::InProgress,
                value: None,
                created_at: now,
                expires_at,
            },
        );
        st.set_expiry(*c.key, expires_at);
        ClaimOutcome::Claimed { token }
    }

    /// Applies `f` to the record if it is in progress with `token`.
    fn fenced(&self, key: &Digest, token: u64, f: impl FnOnce(&mut ShardState, i64)) -> bool {
        let now = local_now_ms();
        let mut st = self.lock(key);
        let held = matches!(
            st.entries.get(key),
            Some(e) if e.token == token && e.status == Status::InProgress
        );
        if held {
            f(&mut st, now);
        }
        held
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        let out = self.claim_now(claim);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(done.key, done.token, |st, now| {
            let expires_at = now.saturating_add(millis(done.ttl));
            if let Some(e) = st.entries.get_mut(done.key) {
                e.status = Status::Completed;
                e.value = Some(done.value.to_vec());
                e.expires_at = expires_at;
            }
            st.set_expiry(*done.key, expires_at);
        });
        if ok {
            self.shard(done.key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(ok)))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let ok = self.fenced(key, token, |st, _| {
            st.entries.remove(key);
        });
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
            if let Some(e) = st.entries.get_mut(key) {
                e.expires_at = expires_at;
            }
            st.set_expiry(*key, expires_at);
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
        let removed = self.lock(key).entries.remove(key);
        let out = removed.map(|e| record(key, &e, now));
        if out.is_some() {
            self.shard(key).changed.notify_waiters();
        }
        Box::pin(std::future::ready(Ok(out)))
    }
}

impl crate::admin::Inspect for MemoryStore {
    fn list<'a>(
        &'a self,
        filter: &'a crate::admin::Filter,
    ) -> BoxFuture<'a, Result<Vec<crate::admin::KeyInfo>, Error>> {
        let rows = self
            .records()
            .iter()
            .map(crate::admin::KeyInfo::from)
            .filter(|r| filter.matches(r))
            .collect();
        Box::pin(std::future::ready(Ok(crate::admin::finish_listing(
            rows, filter,
        ))))
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<crate::admin::Stat>, Error>> {
        let counts = crate::admin::count_states(self.records().into_iter().map(|r| {
            (
                r.name,
                crate::admin::State::of(r.status, r.expires_at, r.now),
            )
        }));
        Box::pin(std::future::ready(Ok(counts)))
    }
}
