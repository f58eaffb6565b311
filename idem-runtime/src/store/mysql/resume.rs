//! The MySQL / MariaDB store's side of resumable calls (see [`crate::store::resume`]): the
//! arguments kept on the in-progress row, and the abandoned rows that hold them, read from the
//! index `<table>_resume_idx` on `(status, name, expires_at)` (schema 3; neither server has
//! partial indexes), on the server's clock.

use super::statements::CLOCK;
use super::{digest_of, my_error, record_from, MysqlStore};
use crate::error::Error;
use crate::key::Digest;
use crate::store::Record;
use sqlx::Row;

impl MysqlStore {
    /// `Store::keep_args`: fenced as every step is (in progress, this token, live).
    pub(super) async fn keep_args_now(
        &self,
        key: &Digest,
        token: u64,
        args: &[u8],
    ) -> Result<bool, Error> {
        let r = &self.inner.table.records;
        let done = sqlx::query(&format!(
            "UPDATE {r} SET `value` = ? WHERE `key` = ? AND `token` = ? AND `status` = 0 \
             AND `expires_at` > {CLOCK}"
        ))
        .bind(args)
        .bind(&key.0[..])
        .bind(token as i64)
        .execute(&self.inner.pool)
        .await
        .map_err(|e| my_error("keep_args", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// `Store::abandoned_calls`: in progress, of these names, lease lapsed (the index's
    /// range), still kept, with a value; the longest lapsed first.
    pub(super) async fn abandoned_now(
        &self,
        names: &[&str],
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let r = &self.inner.table.records;
        let marks = vec!["?"; names.len()].join(", ");
        let sql = format!(
            "SELECT `name`, `fingerprint`, `token`, `status`, `value`, `created_at`, \
             `expires_at`, `attempt`, `keep_until`, {CLOCK}, `key` FROM {r} \
             WHERE `status` = 0 AND `name` IN ({marks}) AND `expires_at` <= {CLOCK} \
             AND `keep_until` >= {CLOCK} AND `value` IS NOT NULL \
             ORDER BY `expires_at`, `key` LIMIT ?"
        );
        let mut q = sqlx::query(&sql);
        for name in names {
            q = q.bind(*name);
        }
        let rows = q
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| my_error("abandoned_calls", e))?;
        rows.iter()
            .map(|row| {
                let key: Vec<u8> = row
                    .try_get(10)
                    .map_err(|e| my_error("abandoned_calls", e))?;
                let key = digest_of("abandoned_calls", "key", key)?;
                record_from("abandoned_calls", &key, row)
            })
            .collect()
    }
}
