//! The operator's queries on the PostgreSQL store ([`Inspect`]): one statement each, on
//! the server's clock like every other step.

use super::{corrupt, digest_of, pg_error, PostgresStore, CLOCK};
use crate::error::Error;
use crate::store::{
    millis, BoxFuture, Filter, Inspect, KeyInfo, NameSummary, Overview, PageQuery, Stat, State,
    Status,
};
use sqlx::postgres::PgRow;
use sqlx::Row;
use std::time::Duration;

/// A listing's row: key, name, fingerprint, token, status, value size, created, expires, now.
fn key_info(op: &'static str, row: &PgRow) -> Result<KeyInfo, Error> {
    let get = |e: sqlx::Error| pg_error(op, e);
    let status: i16 = row.try_get(4).map_err(get)?;
    let token: i64 = row.try_get(3).map_err(get)?;
    let size: Option<i64> = row.try_get(5).map_err(get)?;
    let attempt: i32 = row.try_get(9).map_err(get)?;
    Ok(KeyInfo {
        key: digest_of(op, "key", row.try_get(0).map_err(get)?)?,
        name: row.try_get(1).map_err(get)?,
        fingerprint: digest_of(op, "fingerprint", row.try_get(2).map_err(get)?)?,
        token: token as u64,
        status: Status::from_i16(status)
            .ok_or_else(|| corrupt(op, format!("unknown status {status}")))?,
        value_size: size.map(|n| n as u64),
        created_at: row.try_get(6).map_err(get)?,
        expires_at: row.try_get(7).map_err(get)?,
        now: row.try_get(8).map_err(get)?,
        attempt: u32::try_from(attempt).unwrap_or(1),
        keep_until: row.try_get(10).map_err(get)?,
    })
}

impl Inspect for PostgresStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now) \
                 SELECT e.key, e.name, e.fingerprint, e.token, e.status, \
                        octet_length(e.value)::bigint, e.created_at, e.expires_at, clock.now, \
                        e.attempt, e.keep_until \
                   FROM {r} e, clock \
                  WHERE {listed} AND e.created_at <= clock.now - $1 \
                    AND ($2::text IS NULL OR e.name = $2) \
                    AND ($3::smallint IS NULL OR e.status = $3) \
                  ORDER BY e.created_at, e.key LIMIT $4",
                r = self.inner.table.records,
                listed = if filter.tombstones {
                    "e.status = 1 AND e.expires_at <= clock.now AND e.keep_until > clock.now"
                } else {
                    "e.expires_at > clock.now"
                }
            );
            let rows = sqlx::query(&sql)
                .bind(filter.older_than_ms())
                .bind(filter.name.as_deref())
                .bind(filter.status.map(Status::as_i16))
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("list", e))?;
            rows.iter().map(|row| key_info("list", row)).collect()
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
                "SELECT e.key, e.name, e.fingerprint, e.token, e.status, \
                        octet_length(e.value)::bigint, e.created_at, e.expires_at, {CLOCK}, \
                        e.attempt, e.keep_until \
                   FROM {r} e \
                  WHERE e.keep_until = $1 AND e.status = $2 \
                    AND ($3::text IS NULL OR e.name = $3) \
                  ORDER BY e.created_at, e.key LIMIT $4",
                r = self.inner.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(i64::MAX)
                .bind(Status::Parked.as_i16())
                .bind(name)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("parked", e))?;
            rows.iter().map(|row| key_info("parked", row)).collect()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now) \
                 SELECT e.name, \
                        (CASE WHEN e.status = 3 THEN 3 WHEN e.expires_at > clock.now THEN e.status \
                              WHEN e.status = 0 AND e.keep_until >= clock.now THEN 4 \
                              WHEN e.status = 1 AND e.keep_until > clock.now THEN 5 \
                              ELSE 2 END)::bigint, \
                        count(*) \
                   FROM {r} e, clock GROUP BY 1, 2 ORDER BY 1, 2",
                r = self.inner.table.records
            );
            let rows = sqlx::query(&sql)
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("stats", e))?;
            rows.iter()
                .map(|row| {
                    let get = |e: sqlx::Error| pg_error("stats", e);
                    let state: i64 = row.try_get(1).map_err(get)?;
                    let count: i64 = row.try_get(2).map_err(get)?;
                    Ok(Stat {
                        name: row.try_get(0).map_err(get)?,
                        state: State::from_code(state)
                            .ok_or_else(|| corrupt("stats", format!("unknown status {state}")))?,
                        count: count as u64,
                    })
                })
                .collect()
        })
    }

    fn page<'a>(&'a self, query: &'a PageQuery) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            // The bound on expires_at is an index condition (the clock is a stable expression,
            // the cursor a parameter) and the order is the index's, then the key's: a page
            // reads its own rows and the rows its filters skip, never those of earlier pages.
            let sql = format!(
                "SELECT e.key, e.name, e.fingerprint, e.token, e.status, \
                        octet_length(e.value)::bigint, e.created_at, e.expires_at, {CLOCK}, \
                        e.attempt, e.keep_until \
                   FROM {r} e \
                  WHERE e.expires_at >= greatest({CLOCK} + 1, $5) \
                    AND (e.expires_at > $5 OR e.key > $6) \
                    AND e.created_at <= {CLOCK} - $1 \
                    AND ($2::text IS NULL OR e.name = $2) \
                    AND ($3::smallint IS NULL OR e.status = $3) \
                    AND ($7::text IS NULL OR starts_with(e.name, $7)) \
                  ORDER BY e.expires_at, e.key LIMIT $4",
                r = self.inner.table.records
            );
            let filter = &query.filter;
            let (after_expiry, after_key) = match &query.after {
                Some(c) => (c.expires_at, c.key.0.to_vec()),
                None => (i64::MIN, Vec::new()),
            };
            let rows = sqlx::query(&sql)
                .bind(filter.older_than_ms())
                .bind(filter.name.as_deref())
                .bind(filter.status.map(Status::as_i16))
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .bind(after_expiry)
                .bind(after_key)
                .bind(query.steps_prefix())
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("page", e))?;
            rows.iter().map(|row| key_info("page", row)).collect()
        })
    }

    fn overview(&self, soon: Duration) -> BoxFuture<'_, Result<Overview, Error>> {
        Box::pin(async move {
            // Steps (`<64 hex>/<step>`) are grouped as `*/<step>`, as `summary_name` does.
            let sql = format!(
                "WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now) \
                 SELECT CASE WHEN position('/' IN e.name) = 65 \
                                  AND substr(e.name, 1, 64) ~ '^[0-9a-f]{{64}}$' \
                             THEN '*' || substr(e.name, 65) ELSE e.name END, \
                        count(*) FILTER (WHERE e.expires_at > c.now AND e.status = 0), \
                        count(*) FILTER (WHERE e.expires_at > c.now AND e.status = 1), \
                        count(*) FILTER (WHERE e.expires_at <= c.now), \
                        min(e.created_at) FILTER (WHERE e.expires_at > c.now AND e.status = 0), \
                        count(*) FILTER (WHERE e.expires_at > c.now \
                                           AND e.expires_at <= c.now + $1), \
                        count(*) FILTER (WHERE e.status = 3), \
                        c.now \
                   FROM {r} e, clock c GROUP BY 1, c.now ORDER BY 1",
                r = self.inner.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(millis(soon))
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("overview", e))?;
            let mut overview = Overview::default();
            for row in &rows {
                let get = |e: sqlx::Error| pg_error("overview", e);
                let count = |i: usize| -> Result<u64, Error> {
                    Ok(row.try_get::<i64, _>(i).map_err(get)?.max(0) as u64)
                };
                overview.names.push(NameSummary {
                    name: row.try_get(0).map_err(get)?,
                    in_progress: count(1)?,
                    completed: count(2)?,
                    expired: count(3)?,
                    oldest_in_progress: row.try_get(4).map_err(get)?,
                    expiring_soon: count(5)?,
                    parked: count(6)?,
                });
                overview.now = row.try_get(7).map_err(get)?;
            }
            if rows.is_empty() {
                overview.now = sqlx::query_scalar(&format!("SELECT {CLOCK}"))
                    .fetch_one(self.pool())
                    .await
                    .map_err(|e| pg_error("overview", e))?;
            }
            Ok(overview)
        })
    }
}
