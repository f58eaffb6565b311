//! What a store keeps for resumable calls (`#[idempotent(resume)]`), and how it finds them.
//!
//! A resumable call keeps its encoded (and, with encryption, sealed) arguments as the value of
//! its in-progress record ([`Store::keep_args`](super::Store::keep_args), fenced by the claim's
//! token, right after the claim). A completion replaces them with the result, a release ends
//! the record, and a claim that takes an abandoned record over keeps them (so a resumer that
//! dies right after its takeover leaves the call abandoned with its arguments, for another).
//! So the calls a resumer looks for are exactly the **abandoned records that hold a value**:
//! in progress, lease lapsed, still kept ([`crate::protocol::abandoned`]).
//!
//! How each store finds them ([`Store::abandoned_calls`](super::Store::abandoned_calls)),
//! without reading every record:
//!
//! - **PostgreSQL** and **SQLite**: a partial index on `(name, expires_at)` of the in-progress
//!   rows that hold a value (PostgreSQL schema 5, SQLite schema 3); a resumable call's row is
//!   the only in-progress row with a value, so the index holds resumable calls in flight only.
//! - **MySQL / MariaDB** (no partial indexes): an index on `(status, name, expires_at)`
//!   (schema 3); the query reads the in-progress rows of the names asked for whose lease
//!   lapsed, in lease order, and keeps those with a value.
//! - **Redis** and **Redis Cluster**: a sorted set per namespace (`<prefix>resume:{<name>}`,
//!   one hash slot per name on a cluster) of the keys that kept arguments, scored by when they
//!   did; `keep_args` adds the key in the same script that writes the value. The query reads
//!   the oldest members, checks each record, and removes the members whose record is no longer
//!   in progress (completed, released, parked, purged), so the set holds calls in flight.
//! - **DynamoDB**: a sparse global secondary index `resume` (partition key `resume_name`, sort
//!   key `expires_at`): `keep_args` sets `resume_name`, and every other write to the item
//!   removes it, so the index holds resumable calls in flight only.
//! - **Memory**: the records are in this process; they are read under each shard's lock.

use super::{Backend, Record};
use crate::error::Error;

/// The error of a store that does not keep arguments.
pub(crate) fn unsupported(backend: Backend) -> Error {
    Error::Config(format!(
        "the {backend} store cannot resume calls: it does not keep their arguments \
         (`#[idempotent(resume)]` and `Idem::resumer` need one of idem's own stores)"
    ))
}

/// True when `record` is one a resumer finishes: abandoned, with arguments kept.
pub fn is_resumable(record: &Record) -> bool {
    record.value.is_some()
        && crate::protocol::abandoned(
            record.status,
            record.expires_at,
            record.keep_until,
            record.now,
        )
}

/// Orders a client-side listing as the SQL stores order theirs (the longest lapsed first) and
/// keeps at most `limit`.
pub(crate) fn finish_abandoned(mut rows: Vec<Record>, limit: usize) -> Vec<Record> {
    rows.retain(is_resumable);
    rows.sort_by_key(|r| (r.expires_at, r.key));
    rows.truncate(limit);
    rows
}
