//! The PostgreSQL store's side of resumable calls (see [`crate::store::resume`]): the arguments
//! kept on the in-progress row, and the abandoned rows that hold them, read from the partial
//! index `<table>_resume_idx` (schema 5) on the database's clock.

use super::{pg_error, record_from, PostgresStore, CLOCK};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use crate::store::Record;
use sqlx::Row;

impl PostgresStore {
    /// `Store::keep_args`: fenced as every step is (in progress, this token, live).
    pub(super) async fn keep_args_now(
        &self,
        key: &Digest,
        token: u64,
        args: &[u8],
    ) -> Result<bool, Error> {
        let r = &self.inner.table.records;
        let done = sqlx::query(&format!(
            "UPDATE {r} SET value = $3 \
             WHERE key = $1 AND token = $2 AND status = 0 AND expires_at > {CLOCK}"
        ))
        .bind(&key.0[..])
        .bind(token as i64)
        .bind(args)
        .execute(&self.inner.pool)
        .await
        .map_err(|e| pg_error("keep_args", e))?;
        Ok(done.rows_affected() == 1)
    }

    /// `Store::abandoned_calls`: the partial index's conditions (in progress, a value), then
    /// `protocol::abandoned` (lease lapsed, still kept), the longest lapsed first.
    pub(super) async fn abandoned_now(
        &self,
        names: &[&str],
        limit: usize,
    ) -> Result<Vec<Record>, Error> {
        let r = &self.inner.table.records;
        let rows = sqlx::query(&format!(
            "SELECT key, name, fingerprint, token, status, value, created_at, expires_at, \
             attempt, keep_until, {CLOCK} FROM {r} \
             WHERE status = 0 AND value IS NOT NULL AND name = ANY($1) \
             AND expires_at <= {CLOCK} AND keep_until >= {CLOCK} \
             ORDER BY expires_at, key LIMIT $2"
        ))
        .bind(names)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| pg_error("abandoned_calls", e))?;
        rows.iter()
            .map(|row| {
                let key: Vec<u8> = row.try_get(0).map_err(|e| pg_error("abandoned_calls", e))?;
                let key = Digest::from_slice(&key).ok_or_else(|| {
                    Error::store_kind(
                        super::BACKEND,
                        "abandoned_calls",
                        StoreErrorKind::Corrupt,
                        "a row with a key that is not a digest",
                    )
                })?;
                record_from("abandoned_calls", &key, row, 1)
            })
            .collect()
    }
}
