//! The operator's queries on the PostgreSQL store ([`Inspect`]): one statement each, on
//! the server's clock like every other step.

use super::{corrupt, digest_of, pg_error, PostgresStore, CLOCK};
use crate::error::Error;
use crate::store::{BoxFuture, Filter, Inspect, KeyInfo, Stat, State, Status};
use sqlx::Row;

impl Inspect for PostgresStore {
    fn list<'a>(&'a self, filter: &'a Filter) -> BoxFuture<'a, Result<Vec<KeyInfo>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now) \
                 SELECT e.key, e.name, e.fingerprint, e.token, e.status, \
                        octet_length(e.value)::bigint, e.created_at, e.expires_at, clock.now, \
                        e.attempt, e.keep_until \
                   FROM {r} e, clock \
                  WHERE e.expires_at > clock.now AND e.created_at <= clock.now - $1 \
                    AND ($2::text IS NULL OR e.name = $2) \
                    AND ($3::smallint IS NULL OR e.status = $3) \
                  ORDER BY e.created_at, e.key LIMIT $4",
                r = self.inner.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(filter.older_than_ms())
                .bind(filter.name.as_deref())
                .bind(filter.status.map(Status::as_i16))
                .bind(i64::try_from(filter.limit).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(|e| pg_error("list", e))?;
            rows.iter()
                .map(|row| {
                    let get = |e: sqlx::Error| pg_error("list", e);
                    let status: i16 = row.try_get(4).map_err(get)?;
                    let token: i64 = row.try_get(3).map_err(get)?;
                    let size: Option<i64> = row.try_get(5).map_err(get)?;
                    let attempt: i32 = row.try_get(9).map_err(get)?;
                    Ok(KeyInfo {
                        key: digest_of("list", "key", row.try_get(0).map_err(get)?)?,
                        name: row.try_get(1).map_err(get)?,
                        fingerprint: digest_of(
                            "list",
                            "fingerprint",
                            row.try_get(2).map_err(get)?,
                        )?,
                        token: token as u64,
                        status: Status::from_i16(status)
                            .ok_or_else(|| corrupt("list", format!("unknown status {status}")))?,
                        value_size: size.map(|n| n as u64),
                        created_at: row.try_get(6).map_err(get)?,
                        expires_at: row.try_get(7).map_err(get)?,
                        now: row.try_get(8).map_err(get)?,
                        attempt: u32::try_from(attempt).unwrap_or(1),
                        keep_until: row.try_get(10).map_err(get)?,
                    })
                })
                .collect()
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<Vec<Stat>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "WITH clock AS MATERIALIZED (SELECT {CLOCK} AS now) \
                 SELECT e.name, \
                        (CASE WHEN e.status = 3 THEN 3 WHEN e.expires_at > clock.now THEN e.status \
                              WHEN e.status = 0 AND e.keep_until >= clock.now THEN 4 \
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
}
