//! The operator's queries on the SQLite store ([`Inspect`]): one statement each.

use super::{err, record, sqlx_error, SqliteStore, BACKEND};
use crate::error::{Error, StoreErrorKind};
use crate::key::Digest;
use crate::store::{local_now_ms, BoxFuture, Filter, Inspect, KeyInfo, Stat, State, Status};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

fn corrupt(op: &'static str, what: String) -> Error {
    Error::store_kind(BACKEND, op, StoreErrorKind::Corrupt, what)
}

impl Inspect for SqliteStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let now = local_now_ms();
            let sql = if filter.tombstones {
                &self.sql.list_tombstones
            } else {
                &self.sql.list
            };
            let rows = sqlx::query(sql)
                .bind(now)
                .bind(now.saturating_sub(filter.older_than_ms()))
                .bind(filter.name.as_deref())
                .bind(filter.status.map(|s| i64::from(s.as_i16())))
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(err("list"))?;
            rows.iter().map(|r| key_info("list", r, now)).collect()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.stats)
                .bind(local_now_ms())
                .fetch_all(&self.pool)
                .await
                .map_err(err("stats"))?;
            rows.iter()
                .map(|r| {
                    let get = |e: sqlx::Error| sqlx_error("stats", e);
                    let state: i64 = r.try_get("state").map_err(get)?;
                    let count: i64 = r.try_get("n").map_err(get)?;
                    Ok(Stat {
                        name: r.try_get("name").map_err(get)?,
                        state: State::from_code(state)
                            .ok_or_else(|| corrupt("stats", format!("unknown status {state}")))?,
                        count: count as u64,
                    })
                })
                .collect()
        })
    }

    fn parked<'a>(
        &'a self,
        name: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            // A parked record's `keep_until` is i64::MAX: the `keep_until` index finds them
            // without reading the other records.
            let sql = format!(
                "SELECT key, name, fingerprint, token, status, NULL AS value, \
                 length(value) AS size, created_at, expires_at, attempt, keep_until FROM {t} \
                 WHERE keep_until = ?1 AND status = ?2 AND (?3 IS NULL OR name = ?3) \
                 ORDER BY created_at, key LIMIT ?4",
                t = self.table()
            );
            let now = local_now_ms();
            let rows = sqlx::query(&sql)
                .bind(i64::MAX)
                .bind(i64::from(Status::Parked.as_i16()))
                .bind(name)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(err("parked"))?;
            rows.iter().map(|r| key_info("parked", r, now)).collect()
        })
    }
}

/// A listing's row (the value left out, its size in `size`).
fn key_info(op: &'static str, r: &SqliteRow, now: i64) -> Result<KeyInfo, Error> {
    let get = |e: sqlx::Error| sqlx_error(op, e);
    let key: Vec<u8> = r.try_get("key").map_err(get)?;
    let key = Digest::from_slice(&key)
        .ok_or_else(|| corrupt(op, "a stored key is not 32 bytes".into()))?;
    let size: Option<i64> = r.try_get("size").map_err(get)?;
    let rec = record(&key, r, now)?;
    Ok(KeyInfo {
        value_size: size.map(|n| n as u64),
        ..KeyInfo::from(&rec)
    })
}
