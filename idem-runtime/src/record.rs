//! What a store keeps for a key, and what a claim finds: the vocabulary the stores answer in
//! and the decision table ([`crate::protocol`]) reads. Below both, so that neither imports the
//! other's layer for it; public as `idem::store::{Record, Status, ClaimOutcome, Takeover}`.

use crate::key::Digest;
use std::time::Duration;

/// The state of a record.
///
/// An in-progress record that is no longer live (its lease lapsed without a result or a
/// release) is **abandoned**: its attempt may or may not have had its effect. The status stays
/// [`Status::InProgress`]; [`crate::protocol::abandoned`] tells it apart, and the next claim
/// takes it over ([`ClaimOutcome::Claimed`] with a [`Takeover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Claimed by an attempt whose lease ends at `expires_at`.
    InProgress,
    /// Finished; the stored value is replayed until `expires_at`.
    Completed,
    /// Released by its attempt (an `Err` under the release policy, a panic) or by an operator:
    /// the key is free, and nothing about it needs remembering.
    Released,
    /// An abandoned attempt whose function chose to park it: its outcome is unknown until an
    /// operator resolves it (`Store::resolve`). A parked record never expires
    /// (`expires_at = keep_until = i64::MAX`): it exists because running the body again might
    /// double an effect, so it must not silently lapse into a free key.
    Parked,
}

/// One stored record, as a store returns it. Times are milliseconds since the Unix epoch on the
/// store's clock; `now` is that clock when the record was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The namespace the key belongs to.
    pub name: String,
    /// The key's digest.
    pub key: Digest,
    /// The fingerprint of the arguments of the attempt that claimed it.
    pub fingerprint: Digest,
    /// The fencing token of the attempt that holds or finished it.
    pub token: u64,
    /// In progress, completed, released or parked.
    pub status: Status,
    /// The stored result (completed records only).
    pub value: Option<Vec<u8>>,
    /// When the current attempt claimed it.
    pub created_at: i64,
    /// End of the lease (in progress), of the TTL (completed), the moment it was released
    /// (released), or `i64::MAX` (parked).
    pub expires_at: i64,
    /// The attempt number: 1 for a first claim, one more than the abandoned attempt's for a
    /// claim that took one over.
    pub attempt: u32,
    /// Until when the store keeps the record (never before `expires_at`): a claim keeps it as
    /// long as its result would have been kept, so that an abandoned attempt is told from a
    /// free key. Stores delete records only once
    /// [`may_forget`](crate::protocol::may_forget)`(keep_until, now)`.
    pub keep_until: i64,
    /// The store's clock when the record was read.
    pub now: i64,
}

impl Record {
    /// Time left until the record stops being live.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.expires_at.saturating_sub(self.now).max(0) as u64)
    }
}

/// What a claim learns when it takes over an abandoned attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takeover {
    /// This claim's attempt number: the abandoned attempt's plus one (2 for the first
    /// takeover).
    pub attempt: u32,
    /// When the abandoned attempt began (its `created_at`, ms since the epoch, store clock).
    pub abandoned_at: i64,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// There was no live record: this attempt now holds the key with this fencing token.
    Claimed {
        /// The new fencing token.
        token: u64,
        /// `Some` exactly when the claim took over an abandoned attempt (a record in progress,
        /// not live, still kept: [`crate::protocol::abandoned`]); `None` for a key that was
        /// free, released, expired or never seen (attempt 1).
        takeover: Option<Takeover>,
    },
    /// A live record exists; nothing was written.
    Existing(Record),
}
