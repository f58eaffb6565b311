//! The outbox on MySQL 8 / MariaDB 10.6+: its statements ([`MyDialect`]) and the constructors
//! of `Outbox<MySql>`.
//!
//! What differs from PostgreSQL (docs/outbox.md, "MySQL and MariaDB"):
//!
//! * **No notifications**: relays poll (`RelayOptions::poll`), and wake early only when a
//!   retry falls due.
//! * **Times** are the server's milliseconds since the epoch (`BIGINT`, the MySQL store's
//!   clock), never a session's time zone.
//! * **The enqueue** is `INSERT … ON DUPLICATE KEY UPDATE` whose `LAST_INSERT_ID(0)` makes the
//!   OK packet's insert id 0 for a message already there (the affected-row count cannot tell:
//!   sqlx connects with `CLIENT_FOUND_ROWS`). Not `INSERT IGNORE`, which would also turn a
//!   too-long value into a silent truncation. Outside a call and without an id, the id is the
//!   server's `UUID()`, read first.
//! * **A round** runs in READ COMMITTED (`SET TRANSACTION ISOLATION LEVEL` before its
//!   `BEGIN`): under REPEATABLE READ, InnoDB's next-key locks on the scanned range would hold
//!   back producers' inserts while the relay publishes. It takes two statements: a plain read
//!   of the heads (the `NOT EXISTS` test of an older pending message of the key, which no
//!   locking clause reaches), then `SELECT … WHERE seq IN (…) AND status = 0 … FOR UPDATE
//!   SKIP LOCKED` of those, which re-reads each row's latest committed version. A locking read
//!   with the test inside would let the server lock (and so skip) the *older* rows the test
//!   reads, on servers that apply the outer locking clause to subqueries or turn `NOT EXISTS`
//!   into an anti-join.

use super::dialect::{ms, Dialect, OutboxDatabase};
use super::listing::{message_info, ListFilter};
use super::schema::{self, DEAD, DELIVERED, MYSQL_MAX_ID, OUTBOX_SCHEMA_VERSION, PENDING};
use super::{Delivery, Enqueued, Message, MessageInfo, Outbox, OutboxStats, DEFAULT_OUTBOX_TABLE};
use crate::error::{Error, StoreErrorKind};
use crate::store::mysql::schema::{current_version, ensure_with, Table};
use crate::store::mysql::{connect_one, my_error, CLOCK};
use crate::store::{Backend, BoxFuture, Migration, SchemaVersion};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{MySql, MySqlConnection, MySqlPool, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

impl OutboxDatabase for MySql {
    type __Dialect = MyDialect;
}

/// The longest `last_error` kept (bytes, cut at a character boundary): the column is `TEXT`.
const MAX_ERROR: usize = 8000;

/// The outbox's statements on MySQL / MariaDB.
#[derive(Debug)]
pub struct MyDialect {
    table: Table,
    sql_enqueue: String,
}

impl Outbox<MySql> {
    /// The outbox in the default table [`DEFAULT_OUTBOX_TABLE`] of a MySQL or MariaDB `pool`'s
    /// database (feature `outbox-mysql`, or `outbox` with `mysql`). The same API as
    /// [`Outbox::new`] on PostgreSQL; the relays poll (no `NOTIFY` on MySQL).
    pub fn mysql(pool: MySqlPool) -> Outbox<MySql> {
        Outbox::mysql_with_table(pool, DEFAULT_OUTBOX_TABLE)
            .expect("the default table name is valid")
    }

    /// The outbox in `table` (`name` or `database.name`, validated as the MySQL store's table
    /// names are: at most 48 bytes each) of a MySQL pool: `Error::Config` for a name that is
    /// not a plain identifier.
    pub fn mysql_with_table(pool: MySqlPool, table: &str) -> Result<Outbox<MySql>, Error> {
        Outbox::assemble(pool, table)
    }

    /// The SQL of every migration of the MySQL outbox `table`, for a DBA to review and run.
    pub fn mysql_migrations(table: &str) -> Result<Vec<Migration>, Error> {
        Ok(migrations(&Table::parse(table)?))
    }

    /// [`Outbox::connect`] for a `mysql://` URL: a pool of two connections, checked at once,
    /// and the table's schema checked without creating anything (a table never migrated is
    /// [`StoreErrorKind::SchemaMissing`] naming the migration).
    pub async fn connect_mysql(url: &str, table: &str) -> Result<Outbox<MySql>, Error> {
        if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
            return Err(Error::config(
                "Outbox::connect_mysql opens an outbox on MySQL or MariaDB: the URL must start \
                 with mysql:// (mysql://user:password@host:port/database)",
            ));
        }
        let t = Table::parse(table)?;
        let options = MySqlConnectOptions::from_str(url).map_err(|e| {
            Error::config(format!(
                "invalid MySQL URL ({e}); expected mysql://user:password@host:port/database"
            ))
        })?;
        let timeout = Duration::from_secs(10);
        let mut conn = connect_one(&options, timeout).await?;
        let checked = check(&mut conn, &t).await;
        let _ = sqlx::Connection::close(conn).await;
        checked?;
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(timeout)
            .connect_lazy_with(options);
        Outbox::mysql_with_table(pool, table)
    }
}

/// The MySQL migrations as the crate's [`Migration`]s.
fn migrations(t: &Table) -> Vec<Migration> {
    schema::mysql(t)
        .into_iter()
        .map(|m| Migration {
            version: m.version,
            description: m.description,
            sql: m.sql,
        })
        .collect()
}

/// The schema of `t` for an operator's connection: present and not newer than the code.
async fn check(conn: &mut MySqlConnection, t: &Table) -> Result<(), Error> {
    match current_version(conn, t).await? {
        0 => Err(Error::store_kind(
            Backend::Mysql,
            "outbox.connect",
            StoreErrorKind::SchemaMissing,
            format!(
                "the MySQL database has no outbox table {}: it is created by outbox migration \
                 1 (\"outbox messages\"), which `Outbox::migrate()` runs (or `idem outbox \
                 migrate`; the SQL: `Outbox::mysql_migrations(\"{}\")`)",
                t.display, t.display
            ),
        )),
        _ => ensure_with(conn, t, false, OUTBOX_SCHEMA_VERSION, schema::mysql(t))
            .await
            .map(drop),
    }
}

/// `Error::Config` when `value` does not fit its `VARCHAR(255)` column.
fn fits(what: &str, value: &str) -> Result<(), Error> {
    if value.chars().count() > MYSQL_MAX_ID {
        return Err(Error::config(format!(
            "outbox: a message's {what} is at most {MYSQL_MAX_ID} characters on MySQL \
             (this one has {})",
            value.chars().count()
        )));
    }
    Ok(())
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncated(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn db(op: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| my_error(op, e)
}

/// Text column `i` of `row`, read as bytes: sqlx refuses a `_bin` collated column as a
/// `String` (as the MySQL store reads its `name`). Not UTF-8 is `Corrupt`.
fn text(row: &MySqlRow, i: usize, op: &'static str) -> Result<String, Error> {
    opt_text(row, i, op)?.ok_or_else(|| my_error(op, sqlx::Error::ColumnNotFound(i.to_string())))
}

/// A nullable text column (see [`text`]).
fn opt_text(row: &MySqlRow, i: usize, op: &'static str) -> Result<Option<String>, Error> {
    let bytes: Option<Vec<u8>> = row.try_get(i).map_err(db(op))?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| {
                Error::store_kind(
                    Backend::Mysql,
                    op,
                    StoreErrorKind::Corrupt,
                    format!("outbox column {i} is not UTF-8"),
                )
            })
        })
        .transpose()
}

impl Dialect for MyDialect {
    type Db = MySql;

    fn parse(table: &str) -> Result<Self, Error> {
        let table = Table::parse(table)?;
        // `id = id` changes nothing; `LAST_INSERT_ID(0)` makes the insert id 0 when the
        // message was already there (an insert's is its new `seq`, never 0).
        let sql_enqueue = format!(
            "INSERT INTO {t} (`id`, `topic`, `ordering_key`, `payload`, `headers`, `status`, \
             `attempts`, `next_attempt_at`, `created_at`) \
             VALUES (?, ?, ?, ?, ?, {PENDING}, 0, {CLOCK}, {CLOCK}) \
             ON DUPLICATE KEY UPDATE `id` = IF(LAST_INSERT_ID(0) = 0, `id`, `id`)",
            t = table.records
        );
        Ok(MyDialect { table, sql_enqueue })
    }

    fn display(&self) -> &str {
        &self.table.display
    }

    fn error(op: &'static str, e: sqlx::Error) -> Error {
        my_error(op, e)
    }

    fn migrations(&self) -> Vec<Migration> {
        migrations(&self.table)
    }

    fn ensure<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        apply: bool,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
        ensure_with(
            conn,
            &self.table,
            apply,
            OUTBOX_SCHEMA_VERSION,
            schema::mysql(&self.table),
        )
    }

    fn schema_version<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
    ) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
        current_version(conn, &self.table)
    }

    fn enqueue<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        id: Option<String>,
        message: &'a Message,
        headers: String,
    ) -> BoxFuture<'a, Result<Enqueued, Error>> {
        Box::pin(async move {
            fits("ordering key", &message.ordering_key)?;
            let id = match id {
                Some(id) => {
                    fits("id", &id)?;
                    id
                }
                None => sqlx::query_scalar("SELECT UUID()")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db("outbox.enqueue"))?,
            };
            let done = sqlx::query(&self.sql_enqueue)
                .bind(&id)
                .bind(&message.topic)
                .bind(&message.ordering_key)
                .bind(&message.payload)
                .bind(headers)
                .execute(&mut *conn)
                .await
                .map_err(db("outbox.enqueue"))?;
            Ok(Enqueued {
                id,
                new: done.last_insert_id() != 0,
            })
        })
    }

    fn stats<'a>(&'a self, pool: &'a MySqlPool) -> BoxFuture<'a, Result<OutboxStats, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT CAST(COALESCE(SUM(`status` = {PENDING}), 0) AS SIGNED), \
                        CAST(COALESCE(SUM(`status` = {DELIVERED}), 0) AS SIGNED), \
                        CAST(COALESCE(SUM(`status` = {DEAD}), 0) AS SIGNED), \
                        CAST({CLOCK} - MIN(CASE WHEN `status` = {PENDING} THEN `created_at` END) \
                             AS SIGNED) \
                 FROM {t}",
                t = self.table.records
            );
            let row: (i64, i64, i64, Option<i64>) = sqlx::query_as(&sql)
                .fetch_one(pool)
                .await
                .map_err(db("outbox.stats"))?;
            Ok(OutboxStats::from_counts(row))
        })
    }

    fn retry_dead<'a>(
        &'a self,
        pool: &'a MySqlPool,
        id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {t} SET `status` = {PENDING}, `attempts` = 0, `next_attempt_at` = {CLOCK}, \
                 `last_error` = NULL WHERE `status` = {DEAD} AND (? IS NULL OR `id` = ?)",
                t = self.table.records,
            );
            let done = sqlx::query(&sql)
                .bind(id)
                .bind(id)
                .execute(pool)
                .await
                .map_err(db("outbox.retry"))?;
            Ok(done.rows_affected())
        })
    }

    fn list<'a>(
        &'a self,
        pool: &'a MySqlPool,
        filter: &'a ListFilter,
    ) -> BoxFuture<'a, Result<Vec<MessageInfo>, Error>> {
        Box::pin(async move {
            // The codes are ours (constants), never the caller's text.
            let states = filter
                .codes()
                .iter()
                .map(i16::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT `id`, `topic`, `ordering_key`, `status`, `attempts`, \
                        CAST({CLOCK} - `created_at` AS SIGNED), \
                        CAST(`next_attempt_at` - {CLOCK} AS SIGNED), \
                        `last_error`, CAST(LENGTH(`payload`) AS SIGNED) \
                 FROM {t} WHERE `status` IN ({states}) \
                 AND (? IS NULL OR `topic` = ?) AND (? IS NULL OR `ordering_key` = ?) \
                 ORDER BY `seq` LIMIT ?",
                t = self.table.records
            );
            let rows = sqlx::query(&sql)
                .bind(filter.topic.as_deref())
                .bind(filter.topic.as_deref())
                .bind(filter.ordering_key.as_deref())
                .bind(filter.ordering_key.as_deref())
                .bind(filter.limit)
                .fetch_all(pool)
                .await
                .map_err(db("outbox.list"))?;
            let db = db("outbox.list");
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(message_info(
                    Backend::Mysql,
                    text(&row, 0, "outbox.list")?,
                    text(&row, 1, "outbox.list")?,
                    text(&row, 2, "outbox.list")?,
                    row.try_get(3).map_err(&db)?,
                    row.try_get(4).map_err(&db)?,
                    row.try_get(5).map_err(&db)?,
                    row.try_get(6).map_err(&db)?,
                    opt_text(&row, 7, "outbox.list")?,
                    row.try_get(8).map_err(&db)?,
                )?);
            }
            Ok(out)
        })
    }

    fn status_of<'a>(
        &'a self,
        pool: &'a MySqlPool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<i16>, Error>> {
        Box::pin(async move {
            let sql = format!("SELECT `status` FROM {} WHERE `id` = ?", self.table.records);
            sqlx::query_scalar(&sql)
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(db("outbox.list"))
        })
    }

    fn purge_delivered<'a>(
        &'a self,
        pool: &'a MySqlPool,
        older_than: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move {
            let sql = format!(
                "DELETE FROM {} WHERE `status` = {DELIVERED} AND `delivered_at` < {CLOCK} - ?",
                self.table.records
            );
            let done = sqlx::query(&sql)
                .bind(ms(older_than))
                .execute(pool)
                .await
                .map_err(db("outbox.purge"))?;
            Ok(done.rows_affected())
        })
    }

    fn next_due<'a>(
        &'a self,
        pool: &'a MySqlPool,
    ) -> BoxFuture<'a, Result<Option<Duration>, Error>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT CAST(GREATEST(0, MIN(`next_attempt_at`) - {CLOCK}) AS SIGNED) \
                 FROM {} WHERE `status` = {PENDING}",
                self.table.records
            );
            let ms: Option<i64> = sqlx::query_scalar(&sql)
                .fetch_one(pool)
                .await
                .map_err(db("outbox.relay"))?;
            Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
        })
    }

    fn before_round<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            // The next transaction only (no SESSION): the pool's connection is left as it was.
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await
                .map_err(db("outbox.relay"))?;
            Ok(())
        })
    }

    fn heads<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        batch: i64,
    ) -> BoxFuture<'a, Result<Vec<Delivery>, Error>> {
        Box::pin(async move {
            let t = &self.table.records;
            // 1. The heads of the keys as of now, without locks: a due pending message with no
            //    older pending message of its key. Twice the batch, so that a relay finds heads
            //    beyond those another relay holds.
            let candidates = format!(
                "SELECT o.`seq` FROM {t} o \
                 WHERE o.`status` = {PENDING} AND o.`next_attempt_at` <= {CLOCK} \
                 AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.`status` = {PENDING} \
                                 AND p.`ordering_key` = o.`ordering_key` AND p.`seq` < o.`seq`) \
                 ORDER BY o.`seq` LIMIT ?"
            );
            let seqs: Vec<i64> = sqlx::query_scalar(&candidates)
                .bind(batch.saturating_mul(2))
                .fetch_all(&mut *conn)
                .await
                .map_err(db("outbox.relay"))?;
            if seqs.is_empty() {
                return Ok(Vec::new());
            }
            // 2. Lock those still pending (the latest committed version of each row), skipping
            //    the rows another relay holds.
            let marks = vec!["?"; seqs.len()].join(", ");
            let lock = format!(
                "SELECT `id`, `topic`, `ordering_key`, `payload`, `headers`, `attempts` \
                 FROM {t} WHERE `seq` IN ({marks}) AND `status` = {PENDING} \
                 ORDER BY `seq` LIMIT ? FOR UPDATE SKIP LOCKED"
            );
            let mut query = sqlx::query(&lock);
            for seq in &seqs {
                query = query.bind(*seq);
            }
            let rows = query
                .bind(batch)
                .fetch_all(&mut *conn)
                .await
                .map_err(db("outbox.relay"))?;
            let db = db("outbox.relay");
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let attempts: i32 = row.try_get(5).map_err(&db)?;
                out.push(Delivery::from_row(
                    text(&row, 0, "outbox.relay")?,
                    text(&row, 1, "outbox.relay")?,
                    text(&row, 2, "outbox.relay")?,
                    row.try_get(3).map_err(&db)?,
                    &text(&row, 4, "outbox.relay")?,
                    attempts,
                ));
            }
            Ok(out)
        })
    }

    fn delivered<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        id: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {} SET `status` = {DELIVERED}, `attempts` = `attempts` + 1, \
                 `delivered_at` = {CLOCK}, `last_error` = NULL WHERE `id` = ?",
                self.table.records
            );
            sqlx::query(&sql)
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(db("outbox.relay"))?;
            Ok(())
        })
    }

    fn failed<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        id: &'a str,
        error: String,
        dead: bool,
        wait: Duration,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let sql = format!(
                "UPDATE {} SET `attempts` = `attempts` + 1, `last_error` = ?, \
                 `status` = IF(?, {DEAD}, `status`), `next_attempt_at` = {CLOCK} + ? \
                 WHERE `id` = ?",
                self.table.records
            );
            sqlx::query(&sql)
                .bind(truncated(error, MAX_ERROR))
                .bind(dead)
                .bind(ms(wait))
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(db("outbox.relay"))?;
            Ok(())
        })
    }

    fn listen(&self, _: MySqlPool, _: Arc<Notify>) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_refused_and_errors_cut() {
        assert!(fits("id", &"x".repeat(255)).is_ok());
        assert!(matches!(
            fits("id", &"é".repeat(256)),
            Err(Error::Config(_))
        ));
        assert_eq!(truncated("ééé".into(), 3), "é");
        assert_eq!(truncated("abc".into(), 8), "abc");
    }
}
