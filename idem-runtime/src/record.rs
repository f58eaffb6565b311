//! What a store keeps for a key, and what a claim finds: the vocabulary the stores answer in
//! and the decision table ([`crate::protocol`]) reads. Below both, so that neither imports the
//! other's layer for it; public as `idem::store::{Record, Status, ClaimOutcome}`.

use crate::key::Digest;
use std::time::Duration;

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Claimed by an attempt whose lease ends at `expires_at`.
    InProgress,
    /// Finished; the stored value is replayed until `expires_at`.
    Completed,
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
    /// In progress or completed.
    pub status: Status,
    /// The stored result (completed records only).
    pub value: Option<Vec<u8>>,
    /// When the current attempt claimed it.
    pub created_at: i64,
    /// End of the lease (in progress) or of the TTL (completed).
    pub expires_at: i64,
    /// The store's clock when the record was read.
    pub now: i64,
}

impl Record {
    /// Time left until the record stops being live.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.expires_at.saturating_sub(self.now).max(0) as u64)
    }
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// There was no live record: this attempt now holds the key with this fencing token.
    Claimed {
        /// The new fencing token.
        token: u64,
    },
    /// A live record exists; nothing was written.
    Existing(Record),
}
