//! The Amazon DynamoDB store (feature `dynamodb`): one item per key, each protocol step one
//! conditional request.
//!
//! | step | request |
//! |---|---|
//! | `claim` | `PutItem` if `attribute_not_exists(pk)`, `ReturnValuesOnConditionCheckFailure = ALL_OLD`; when the item it returns is no longer live, a second `PutItem` if `token = <its token> AND expires_at <= now`, with the next token (and, when the old item was abandoned, its attempt + 1) |
//! | `complete` | `UpdateItem SET status = 1, value, expires_at, keep_until, ttl` if `token AND status = 0 AND expires_at > now`; a value over one item is first written in chunks (`PutItem` each, `chunks.rs`) and the update records `chunks` instead of `value` |
//! | `release` | `UpdateItem SET status = 2, expires_at = keep_until = now` on the same condition (the item ends and keeps its token) |
//! | `renew` | `UpdateItem SET expires_at` on the same condition and `keep_until >= expires_at`; else once more raising `keep_until` and `ttl` too |
//! | `park` | `UpdateItem SET status = 3, expires_at = keep_until = i64::MAX REMOVE ttl` on the same condition |
//! | `abandon` | `UpdateItem SET expires_at = now` on the same condition |
//! | `resolve` | `UpdateItem` if `status = 3`, `ReturnValues = ALL_OLD` (and on a failed condition) |
//! | `get` | `GetItem`, strongly consistent |
//! | `purge_expired` | `Scan` (filter `keep_until < now AND expires_at < now`) until `limit` candidates, then `DeleteItem` each if `token` and the same |
//! | `force_release` | `UpdateItem SET status = 2, expires_at = keep_until = now` if `expires_at > now`, `ReturnValues = ALL_OLD` |
//!
//! A fresh call is two requests (claim, complete), a replay or a duplicate in flight one: the
//! claim's failed condition returns the live item. Taking over a lapsed or released item costs
//! one more, since its new token must be [`next_token`] of the old one, which a write cannot
//! compute from the item it replaces; the second write is conditional on that token, so a
//! concurrent takeover wins once and the other sees its live item.
//!
//! **Clocks.** DynamoDB has no server clock an expression can read: `now` is this process's
//! clock (UTC milliseconds). Leases and TTLs are therefore judged on each writer's clock. A
//! client whose clock runs ahead sees a lease lapse early and may take over a claim that is
//! still running (the body runs a second time, as after a real lapse); one whose clock lags
//! keeps seeing it live a little longer. Either way it is a matter of timing, never of a double
//! completion: every write is conditional on the fencing token, so the attempt that lost the
//! key has its completion refused (`LeaseLost`). Keep clocks within a small fraction of the
//! lease (NTP does; Lambda's and EC2's clocks are synchronised by AWS).
//!
//! **Expiry.** Each item carries `ttl` (epoch seconds, [`TTL_MARGIN_SECS`] past `keep_until`;
//! none on a parked item, which stays until resolved),
//! and the table is created with TTL enabled on it, so DynamoDB deletes finished items by
//! itself, free of charge, within a day or two of their end. `purge_expired` is for DynamoDB
//! Local (which expires nothing) and for operators in a hurry.
//!
//! **Waiting** polls `GetItem` with backoff, within the caller's `wait`: DynamoDB Streams would
//! notify, but need a stream on the table, a shard iterator per shard and a poller per process
//! (`GetRecords` is itself polled, about every second), which costs more requests and latency
//! than a duplicate's few reads.

mod chunks;
mod complete;
mod error;
mod inspect;
mod item;
mod options;
mod purge;
mod resume;
mod table;

pub use item::{MAX_ITEM_BYTES, TTL_MARGIN_SECS};
pub use options::DynamoDbOptions;

use super::{
    claim_keep_until, local_now_ms, millis, Backend, BoxFuture, Claim, ClaimOutcome, Complete,
    Record, Resolve, Resolved, Status, Store, Takeover,
};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use crate::protocol::{ended_at, is_live, next_token, takeover_of};
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use error::{corrupt, sdk_error};
use item::{b, n, ttl_of, Item, EXPIRES_AT, KEEP_UNTIL, PK, STATUS, TOKEN, TTL, VALUE, VALUE_SIZE};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const BACKEND: Backend = Backend::DynamoDb;
/// How many writes a claim makes at most when the item changes under it (taken over, purged)
/// between its writes.
pub const CLAIM_ATTEMPTS: usize = 5;
/// Durations are clamped to this many milliseconds, so `now + ttl` never overflows.
const MAX_MS: i64 = 1_000_000_000_000_000;

fn ms(d: Duration) -> i64 {
    millis(d).min(MAX_MS)
}

/// The condition of `complete`, `release` and `renew`: this token holds the item
/// ([`crate::protocol::holds`]).
const HOLDS: &str = "#t = :t AND #s = :running AND #e > :now";

struct Inner {
    client: Client,
    table: String,
    clock_offset_ms: i64,
}

/// The DynamoDB store behind [`crate::Idem::dynamodb`]. Cheap to clone (clones share one
/// client).
#[derive(Clone)]
pub struct DynamoDbStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

/// The expression attribute names every conditional step uses (`status`, `token`, `value`,
/// `ttl` are reserved words in DynamoDB expressions).
fn names(list: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn values(list: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>) -> Option<Item> {
    Some(list.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn holds_names() -> Option<HashMap<String, String>> {
    names(&[
        ("#t", TOKEN),
        ("#s", STATUS),
        ("#e", EXPIRES_AT),
        ("#ttl", TTL),
    ])
}

/// What a purge may delete: `keep_until` passed (`protocol::may_forget`), and the item not
/// live whatever wrote it; an item without `keep_until` (written before it) by its end alone.
const FORGETTABLE: &str = "#e < :now AND (attribute_not_exists(#k) OR #k < :now)";

impl DynamoDbStore {
    /// Opens a store on the table `options` name (default `idem_records`), with the AWS
    /// environment's region, credentials and endpoint.
    pub async fn connect(options: DynamoDbOptions) -> Result<DynamoDbStore, Error> {
        options.connect().await
    }

    /// A store on the application's own client (its region, credentials, retry and timeout
    /// settings are the client's; those of `options` are ignored). The table is checked, and
    /// created when missing unless `options.create_table(false)`.
    pub async fn from_client(
        client: Client,
        options: DynamoDbOptions,
    ) -> Result<DynamoDbStore, Error> {
        options.checked()?;
        table::ensure(&client, &options.table, options.create_table).await?;
        Ok(DynamoDbStore {
            inner: Arc::new(Inner {
                client,
                table: options.table.clone(),
                clock_offset_ms: options.clock_offset_ms,
            }),
        })
    }

    /// The client the store runs on.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The store's clock: this process's, in milliseconds since the epoch.
    fn now(&self) -> i64 {
        local_now_ms().saturating_add(self.inner.clock_offset_ms)
    }

    async fn claim_now(&self, claim: Claim<'_>) -> Result<ClaimOutcome, Error> {
        let client = &self.inner.client;
        // The token of the item that is there and no longer live, once a write has seen it, and
        // what replacing it takes over (when it was abandoned).
        let mut previous: Option<u64> = None;
        let mut takeover: Option<Takeover> = None;
        // A takeover keeps a resumable call's arguments (see `store::resume`).
        let mut kept: Option<Vec<u8>> = None;
        for _ in 0..CLAIM_ATTEMPTS {
            let now = self.now();
            let token = next_token(previous, now);
            let expires_at = now.saturating_add(ms(claim.lease));
            let mut new_item = item::claim_item(
                &claim,
                token,
                now,
                expires_at,
                takeover.map_or(1, |t| t.attempt),
                claim_keep_until(now, &claim).min(MAX_MS),
            );
            if let Some(args) = &kept {
                new_item.insert(VALUE.into(), b(args));
                new_item.insert(VALUE_SIZE.into(), n(args.len() as i64));
            }
            let put = client
                .put_item()
                .table_name(&self.inner.table)
                .set_item(Some(new_item))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            let put = match previous {
                None => put
                    .condition_expression("attribute_not_exists(#pk)")
                    .set_expression_attribute_names(names(&[("#pk", PK)])),
                Some(old) => put
                    .condition_expression("#t = :old AND #e <= :now")
                    .set_expression_attribute_names(names(&[("#t", TOKEN), ("#e", EXPIRES_AT)]))
                    .set_expression_attribute_values(values(vec![
                        (":old", n(old)),
                        (":now", n(now)),
                    ])),
            };
            match put.send().await {
                Ok(_) => {
                    // The body runs next, on this worker: one yield moves this task out of
                    // the worker's LIFO slot, as the other stores do.
                    tokio::task::yield_now().await;
                    return Ok(ClaimOutcome::Claimed { token, takeover });
                }
                Err(e) => {
                    let old = match e.as_service_error() {
                        Some(s) if s.is_conditional_check_failed_exception() => match s {
                            aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => c.item().cloned(),
                            _ => None,
                        },
                        _ => return Err(sdk_error("claim", e)),
                    };
                    match old {
                        Some(old) => {
                            let record = item::record(&old, now, "claim")?;
                            // Live, or a tombstone (answered without its value).
                            if let Some(mut found) = super::occupying(&record) {
                                self.with_chunks(&old, &mut found, "claim").await?;
                                return Ok(ClaimOutcome::Existing(found));
                            }
                            // The write below replaces this very item (its token is never
                            // reused), so what it takes over is decided now, on this clock.
                            previous = Some(record.token);
                            takeover = takeover_of(&record);
                            kept = takeover.and(record.value);
                        }
                        // Purged between our writes: claim it as new.
                        None => (previous, takeover, kept) = (None, None, None),
                    }
                }
            }
        }
        Err(Error::store_kind(
            BACKEND,
            "claim",
            StoreErrorKind::Busy,
            format!(
                "the key {} changed under {CLAIM_ATTEMPTS} claims in a row; try again",
                claim.key
            ),
        ))
    }

    /// An `UpdateItem` on `key` conditional on `token` holding it (and on `also`, if any):
    /// `set` may use `#s`, `#e`, `#k` (keep_until), `#v` and `#vs` (the value and its size),
    /// `#ttl`, `:now` and the `extra` values.
    #[allow(clippy::too_many_arguments)]
    async fn update_held(
        &self,
        op: &'static str,
        key: &Digest,
        token: u64,
        set: &str,
        also: Option<&str>,
        now: i64,
        extra: Vec<(&str, aws_sdk_dynamodb::types::AttributeValue)>,
    ) -> Result<bool, Error> {
        let mut names = holds_names().unwrap_or_default();
        // DynamoDB refuses a name the expressions do not use: add only those they name.
        let uses = |alias: &str| {
            [set, also.unwrap_or_default()].iter().any(|text| {
                text.split(|c: char| !(c == '#' || c == '_' || c.is_ascii_alphanumeric()))
                    .any(|word| word == alias)
            })
        };
        for (alias, attribute) in [("#k", KEEP_UNTIL), ("#v", VALUE), ("#vs", VALUE_SIZE)] {
            if uses(alias) {
                names.insert(alias.into(), attribute.into());
            }
        }
        if !set.contains("#ttl") {
            names.remove("#ttl");
        }
        let mut vals = vec![
            (":t", n(token)),
            (":running", n(Status::InProgress.as_i16())),
            (":now", n(now)),
        ];
        vals.extend(extra);
        let condition = match also {
            Some(c) => format!("{HOLDS} AND ({c})"),
            None => HOLDS.to_string(),
        };
        let res = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(item::key_of(key)))
            .update_expression(set)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(values(vals))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(sdk_error(op, e)),
        }
    }

    async fn release_now(&self, key: &Digest, token: u64) -> Result<bool, Error> {
        let now = self.now();
        let end = ended_at(now);
        self.update_held(
            "release",
            key,
            token,
            "SET #s = :released, #e = :end, #k = :end, #ttl = :ttl",
            None,
            now,
            vec![
                (":released", n(Status::Released.as_i16())),
                (":end", n(end)),
                (":ttl", ttl_of(end)),
            ],
        )
        .await
    }

    async fn renew_now(&self, key: &Digest, token: u64, lease: Duration) -> Result<bool, Error> {
        let now = self.now();
        let expires_at = now.saturating_add(ms(lease));
        // `keep_until` never falls below the lease's end. DynamoDB has no `max` to write it
        // with: the lease moves alone while `keep_until` covers it (a claim keeps a record for
        // its TTL, which is usually longer than any lease), else both move.
        if self
            .update_held(
                "renew",
                key,
                token,
                "SET #e = :exp",
                Some("#k >= :exp"),
                now,
                vec![(":exp", n(expires_at))],
            )
            .await?
        {
            return Ok(true);
        }
        self.update_held(
            "renew",
            key,
            token,
            "SET #e = :exp, #k = :exp, #ttl = :ttl",
            None,
            now,
            vec![(":exp", n(expires_at)), (":ttl", ttl_of(expires_at))],
        )
        .await
    }

    async fn resolve_now(&self, key: &Digest, resolution: Resolve<'_>) -> Result<Resolved, Error> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let now = self.now();
        let update = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(item::key_of(key)))
            .condition_expression("#s = :parked")
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let update = match resolution {
            Resolve::Applied { value, ttl } => {
                let end = now.saturating_add(ms(ttl));
                update
                    .update_expression(
                        "SET #s = :done, #v = :v, #z = :z, #e = :end, #k = :end, #ttl = :ttl",
                    )
                    .set_expression_attribute_names(names(&[
                        ("#s", STATUS),
                        ("#v", VALUE),
                        ("#z", VALUE_SIZE),
                        ("#e", EXPIRES_AT),
                        ("#k", KEEP_UNTIL),
                        ("#ttl", TTL),
                    ]))
                    .set_expression_attribute_values(values(vec![
                        (":parked", n(Status::Parked.as_i16())),
                        (":done", n(Status::Completed.as_i16())),
                        (":v", b(value)),
                        (":z", n(value.len())),
                        (":end", n(end)),
                        (":ttl", ttl_of(end)),
                    ]))
            }
            Resolve::NotApplied => {
                let end = ended_at(now);
                update
                    .update_expression(
                        "SET #s = :released, #e = :end, #k = :end, #ttl = :ttl REMOVE #v, #z",
                    )
                    .set_expression_attribute_names(names(&[
                        ("#s", STATUS),
                        ("#v", VALUE),
                        ("#z", VALUE_SIZE),
                        ("#e", EXPIRES_AT),
                        ("#k", KEEP_UNTIL),
                        ("#ttl", TTL),
                    ]))
                    .set_expression_attribute_values(values(vec![
                        (":parked", n(Status::Parked.as_i16())),
                        (":released", n(Status::Released.as_i16())),
                        (":end", n(end)),
                        (":ttl", ttl_of(end)),
                    ]))
            }
        };
        match update.send().await {
            Ok(out) => match out.attributes() {
                Some(old) => Ok(Resolved::Done(item::record(old, now, "resolve")?)),
                None => Err(corrupt(
                    "resolve",
                    "a resolved item returned nothing".into(),
                )),
            },
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(c)) => {
                    let found = c
                        .item()
                        .map(|old| item::record(old, now, "resolve"))
                        .transpose()?
                        .filter(|r| is_live(r.expires_at, now));
                    Ok(Resolved::NotParked(found))
                }
                _ => Err(sdk_error("resolve", e)),
            },
        }
    }

    async fn get_now(&self, key: &Digest) -> Result<Option<Record>, Error> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(&self.inner.table)
            .set_key(Some(item::key_of(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_error("get", e))?;
        let now = self.now();
        match out.item() {
            Some(it) => {
                let mut record = item::record(it, now, "get")?;
                if !is_live(record.expires_at, now) {
                    return Ok(None);
                }
                self.with_chunks(it, &mut record, "get").await?;
                Ok(Some(record))
            }
            None => Ok(None),
        }
    }

    async fn force_release_now(&self, key: &Digest) -> Result<Option<Record>, Error> {
        let now = self.now();
        let end = ended_at(now);
        let res = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(item::key_of(key)))
            .update_expression("SET #s = :released, #e = :end, #k = :end, #ttl = :ttl")
            .condition_expression("#e > :now")
            .set_expression_attribute_names(names(&[
                ("#s", STATUS),
                ("#e", EXPIRES_AT),
                ("#k", KEEP_UNTIL),
                ("#ttl", TTL),
            ]))
            .set_expression_attribute_values(values(vec![
                (":released", n(Status::Released.as_i16())),
                (":now", n(now)),
                (":end", n(end)),
                (":ttl", ttl_of(end)),
            ]))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        match res {
            Ok(out) => out
                .attributes()
                .map(|old| item::record(old, now, "force_release"))
                .transpose(),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(sdk_error("force_release", e)),
        }
    }

    /// Polls the item until it is no longer in progress, with backoff, within `timeout`.
    async fn changed_now(&self, key: &Digest, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(pause.min(left)).await;
            match self.get_now(key).await {
                Ok(Some(r)) if r.status == Status::InProgress => {}
                // Completed, released, lapsed; or a failing store, which the caller's next
                // claim reports.
                _ => return,
            }
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// The namespace length that [`Store::max_value_len`] and the check before a completion leave
/// room for. A longer one meets DynamoDB's own refusal (`ValidationException`), which the store
/// maps to the same outcome: kind `Capacity`, the key released.
const NAME_ALLOWANCE: usize = 256;

/// The largest value a completed item holds itself (with a namespace of up to 256 bytes); a
/// larger one is stored in chunks beside it.
pub fn max_inline_value_len() -> usize {
    MAX_ITEM_BYTES.saturating_sub(item::completed_size(NAME_ALLOWANCE, 0))
}

impl Store for DynamoDbStore {
    fn backend(&self) -> Backend {
        BACKEND
    }

    // No limit of its own: a value over one item goes in chunks (`chunks.rs`), so the handle's
    // limit (16 MiB by default) applies as on every store.

    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.claim_now(claim))
    }

    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.complete_now(done))
    }

    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.release_now(key, token))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.renew_now(key, token, lease))
    }

    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.get_now(key))
    }

    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(self.purge_now(limit.max(1)))
    }

    fn changed<'a>(&'a self, key: &'a Digest, timeout: Duration) -> BoxFuture<'a, ()> {
        Box::pin(self.changed_now(key, timeout))
    }

    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.force_release_now(key))
    }

    fn keep_args<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        args: &'a [u8],
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.keep_args_now(key, token, args))
    }

    fn abandoned_calls<'a>(
        &'a self,
        names: &'a [&'a str],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Record>, Error>> {
        Box::pin(self.abandoned_now(names, limit))
    }

    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let now = self.now();
            self.update_held(
                "park",
                key,
                token,
                "SET #s = :parked, #e = :never, #k = :never REMOVE #ttl",
                None,
                now,
                vec![
                    (":parked", n(Status::Parked.as_i16())),
                    (":never", n(i64::MAX)),
                ],
            )
            .await
        })
    }

    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let now = self.now();
            // `keep_until` stays as the claim set it (an item written before it gets its end).
            self.update_held(
                "abandon",
                key,
                token,
                "SET #e = :end, #k = if_not_exists(#k, :end)",
                None,
                now,
                vec![(":end", n(ended_at(now)))],
            )
            .await
        })
    }

    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        Box::pin(self.resolve_now(key, resolution))
    }
}
