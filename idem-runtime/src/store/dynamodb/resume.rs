//! The DynamoDB store's side of resumable calls (see [`crate::store::resume`]): the arguments
//! kept on the in-progress item (a conditional update, fenced like every step), and the
//! abandoned items that hold them.
//!
//! Not indexed yet: the query is a `Scan` of the table, filtered client side (what
//! [`super::inspect`]'s listings do), so it costs read units in proportion to the table. A
//! sparse global secondary index (an attribute set by `keep_args` and removed by every other
//! write) is the way to index it; until then, give a resumer on DynamoDB a long poll interval.

use super::item::{self, b, n, ATTEMPT, CREATED_AT, EXPIRES_AT, FINGERPRINT, KEEP_UNTIL, NAME};
use super::item::{PK, STATUS, TOKEN, VALUE};
use super::DynamoDbStore;
use crate::error::Error;
use crate::key::Digest;
use crate::store::resume::finish_abandoned;
use crate::store::Record;

impl DynamoDbStore {
    /// `Store::keep_args`: the value (and its size, which listings show) set while this token
    /// holds the item.
    pub(super) async fn keep_args_now(
        &self,
        key: &Digest,
        token: u64,
        args: &[u8],
    ) -> Result<bool, Error> {
        let now = self.now();
        self.update_held(
            "keep_args",
            key,
            token,
            "SET #v = :v, #vs = :vs",
            None,
            now,
            vec![(":v", b(args)), (":vs", n(args.len() as i64))],
        )
        .await
    }

    /// `Store::abandoned_calls`: a scan, judged at one instant of the store's clock.
    pub(super) async fn abandoned_now(
        &self,
        names: &[&str],
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let op = "abandoned_calls";
        let items = self
            .scan_all(
                op,
                &[
                    PK,
                    NAME,
                    FINGERPRINT,
                    TOKEN,
                    STATUS,
                    VALUE,
                    CREATED_AT,
                    EXPIRES_AT,
                    ATTEMPT,
                    KEEP_UNTIL,
                ],
            )
            .await?;
        let now = self.now();
        let mut rows = Vec::new();
        for it in &items {
            let record = item::record(it, now, op)?;
            if names.contains(&record.name.as_str()) {
                rows.push(record);
            }
        }
        Ok(finish_abandoned(rows, limit))
    }
}
