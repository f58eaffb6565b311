//! The operator's queries on the MySQL store ([`Inspect`]): one statement each, on the
//! server's clock like every other step (MySQL fixes a statement's time when it starts, so
//! every row of one listing is judged at one instant).

use super::statements::CLOCK;
use super::{corrupt, digest_of, my_error, record_from, MysqlStore};
use crate::error::Error;
use crate::store::{BoxFuture, Filter, Inspect, KeyInfo, Stat, State, Status};
use sqlx::Row;

impl MysqlStore {
    fn list_sql(&self, tombstones: bool) -> String {
        // Columns 0..10 as `record_from` decodes them, without the value (a listing shows its
        // size only), then the key and the size.
        format!(
            "SELECT `name`, `fingerprint`, `token`, `status`, NULL, `created_at`, `expires_at`, \
                    `attempt`, `keep_until`, c.now, `key`, CAST(LENGTH(`value`) AS SIGNED) \
               FROM {r} CROSS JOIN (SELECT {CLOCK} AS now) c \
              WHERE {listed} AND `created_at` <= c.now - ? \
                AND (? IS NULL OR `name` = ?) \
                AND (? IS NULL OR `status` = ?) \
              ORDER BY `created_at`, `key` LIMIT ?",
            r = self.inner.table.records,
            listed = if tombstones {
                "`status` = 1 AND `expires_at` <= c.now AND `keep_until` > c.now"
            } else {
                "`expires_at` > c.now"
            }
        )
    }

    fn stats_sql(&self) -> String {
        format!(
            "SELECT `name`, \
                    CAST(CASE WHEN `status` = 3 THEN 3 WHEN `expires_at` > c.now THEN `status` \
                              WHEN `status` = 0 AND `keep_until` >= c.now THEN 4 \
                              WHEN `status` = 1 AND `keep_until` > c.now THEN 5 \
                              ELSE 2 END AS SIGNED), \
                    COUNT(*) \
               FROM {r} CROSS JOIN (SELECT {CLOCK} AS now) c \
              GROUP BY 1, 2 ORDER BY 1, 2",
            r = self.inner.table.records
        )
    }
}

impl Inspect for MysqlStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let status = filter.status.map(Status::as_i16);
            let rows = sqlx::query(&self.list_sql(filter.tombstones))
                .bind(filter.older_than_ms())
                .bind(filter.name.as_deref())
                .bind(filter.name.as_deref())
                .bind(status)
                .bind(status)
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(|e| my_error("list", e))?;
            rows.iter().map(|row| key_info("list", row)).collect()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.stats_sql())
                .fetch_all(self.pool())
                .await
                .map_err(|e| my_error("stats", e))?;
            rows.iter()
                .map(|row| {
                    let get = |e: sqlx::Error| my_error("stats", e);
                    // Bytes: sqlx refuses a `_bin` collated text column as a `String`.
                    let name: Vec<u8> = row.try_get(0).map_err(get)?;
                    let name = String::from_utf8(name)
                        .map_err(|_| corrupt("stats", "a stored name is not UTF-8".into()))?;
                    let state: i64 = row.try_get(1).map_err(get)?;
                    let count: i64 = row.try_get(2).map_err(get)?;
                    Ok(Stat {
                        name,
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
            // A parked record's `keep_until` is i64::MAX: an equality on the `keep_until`
            // index finds them without reading the other records.
            let sql = format!(
                "SELECT `name`, `fingerprint`, `token`, `status`, NULL, `created_at`, \
                        `expires_at`, `attempt`, `keep_until`, c.now, `key`, \
                        CAST(LENGTH(`value`) AS SIGNED) \
                   FROM {r} CROSS JOIN (SELECT {CLOCK} AS now) c \
                  WHERE `keep_until` = ? AND `status` = ? AND (? IS NULL OR `name` = ?) \
                  ORDER BY `created_at`, `key` LIMIT ?",
                r = self.inner.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(i64::MAX)
                .bind(Status::Parked.as_i16())
                .bind(name)
                .bind(name)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(|e| my_error("parked", e))?;
            rows.iter().map(|row| key_info("parked", row)).collect()
        })
    }
}

/// A listing's row: `record_from`'s columns, then the key and the value's size.
fn key_info(op: &'static str, row: &sqlx::mysql::MySqlRow) -> Result<KeyInfo, Error> {
    let get = |e: sqlx::Error| my_error(op, e);
    let key = digest_of(op, "key", row.try_get(10).map_err(get)?)?;
    let size: Option<i64> = row.try_get(11).map_err(get)?;
    let record = record_from(op, &key, row)?;
    Ok(KeyInfo {
        value_size: size.map(|n| n as u64),
        ..KeyInfo::from(&record)
    })
}
