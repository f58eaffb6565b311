//! The SQLite store's side of resumable calls (see [`crate::store::resume`]): the arguments
//! kept on the in-progress row, and the abandoned rows that hold them, read from the partial
//! index `<table>_resume` (schema 3).

use super::{err, record, SqliteStore};
use crate::error::Error;
use crate::key::Digest;
use crate::store::{local_now_ms, Record};
use sqlx::Row;

impl SqliteStore {
    /// `Store::keep_args`: fenced as every step is (in progress, this token, live).
    pub(super) async fn keep_args_now(
        &self,
        key: &Digest,
        token: u64,
        args: &[u8],
    ) -> Result<bool, Error> {
        let t = &self.table;
        let done = sqlx::query(&format!(
            "UPDATE {t} SET value = ?4 \
             WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
        ))
        .bind(key.as_bytes())
        .bind(token as i64)
        .bind(local_now_ms())
        .bind(args)
        .execute(&self.pool)
        .await
        .map_err(err("keep_args"))?;
        Ok(done.rows_affected() == 1)
    }

    /// `Store::abandoned_calls`: the conditions of the partial index (in progress, a value)
    /// then `protocol::abandoned` (lease lapsed, still kept), the longest lapsed first.
    pub(super) async fn abandoned_now(
        &self,
        names: &[&str],
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let t = &self.table;
        let now = local_now_ms();
        let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT key, {cols} FROM {t} INDEXED BY {t}_resume \
             WHERE status = 0 AND value IS NOT NULL \
             AND name IN (SELECT value FROM json_each(?1)) \
             AND expires_at <= ?2 AND keep_until >= ?2 \
             ORDER BY expires_at, key LIMIT ?3",
            cols = super::statements::COLUMNS
        ))
        .bind(names)
        .bind(now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(err("abandoned_calls"))?;
        rows.iter()
            .map(|r| {
                let key: Vec<u8> = r.try_get("key").map_err(err("abandoned_calls"))?;
                let key = Digest::from_slice(&key).ok_or_else(|| {
                    Error::store_kind(
                        super::BACKEND,
                        "read",
                        crate::error::StoreErrorKind::Corrupt,
                        "a row with a key that is not a digest",
                    )
                })?;
                record(&key, r, now)
            })
            .collect()
    }
}
