//! The model's store: the `Store` trait's contract as a pure function of its state and a clock.
//!
//! Every method is one atomic step, as `idem_runtime::store::Store` documents, and applies the
//! runtime's own rules: liveness ([`is_live`]), tokens ([`next_token`]), who holds a key
//! ([`holds`]), how a release ends a record ([`ended_at`]), which lapsed record is abandoned
//! ([`abandoned`]) and when one may go ([`may_forget`] of its `keep_until`). It is what the
//! model checker explores and what the model-based tests compare every real store against.
//! Times are milliseconds of a logical clock the caller passes in.

use crate::Bug;
use idem_runtime::key::Digest;
use idem_runtime::protocol::{abandoned, ended_at, holds, is_live, may_forget, next_token};
use idem_runtime::store::{ClaimOutcome, Record, Resolved, Status, Takeover};
use std::collections::BTreeMap;

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRecord {
    /// The namespace it was claimed in.
    pub name: String,
    /// The fingerprint of the claiming attempt.
    pub fingerprint: Digest,
    /// The fencing token of the attempt that holds or finished it.
    pub token: u64,
    /// In progress, completed, released or parked.
    pub status: Status,
    /// The stored value (completed records).
    pub value: Option<Vec<u8>>,
    /// When the current attempt claimed it.
    pub created_at: i64,
    /// End of the lease or of the TTL (`i64::MAX` when parked).
    pub expires_at: i64,
    /// The attempt number (1, or one more than the abandoned attempt's it took over).
    pub attempt: u32,
    /// Until when the record is kept.
    pub keep_until: i64,
}

impl ModelRecord {
    /// Its status.
    pub fn status(&self) -> Status {
        self.status
    }
}

/// The abstract store: a map of records, each step atomic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ModelStore {
    records: BTreeMap<Digest, ModelRecord>,
    /// A planted bug, or `None` for the store as the trait documents it.
    bug: Option<Bug>,
}

impl ModelStore {
    /// An empty store that behaves as documented.
    pub fn new() -> ModelStore {
        ModelStore::default()
    }

    /// An empty store with a planted bug (for showing that the checker catches it).
    pub fn with_bug(bug: Option<Bug>) -> ModelStore {
        ModelStore {
            records: BTreeMap::new(),
            bug,
        }
    }

    /// The record of `key` as a store returns it, read at `now`.
    pub fn record(&self, key: &Digest, now: i64) -> Option<Record> {
        self.records.get(key).map(|r| to_record(key, r, now))
    }

    /// The raw record of `key`, live or not.
    pub fn raw(&self, key: &Digest) -> Option<&ModelRecord> {
        self.records.get(key)
    }

    fn live(&self, key: &Digest, now: i64) -> Option<&ModelRecord> {
        let parked_free = self.bug == Some(Bug::ParkedRunsBody);
        self.records
            .get(key)
            .filter(|r| is_live(r.expires_at, now) && !(parked_free && r.status == Status::Parked))
    }

    /// `Store::claim`: if no live record exists, write an in-progress one with a new token,
    /// kept until `now + keep_ms` (`max(lease, ttl)`), taking over an abandoned record.
    pub fn claim(
        &mut self,
        name: &str,
        key: &Digest,
        fingerprint: &Digest,
        lease_ms: i64,
        keep_ms: i64,
        now: i64,
    ) -> ClaimOutcome {
        if let Some(r) = self.live(key, now) {
            return ClaimOutcome::Existing(to_record(key, r, now));
        }
        let (token, takeover) = self.insert(name, key, fingerprint, lease_ms, keep_ms, now);
        ClaimOutcome::Claimed { token, takeover }
    }

    /// The write half of a claim: an in-progress record whatever is there. On its own only
    /// under the planted bug `check_then_insert`, where the claim reads first and writes later.
    pub fn insert(
        &mut self,
        name: &str,
        key: &Digest,
        fingerprint: &Digest,
        lease_ms: i64,
        keep_ms: i64,
        now: i64,
    ) -> (u64, Option<Takeover>) {
        let old = self.records.get(key);
        let previous = old.map(|r| r.token);
        let takeover = old
            .filter(|r| {
                abandoned(r.status, r.expires_at, r.keep_until, now)
                    || (self.bug == Some(Bug::ReleasedAsAbandoned) && r.status == Status::Released)
            })
            .map(|r| Takeover {
                attempt: r.attempt + 1,
                abandoned_at: r.created_at,
            });
        let token = match (self.bug, previous) {
            (Some(Bug::TokenNotBumpedOnTakeover), Some(p)) => p,
            _ => next_token(previous, now),
        };
        let expires_at = now.saturating_add(lease_ms);
        self.records.insert(
            *key,
            ModelRecord {
                name: name.to_owned(),
                fingerprint: *fingerprint,
                token,
                status: Status::InProgress,
                value: None,
                created_at: now,
                expires_at,
                attempt: takeover.map_or(1, |t| t.attempt),
                keep_until: now.saturating_add(keep_ms.max(lease_ms)),
            },
        );
        (token, takeover)
    }

    fn held(&self, key: &Digest, token: u64, now: i64) -> bool {
        matches!(self.records.get(key),
            Some(r) if holds(r.status(), r.token, r.expires_at, token, now))
    }

    /// Ends the record of `key` at `now`: no longer live, its token kept for the next claim.
    /// Under the planted bug `token_reuse_after_release` it is deleted instead.
    fn end(&mut self, key: &Digest, now: i64) {
        if self.bug == Some(Bug::TokenReuseAfterRelease) {
            self.records.remove(key);
        } else if let Some(r) = self.records.get_mut(key) {
            r.status = Status::Released;
            r.value = None;
            r.expires_at = ended_at(now);
            r.keep_until = r.expires_at;
        }
    }

    /// `Store::complete`: if in progress with `token`, store `value` for `ttl_ms`.
    pub fn complete(
        &mut self,
        key: &Digest,
        token: u64,
        value: &[u8],
        ttl_ms: i64,
        now: i64,
    ) -> bool {
        let fenced = self.bug != Some(Bug::UnfencedComplete);
        if fenced && !self.held(key, token, now) {
            return false;
        }
        match self.records.get_mut(key) {
            Some(r) => {
                r.status = Status::Completed;
                r.value = Some(value.to_vec());
                r.expires_at = now.saturating_add(ttl_ms);
                r.keep_until = r.expires_at;
                true
            }
            None => false,
        }
    }

    /// A reconcile's result stored without the fence (only under the planted bug
    /// `unfenced_reconcile`): whatever record is there becomes completed with `value`.
    pub fn complete_unfenced(
        &mut self,
        key: &Digest,
        token: u64,
        value: &[u8],
        ttl_ms: i64,
        now: i64,
    ) -> bool {
        match self.records.get_mut(key) {
            Some(r) => {
                r.token = r.token.max(token);
                r.status = Status::Completed;
                r.value = Some(value.to_vec());
                r.expires_at = now.saturating_add(ttl_ms);
                r.keep_until = r.expires_at;
                true
            }
            None => false,
        }
    }

    /// A retried completion after a lost answer: also `true` when the first try already
    /// stored this token's result (the PostgreSQL store's retry statement).
    pub fn complete_again(
        &mut self,
        key: &Digest,
        token: u64,
        value: &[u8],
        ttl_ms: i64,
        now: i64,
    ) -> bool {
        if matches!(self.records.get(key),
            Some(r) if r.token == token && r.status == Status::Completed)
        {
            return true;
        }
        self.complete(key, token, value, ttl_ms, now)
    }

    /// `Store::release`: if `token` holds the record, end it (it stays, with its token).
    pub fn release(&mut self, key: &Digest, token: u64, now: i64) -> bool {
        if !self.held(key, token, now) {
            return false;
        }
        self.end(key, now);
        true
    }

    /// `Store::renew`: if `token` holds the record, extend the lease to `now + lease`.
    pub fn renew(&mut self, key: &Digest, token: u64, lease_ms: i64, now: i64) -> bool {
        let stale_ok = self.bug == Some(Bug::RenewAfterTakeover);
        match self.records.get_mut(key) {
            Some(r)
                if r.status == Status::InProgress
                    && is_live(r.expires_at, now)
                    && (r.token == token || stale_ok) =>
            {
                r.expires_at = now.saturating_add(lease_ms);
                r.keep_until = r.keep_until.max(r.expires_at);
                true
            }
            _ => false,
        }
    }

    /// `Store::get`: the live record of `key`.
    pub fn get(&self, key: &Digest, now: i64) -> Option<Record> {
        self.live(key, now).map(|r| to_record(key, r, now))
    }

    /// `Store::force_release`: end the live record whatever its state (parked too); return it
    /// as it was.
    pub fn force_release(&mut self, key: &Digest, now: i64) -> Option<Record> {
        let was = self.get(key, now)?;
        self.end(key, now);
        Some(was)
    }

    /// `Store::park`: if `token` holds the record, park it (never expires).
    pub fn park(&mut self, key: &Digest, token: u64, now: i64) -> bool {
        if !self.held(key, token, now) {
            return false;
        }
        if let Some(r) = self.records.get_mut(key) {
            r.status = Status::Parked;
            r.expires_at = i64::MAX;
            r.keep_until = i64::MAX;
        }
        true
    }

    /// `Store::abandon`: if `token` holds the record, end its lease now (still in progress,
    /// `keep_until` as it was): the next claim takes it over.
    pub fn abandon(&mut self, key: &Digest, token: u64, now: i64) -> bool {
        if !self.held(key, token, now) {
            return false;
        }
        if let Some(r) = self.records.get_mut(key) {
            r.expires_at = ended_at(now);
        }
        true
    }

    /// `Store::resolve`: only a parked record; `Some(value)` applied (completed for `ttl_ms`,
    /// its token kept), `None` not applied (released).
    pub fn resolve(&mut self, key: &Digest, applied: Option<(&[u8], i64)>, now: i64) -> Resolved {
        let any = self.bug == Some(Bug::ResolveOverwritesCompleted);
        let was = match self.get(key, now) {
            Some(r) if r.status == Status::Parked || any => r,
            other => return Resolved::NotParked(other),
        };
        match applied {
            Some((value, ttl_ms)) => {
                if let Some(r) = self.records.get_mut(key) {
                    r.status = Status::Completed;
                    r.value = Some(value.to_vec());
                    r.expires_at = now.saturating_add(ttl_ms);
                    r.keep_until = r.expires_at;
                }
            }
            None => self.end(key, now),
        }
        Resolved::Done(was)
    }

    /// Drops the record of `key` as a store may on its own once it may be forgotten (the memory
    /// store's eviction, Redis key expiry); for the model-based tests.
    pub fn forget(&mut self, key: &Digest) {
        self.records.remove(key);
    }

    /// `Store::purge_expired` without a limit: delete every record kept until before `now`
    /// ([`may_forget`] of `keep_until`).
    pub fn purge_expired(&mut self, now: i64) -> u64 {
        let before = self.records.len();
        self.records
            .retain(|_, r| !may_forget(r.keep_until, now) || is_live(r.expires_at, now));
        (before - self.records.len()) as u64
    }
}

fn to_record(key: &Digest, r: &ModelRecord, now: i64) -> Record {
    Record {
        name: r.name.clone(),
        key: *key,
        fingerprint: r.fingerprint,
        token: r.token,
        status: r.status(),
        value: r.value.clone(),
        created_at: r.created_at,
        expires_at: r.expires_at,
        attempt: r.attempt,
        keep_until: r.keep_until,
        now,
    }
}
