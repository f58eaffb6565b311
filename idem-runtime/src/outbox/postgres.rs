//! The outbox on PostgreSQL: its statements ([`PgDialect`]), the constructors of
//! `Outbox<Postgres>`, and the `LISTEN` that wakes the relays when a message is committed.

use super::dialect::{ms, Dialect, OutboxDatabase};
use super::listing::{message_info, ListFilter};
use super::schema::{self, DEAD, DELIVERED, OUTBOX_SCHEMA_VERSION, PENDING};
use super::{Delivery, Enqueued, Message, MessageInfo, Outbox, OutboxStats, DEFAULT_OUTBOX_TABLE};
use crate::error::{Error, StoreErrorKind};
use crate::store::postgres::pg_error;
use crate::store::postgres::schema::{current_version, ensure_with, Table};
use crate::store::{Backend, BoxFuture, Migration, SchemaVersion};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool, Postgres, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

impl OutboxDatabase for Postgres {
    type __Dialect = PgDialect;
}

/// The outbox's statements on PostgreSQL.
#[derive(Debug)]
pub struct PgDialect {
    table: Table,
    sql_enqueue: String,
}

impl Outbox<Postgres> {
    /// The outbox in the default table [`DEFAULT_OUTBOX_TABLE`] of `pool`'s database.
    pub fn new(pool: PgPool) -> Outbox<Postgres> {
        Outbox::with_table(pool, DEFAULT_OUTBOX_TABLE).expect("the default table name is valid")
    }

    /// The outbox in `table` (`name` or `schema.name`, validated as the store's table names
    /// are): `Error::Config` for a name that is not a plain identifier.
    pub fn with_table(pool: PgPool, table: &str) -> Result<Outbox<Postgres>, Error> {
        Outbox::assemble(pool, table)
    }

    /// The SQL of every migration of `table`, for a DBA to review and run.
    pub fn migrations(table: &str) -> Result<Vec<Migration>, Error> {
        Ok(schema::postgres(&Table::parse(table)?))
    }

    /// Opens the outbox in `table` of the database at `url` (`postgres://…`) for an operator:
    /// a pool of two connections, checked at once, and the table's schema checked without
    /// creating anything. A table never migrated is an [`Error::Store`] of kind
    /// [`StoreErrorKind::SchemaMissing`] whose message names the migration to run; a URL that
    /// is not PostgreSQL's is [`Error::Config`] (a `mysql://` one: use
    /// [`Outbox::connect_mysql`](Outbox#method.connect_mysql), feature `mysql`).
    pub async fn connect(url: &str, table: &str) -> Result<Outbox<Postgres>, Error> {
        Outbox::connect_as(url, table, None).await
    }

    /// [`Outbox::connect`] with the connections' `application_name`.
    pub async fn connect_as(
        url: &str,
        table: &str,
        application_name: Option<&str>,
    ) -> Result<Outbox<Postgres>, Error> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Error::config(
                "the outbox is on PostgreSQL: the URL must start with postgres:// or \
                 postgresql:// (postgres://user:password@host:port/database); for a mysql:// \
                 URL, Outbox::connect_mysql",
            ));
        }
        let t = Table::parse(table)?;
        let mut options = PgConnectOptions::from_str(url).map_err(|e| {
            Error::config(format!(
                "invalid PostgreSQL URL ({e}); expected postgres://user:password@host:port/database"
            ))
        })?;
        if let Some(name) = application_name {
            options = options.application_name(name);
        }
        let mut conn = options
            .connect()
            .await
            .map_err(|e| pg_error("outbox.connect", e))?;
        let checked = check(&mut conn, &t).await;
        let _ = sqlx::Connection::close(conn).await;
        checked?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        Outbox::with_table(pool, table)
    }
}

/// The schema of `t` for an operator's connection: present and not newer than the code.
async fn check(conn: &mut PgConnection, t: &Table) -> Result<(), Error> {
    match current_version(conn, t).await? {
        0 => Err(missing(t)),
        _ => ensure_with(conn, t, false, OUTBOX_SCHEMA_VERSION, schema::postgres(t))
            .await
            .map(drop),
    }
}

/// The outbox table is missing: which migration creates it.
fn missing(t: &Table) -> Error {
    Error::store_kind(
        Backend::Postgres,
        "outbox.connect",
        StoreErrorKind::SchemaMissing,
        format!(
            "the PostgreSQL database has no outbox table {}: it is created by outbox migration \
             1 (\"outbox messages\"), which `Outbox::migrate()` runs (or `idem outbox migrate`; \
             the SQL: `Outbox::migrations(\"{}\")`)",
            t.display, t.display
        ),
    )
}

impl Dialect for PgDialect {
    type Db = Postgres;

    fn parse(table: &str) -> Result<Self, Error> {
        let table = Table::parse(table)?;
        // One statement, one round trip: the insert, and a NOTIFY that PostgreSQL delivers to
        // the relays when (and only if) the caller's transaction commits.
        let sql_enqueue = format!(
            "WITH ins AS (\n\
             \x20   INSERT INTO {t} (id, topic, ordering_key, payload, headers)\n\
             \x20   VALUES (coalesce($1, gen_random_uuid()::text), $2, $3, $4, $5::text::jsonb)\n\
             \x20   ON CONFLICT (id) DO NOTHING RETURNING id\n\
             )\n\
             SELECT ins.id, pg_notify($6, '') IS NULL FROM ins",
            t = table.records
        );
        Ok(PgDialect { table, sql_enqueue })
    }

    fn display(&self) -> &str {
        &self.table.display
    }

    fn error(op: &'static str, e: sqlx::Error) -> Error {
        pg_error(op, e)
    }

    fn migrations(&self) -> Vec<Migration> {
        schema::postgres(&self.table)
    }

    fn ensure<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        apply: bool,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
        ensure_with(
            conn,
            &self.table,
            apply,
            OUTBOX_SCHEMA_VERSION,
            schema::postgres(&self.table),
        )
    }

    fn schema_version<'a>(
        &'a self,
        conn: &'a mut PgConnection,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
        current_version(conn, &self.table)
    }

    fn enqueue<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        id: Option<String>,
        message: &'a Message,
        headers: String,
    ) -> BoxFuture<'a, Result<Enqueued, Error>> {
        Box::pin(async move {
            let row: Option<(String, bool)> = sqlx::query_as(&self.sql_enqueue)
                .bind(id.as_deref())
                .bind(&message.topic)
                .bind(&message.ordering_key)
                .bind(&message.payload)
                .bind(headers)
                .bind(&self.table.channel)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| pg_error("outbox.enqueue", e))?;
            Ok(match row {
                Some((id, _)) => Enqueued { id, new: true },
                // Only a conflict returns no row, and a conflict needs an id of ours.
                None => Enqueued {
                    id: id.unwrap_or_default(),
                    new: false,
                },
            })
        })
    }

    fn stats<'a>(&'a self, pool: &'a PgPool) -> BoxFuture<'a, Result<OutboxStats, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT count(*) FILTER (WHERE status = {PENDING}), \
                        count(*) FILTER (WHERE status = {DELIVERED}), \
                        count(*) FILTER (WHERE status = {DEAD}), \
                        (extract(epoch FROM now() - min(created_at) FILTER (WHERE status = {PENDING})) \
                         * 1000)::bigint \
                 FROM {t}",
                t = self.table.records
            );
            let row: (i64, i64, i64, Option<i64>) = sqlx::query_as(&sql)
                .fetch_one(pool)
                .await
                .map_err(|e| pg_error("outbox.stats", e))?;
            Ok(OutboxStats::from_counts(row))
        })
    }

    fn retry_dead<'a>(
        &'a self,
        pool: &'a PgPool,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {t} SET status = {PENDING}, attempts = 0, next_attempt_at = now(), \
                 last_error = NULL WHERE status = {DEAD} AND ($1::text IS NULL OR id = $1)",
                t = self.table.records,
            );
            let done = sqlx::query(&sql)
                .bind(id)
                .execute(pool)
                .await
                .map_err(|e| pg_error("outbox.retry", e))?;
            Ok(done.rows_affected())
        })
    }

    fn list<'a>(
        &'a self,
        pool: &'a PgPool,
        filter: &'a ListFilter,
    ) -> BoxFuture<'a, Result<Vec<MessageInfo>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT id, topic, ordering_key, status, attempts, \
                        (extract(epoch FROM now() - created_at) * 1000)::bigint, \
                        (extract(epoch FROM next_attempt_at - now()) * 1000)::bigint, \
                        last_error, octet_length(payload)::bigint \
                 FROM {t} WHERE status = ANY($1) \
                 AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR ordering_key = $3) \
                 ORDER BY seq LIMIT $4",
                t = self.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(filter.codes())
                .bind(filter.topic.as_deref())
                .bind(filter.ordering_key.as_deref())
                .bind(filter.limit)
                .fetch_all(pool)
                .await
                .map_err(|e| pg_error("outbox.list", e))?;
            let db = |e| pg_error("outbox.list", e);
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(message_info(
                    Backend::Postgres,
                    row.try_get(0).map_err(db)?,
                    row.try_get(1).map_err(db)?,
                    row.try_get(2).map_err(db)?,
                    row.try_get(3).map_err(db)?,
                    row.try_get(4).map_err(db)?,
                    row.try_get(5).map_err(db)?,
                    row.try_get(6).map_err(db)?,
                    row.try_get(7).map_err(db)?,
                    row.try_get(8).map_err(db)?,
                )?);
            }
            Ok(out)
        })
    }

    fn status_of<'a>(
        &'a self,
        pool: &'a PgPool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<i16>, Error>> {
        Box::pin(async move {
            let sql = format!("SELECT status FROM {} WHERE id = $1", self.table.records);
            sqlx::query_scalar(&sql)
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(|e| pg_error("outbox.list", e))
        })
    }

    fn purge_delivered<'a>(
        &'a self,
        pool: &'a PgPool,
        older_than: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let sql = format!(
                "DELETE FROM {} WHERE status = {DELIVERED} \
                 AND delivered_at < now() - $1 * interval '1 millisecond'",
                self.table.records
            );
            let done = sqlx::query(&sql)
                .bind(ms(older_than))
                .execute(pool)
                .await
                .map_err(|e| pg_error("outbox.purge", e))?;
            Ok(done.rows_affected())
        })
    }

    fn next_due<'a>(&'a self, pool: &'a PgPool) -> BoxFuture<'a, Result<Option<Duration>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT greatest(0, extract(epoch FROM min(next_attempt_at) - now()) * 1000)::bigint \
                 FROM {} WHERE status = {PENDING}",
                self.table.records
            );
            let ms: Option<i64> = sqlx::query_scalar(&sql)
                .fetch_one(pool)
                .await
                .map_err(|e| pg_error("outbox.relay", e))?;
            Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
        })
    }

    fn before_round<'a>(&'a self, _: &'a mut PgConnection) -> BoxFuture<'a, Result<(), Error>> {
        // READ COMMITTED, PostgreSQL's default, is what the round needs.
        Box::pin(async { Ok(()) })
    }

    fn heads<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        batch: i64,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, Error>> {
        Box::pin(async move {
            let t = &self.table.records;
            // The heads of the keys: a pending message with no older pending message of its key.
            let select = format!(
                "SELECT id, topic, ordering_key, payload, headers::text, attempts FROM {t} o \
                 WHERE status = {PENDING} AND next_attempt_at <= now() \
                 AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.status = {PENDING} \
                                 AND p.ordering_key = o.ordering_key AND p.seq < o.seq) \
                 ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED"
            );
            let rows = sqlx::query(&select)
                .bind(batch)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| pg_error("outbox.relay", e))?;
            let db = |e| pg_error("outbox.relay", e);
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let attempts: i32 = row.try_get(5).map_err(db)?;
                out.push(Delivery::from_row(
                    row.try_get(0).map_err(db)?,
                    row.try_get(1).map_err(db)?,
                    row.try_get(2).map_err(db)?,
                    row.try_get(3).map_err(db)?,
                    &row.try_get::<String, _>(4).map_err(db)?,
                    attempts,
                ));
            }
            Ok(out)
        })
    }

    fn delivered<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {} SET status = {DELIVERED}, attempts = attempts + 1, \
                 delivered_at = now(), last_error = NULL WHERE id = $1",
                self.table.records
            );
            sqlx::query(&sql)
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(|e| pg_error("outbox.relay", e))?;
            Ok(())
        })
    }

    fn failed<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        id: &'a str,
        error: String,
        dead: bool,
        wait: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {} SET attempts = attempts + 1, last_error = $2, \
                 status = CASE WHEN $3 THEN {DEAD} ELSE status END, \
                 next_attempt_at = now() + $4 * interval '1 millisecond' WHERE id = $1",
                self.table.records
            );
            sqlx::query(&sql)
                .bind(id)
                .bind(error)
                .bind(dead)
                .bind(ms(wait))
                .execute(&mut *conn)
                .await
                .map_err(|e| pg_error("outbox.relay", e))?;
            Ok(())
        })
    }

    fn listen(&self, pool: PgPool, wake: Arc<Notify>) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(listen(pool, self.table.channel.clone(), wake)))
    }
}

/// Wakes the relay on every enqueue's NOTIFY; reconnects when the connection is lost (and
/// wakes the relay then, for what it may have missed).
async fn listen(pool: PgPool, channel: String, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "idem outbox: listener cannot connect; relay polls");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, "idem outbox: LISTEN failed; relay polls");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) | Ok(None) => wake.notify_one(),
                Err(e) => {
                    tracing::debug!(error = %e, "idem outbox: listener lost; reconnecting");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
