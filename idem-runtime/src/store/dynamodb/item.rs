//! The item: one per key, its attributes, and how a [`Record`] is read from it.
//!
//! | attribute | type | what |
//! |---|---|---|
//! | `pk` | B | the key's 32-byte digest (the partition key) |
//! | `name` | S | the namespace |
//! | `fingerprint` | B | 32 bytes |
//! | `token` | N | the fencing token |
//! | `status` | N | 0 in progress, 1 completed, 2 released, 3 parked |
//! | `value` | B | the stored result (completed items) |
//! | `value_size` | N | its length, for listings that do not read it |
//! | `chunks` | N | instead of `value` for a value over one item: how many chunk items hold it (`chunks.rs`) |
//! | `created_at`, `expires_at` | N | milliseconds since the epoch, on the writer's clock |
//! | `attempt` | N | the attempt number (absent in items written before it: 1) |
//! | `keep_until` | N | until when the item is kept, ms (absent in items written before it: `expires_at`, and a lapsed in-progress one reads as released, not abandoned) |
//! | `ttl` | N | seconds since the epoch: when DynamoDB may delete the item by itself, from `keep_until` (absent on a parked item: it stays until resolved) |

use super::error::corrupt;
use crate::error::Error;
use crate::key::Digest;
use crate::store::{Claim, Record, Status};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

pub(super) const PK: &str = "pk";
pub(super) const NAME: &str = "name";
pub(super) const FINGERPRINT: &str = "fingerprint";
pub(super) const TOKEN: &str = "token";
pub(super) const STATUS: &str = "status";
pub(super) const VALUE: &str = "value";
pub(super) const VALUE_SIZE: &str = "value_size";
pub(super) const CREATED_AT: &str = "created_at";
pub(super) const EXPIRES_AT: &str = "expires_at";
pub(super) const TTL: &str = "ttl";
pub(super) const ATTEMPT: &str = "attempt";
pub(super) const KEEP_UNTIL: &str = "keep_until";

/// An item as the SDK gives it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// DynamoDB's limit on an item's size: attribute names plus values.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// How long past `expires_at` an item's `ttl` lets DynamoDB delete it. DynamoDB's TTL runs on
/// AWS's clock while `expires_at` is on the writers' clocks: a minute covers any clock an NTP
/// client keeps, so an ended item keeps its token for every writer's claims
/// ([`crate::protocol::may_forget`] on its own clock). DynamoDB deletes expired items within
/// days anyway, not at the second.
pub const TTL_MARGIN_SECS: i64 = 60;

pub(super) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(super) fn b(bytes: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(bytes))
}

/// The `ttl` attribute of an item kept until `keep_until` (ms).
pub(super) fn ttl_of(keep_until: i64) -> AttributeValue {
    n(keep_until.div_euclid(1000) + 1 + TTL_MARGIN_SECS)
}

/// The key attribute of an item.
pub(super) fn key_of(key: &Digest) -> Item {
    HashMap::from([(PK.to_string(), b(&key.0))])
}

/// A new in-progress item.
pub(super) fn claim_item(
    claim: &Claim<'_>,
    token: u64,
    now: i64,
    expires_at: i64,
    attempt: u32,
    keep_until: i64,
) -> Item {
    HashMap::from([
        (PK.to_string(), b(&claim.key.0)),
        (NAME.to_string(), AttributeValue::S(claim.name.to_string())),
        (FINGERPRINT.to_string(), b(&claim.fingerprint.0)),
        (TOKEN.to_string(), n(token)),
        (STATUS.to_string(), n(Status::InProgress.as_i16())),
        (CREATED_AT.to_string(), n(now)),
        (EXPIRES_AT.to_string(), n(expires_at)),
        (ATTEMPT.to_string(), n(attempt)),
        (KEEP_UNTIL.to_string(), n(keep_until)),
        (TTL.to_string(), ttl_of(keep_until)),
    ])
}

/// The size DynamoDB counts for a completed item with a value of `value_len` bytes and a
/// namespace of `name_len` bytes (names plus values; numbers at their longest, 21 bytes).
pub(super) fn completed_size(name_len: usize, value_len: usize) -> usize {
    let names: usize = [
        PK,
        NAME,
        FINGERPRINT,
        TOKEN,
        STATUS,
        VALUE,
        VALUE_SIZE,
        CREATED_AT,
        EXPIRES_AT,
        TTL,
        ATTEMPT,
        KEEP_UNTIL,
    ]
    .iter()
    .map(|a| a.len())
    .sum();
    names + 32 + name_len + 32 + 8 * 21 + value_len
}

fn get<'a>(item: &'a Item, attr: &str, op: &'static str) -> Result<&'a AttributeValue, Error> {
    item.get(attr)
        .ok_or_else(|| corrupt(op, format!("an item has no `{attr}` attribute")))
}

pub(super) fn number(item: &Item, attr: &str, op: &'static str) -> Result<i64, Error> {
    match get(item, attr, op)? {
        AttributeValue::N(s) => s
            .parse()
            .map_err(|_| corrupt(op, format!("`{attr}` is `{s}`, not an integer"))),
        _ => Err(corrupt(op, format!("`{attr}` is not a number"))),
    }
}

fn token(item: &Item, op: &'static str) -> Result<u64, Error> {
    match get(item, TOKEN, op)? {
        AttributeValue::N(s) => s
            .parse()
            .map_err(|_| corrupt(op, format!("`token` is `{s}`, not a token"))),
        _ => Err(corrupt(op, "`token` is not a number".into())),
    }
}

pub(super) fn digest(item: &Item, attr: &str, op: &'static str) -> Result<Digest, Error> {
    match get(item, attr, op)? {
        AttributeValue::B(blob) => <[u8; 32]>::try_from(blob.as_ref())
            .map(Digest)
            .map_err(|_| {
                corrupt(
                    op,
                    format!("`{attr}` is {} bytes, not 32", blob.as_ref().len()),
                )
            }),
        _ => Err(corrupt(op, format!("`{attr}` is not binary"))),
    }
}

pub(super) fn status(item: &Item, op: &'static str) -> Result<Status, Error> {
    let v = number(item, STATUS, op)?;
    Status::from_column(v).ok_or_else(|| {
        corrupt(
            op,
            format!(
                "an item has status {v}, which this version of idem does not know: it was \
                 written by a newer version; upgrade idem"
            ),
        )
    })
}

pub(super) fn name(item: &Item, op: &'static str) -> Result<String, Error> {
    match get(item, NAME, op)? {
        AttributeValue::S(s) => Ok(s.clone()),
        _ => Err(corrupt(op, "`name` is not a string".into())),
    }
}

/// The record an item holds, read at `now` (the caller's clock).
pub(super) fn record(item: &Item, now: i64, op: &'static str) -> Result<Record, Error> {
    let value = match item.get(VALUE) {
        Some(AttributeValue::B(blob)) => Some(blob.as_ref().to_vec()),
        Some(_) => return Err(corrupt(op, "`value` is not binary".into())),
        None => None,
    };
    let expires_at = number(item, EXPIRES_AT, op)?;
    let mut status = status(item, op)?;
    let keep_until = match item.get(KEEP_UNTIL) {
        Some(_) => number(item, KEEP_UNTIL, op)?,
        None => {
            // Written before abandoned attempts were told apart: a lapsed claim then meant a
            // free key (a release ended it so).
            if status == Status::InProgress && !crate::protocol::is_live(expires_at, now) {
                status = Status::Released;
            }
            expires_at
        }
    };
    let attempt = match item.get(ATTEMPT) {
        Some(_) => u32::try_from(number(item, ATTEMPT, op)?)
            .ok()
            .filter(|a| *a >= 1)
            .ok_or_else(|| corrupt(op, "`attempt` is not an attempt number".into()))?,
        None => 1,
    };
    Ok(Record {
        name: name(item, op)?,
        key: digest(item, PK, op)?,
        fingerprint: digest(item, FINGERPRINT, op)?,
        token: token(item, op)?,
        status,
        value,
        created_at: number(item, CREATED_AT, op)?,
        expires_at,
        attempt,
        keep_until,
        now,
    })
}

/// The token of an item (for takeovers and conditional deletes).
pub(super) fn token_of(item: &Item, op: &'static str) -> Result<u64, Error> {
    token(item, op)
}
