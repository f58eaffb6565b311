//! The schema: table names (validated identifiers, always quoted) and versioned migrations.
//!
//! Migrations are plain SQL kept in this file, applied in order and recorded in a version table
//! of our own, `<table>_migrations`. MySQL commits DDL implicitly, so migrations cannot share a
//! transaction: they run under a named lock (`GET_LOCK`, held by the session, derived from the
//! database and table names), so that processes opening the same database at the same time
//! never race on DDL. Each migration is idempotent (`IF NOT EXISTS`), so a process that died
//! between a migration and its version row only repeats a no-op.

use super::{my_error, BACKEND};
use crate::error::{Error, StoreErrorKind};
use crate::store::BoxFuture;
use sqlx::MySqlConnection;

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: i32 = 3;

/// Longest accepted table name part: the derived `<table>_migrations` must stay under MySQL's
/// 64-character identifier limit.
const MAX_PART: usize = 48;

/// How long a migration waits for another process's migration (`GET_LOCK` timeout, seconds).
const LOCK_WAIT_SECS: i32 = 60;

/// The name of a table's migration lock (parameters: the database or NULL, the table). Lock
/// names are limited to 64 characters: a digest of the database and table names.
const LOCK_NAME: &str = "CONCAT('idem_migrate:', \
     LEFT(SHA2(CONCAT(COALESCE(?, DATABASE(), ''), '.', ?), 256), 40))";

/// One schema migration.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The version this migration brings the schema to.
    pub version: i32,
    /// What it does.
    pub description: &'static str,
    /// The SQL, with the table names filled in.
    pub sql: String,
}

/// A validated table name and the names derived from it, each already quoted.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// As the user gave it (`idem_records`, `app.idem_records`).
    pub(crate) display: String,
    /// `` `app`.`idem_records` `` or `` `idem_records` ``.
    pub(crate) records: String,
    /// The version table.
    pub(crate) migrations: String,
    /// The expiry index (indexes are named within their table).
    pub(crate) expires_idx: String,
    /// The index on `keep_until` (what the purge reads).
    pub(crate) keep_idx: String,
    /// The database given in the name, if any (else the connection's).
    pub(crate) schema: Option<String>,
    /// The table part of the name, unquoted.
    pub(crate) name: String,
}

fn valid_part(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && part.len() <= MAX_PART
}

impl Table {
    /// Validates `name` (`table` or `database.table`, each part `[A-Za-z_][A-Za-z0-9_]*`, at
    /// most 48 bytes). Anything else is `Error::Config`: a name is never interpolated unchecked.
    pub(crate) fn parse(name: &str) -> Result<Table, Error> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok = matches!(parts.len(), 1 | 2) && parts.iter().all(|p| valid_part(p));
        if !ok {
            return Err(Error::Config(format!(
                "invalid MySQL table name {name:?} for idem: use letters, digits and \
                 underscores (not starting with a digit, at most {MAX_PART} bytes), optionally \
                 qualified by a database as `database.table`"
            )));
        }
        let (schema, table) = match parts[..] {
            [t] => (None, t),
            [s, t] => (Some(s), t),
            _ => unreachable!("checked above"),
        };
        let q = |t: &str| match schema {
            Some(s) => format!("`{s}`.`{t}`"),
            None => format!("`{t}`"),
        };
        Ok(Table {
            display: name.to_string(),
            records: q(table),
            migrations: q(&format!("{table}_migrations")),
            expires_idx: format!("`{table}_expires_idx`"),
            keep_idx: format!("`{table}_keep_idx`"),
            schema: schema.map(str::to_string),
            name: table.to_string(),
        })
    }
}

/// Every migration, in order, for `table`.
pub(crate) fn migrations(t: &Table) -> Vec<Migration> {
    vec![
        Migration {
            version: 1,
            description: "idempotency records, with an index on expires_at for the reaper",
            // Digests are fixed-size binary strings; the name keeps its bytes as given
            // (`utf8mb4_bin`: operators' filters compare it exactly, as on the other stores).
            sql: format!(
                "CREATE TABLE IF NOT EXISTS {records} (\n\
             \x20   `key`         BINARY(32) NOT NULL,\n\
             \x20   `name`        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20   `fingerprint` BINARY(32) NOT NULL,\n\
             \x20   `token`       BIGINT     NOT NULL,\n\
             \x20   `status`      TINYINT    NOT NULL,\n\
             \x20   `value`       LONGBLOB,\n\
             \x20   `created_at`  BIGINT     NOT NULL,\n\
             \x20   `expires_at`  BIGINT     NOT NULL,\n\
             \x20   PRIMARY KEY (`key`),\n\
             \x20   KEY {idx} (`expires_at`)\n\
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
                records = t.records,
                idx = t.expires_idx,
            ),
        },
        Migration {
            version: 2,
            description: "abandoned attempts: attempt numbers, keep_until, released and parked",
            // Before this version an in-progress row whose lease had ended meant a free key (a
            // release ended it so): it becomes released, not abandoned, or the first claim after
            // the upgrade would take over attempts nobody abandoned. The purge goes by
            // `keep_until` from now on: its index replaces the one on `expires_at`. One ALTER
            // (atomic); run again after a crash before its version row, it finds its columns and
            // goes on (`run_ddl`), and the UPDATE is idempotent.
            sql: format!(
                "ALTER TABLE {records} ADD COLUMN `attempt` INT NOT NULL DEFAULT 1, \
             ADD COLUMN `keep_until` BIGINT NOT NULL DEFAULT 0, \
             ADD KEY {keep_idx} (`keep_until`), DROP KEY {idx};\n\
             UPDATE {records} SET `keep_until` = GREATEST(`keep_until`, `expires_at`), \
             `status` = IF(`status` = 0 AND `expires_at` <= {clock}, 2, `status`)",
                records = t.records,
                idx = t.expires_idx,
                keep_idx = t.keep_idx,
                clock = super::statements::CLOCK,
            ),
        },
        Migration {
            version: 3,
            description: "resumable calls: the index a resumer reads abandoned calls from",
            // No partial indexes on MySQL or MariaDB: in-progress rows by name in lease order
            // (the name's first 191 characters: it is a TEXT column),
            // which a resumer reads from the lapsed end. Run again after a crash before its
            // version row, it finds the index and goes on (`run_ddl`).
            sql: format!(
                "ALTER TABLE {records} ADD KEY {resume_idx} (`status`, `name`(191), `expires_at`)",
                records = t.records,
                resume_idx = t.keep_idx.replace("_keep_idx", "_resume_idx"),
            ),
        },
    ]
}

fn store_err(op: &'static str, e: sqlx::Error) -> Error {
    my_error(op, e)
}

/// The schema version recorded for `t`, 0 when there is no version table.
pub(crate) fn current_version<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
) -> BoxFuture<'a, Result<i32, Error>> {
    Box::pin(async move {
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
        )
        .bind(t.schema.as_deref())
        .bind(format!("{}_migrations", t.name))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| store_err("migrate", e))?;
        if exists == 0 {
            return Ok(0);
        }
        let sql = format!(
            "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM {}",
            t.migrations
        );
        let v: i64 = sqlx::query_scalar(&sql)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_err("migrate", e))?;
        Ok(i32::try_from(v).unwrap_or(i32::MAX))
    })
}

fn newer(t: &Table, version: i32, latest: i32) -> Error {
    Error::store_kind(
        BACKEND,
        "open",
        StoreErrorKind::SchemaNewer,
        format!(
            "the idem table {} is at schema version {version}, newer than this version of idem \
             understands ({latest}); it was upgraded by a newer release: upgrade idem, \
             or point this deployment at another table",
            t.display
        ),
    )
}

/// Checks the schema of `t` and, when `apply`, brings it up to `up_to`. Refuses a schema newer
/// than the code. Returns the version found before any change.
pub(crate) fn ensure<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
    apply: bool,
    up_to: i32,
) -> BoxFuture<'a, Result<i32, Error>> {
    ensure_with(conn, t, apply, up_to, migrations(t))
}

/// [`ensure`] for any list of versioned migrations of a table of ours (the records table's, or
/// an integration's such as the outbox's): the same version table, lock and error messages.
/// `list` is in order; its last version is what the code writes and reads.
pub(crate) fn ensure_with<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
    apply: bool,
    up_to: i32,
    list: Vec<Migration>,
) -> BoxFuture<'a, Result<i32, Error>> {
    Box::pin(async move {
        let latest = list.last().map_or(0, |m| m.version);
        let found = current_version(conn, t).await?;
        if found > latest {
            return Err(newer(t, found, latest));
        }
        if found >= up_to {
            return Ok(found);
        }
        if !apply {
            let (kind, what) = if found == 0 {
                (
                    StoreErrorKind::SchemaMissing,
                    format!("the MySQL database has no idem table {}", t.display),
                )
            } else {
                (
                    StoreErrorKind::SchemaOutdated,
                    format!(
                        "the idem table {} is at schema version {found}, this version of idem \
                         needs {latest}",
                        t.display
                    ),
                )
            };
            return Err(Error::store_kind(
                BACKEND,
                "open",
                kind,
                format!(
                    "{what}: run the migrations (`MysqlOptions::migrate`, or the SQL of \
                     `MysqlStore::migrations`), or open with `migrate_on_open(true)`"
                ),
            ));
        }
        lock(conn, t).await?;
        let applied = apply_locked(conn, t, up_to, list, latest).await;
        // A session's named lock ends with the session too; released here so that a pooled
        // connection does not keep it.
        let released = sqlx::query(&format!("SELECT RELEASE_LOCK({LOCK_NAME})"))
            .bind(t.schema.as_deref())
            .bind(&t.name)
            .execute(&mut *conn)
            .await;
        applied?;
        released.map_err(|e| store_err("migrate", e))?;
        Ok(found)
    })
}

/// Takes the migration lock of `t`, waiting up to [`LOCK_WAIT_SECS`] for another process.
fn lock<'a>(conn: &'a mut MySqlConnection, t: &'a Table) -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async move {
        let got: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({LOCK_NAME}, ?)"))
            .bind(t.schema.as_deref())
            .bind(&t.name)
            .bind(LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_err("migrate", e))?;
        if got != Some(1) {
            return Err(Error::store_kind(
                BACKEND,
                "migrate",
                StoreErrorKind::Busy,
                format!(
                    "another process held the migration lock of the idem table {} for more \
                     than {LOCK_WAIT_SECS} s",
                    t.display
                ),
            ));
        }
        Ok(())
    })
}

fn apply_locked<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
    up_to: i32,
    list: Vec<Migration>,
    latest: i32,
) -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async move {
        let create_versions = format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20   version     INT          NOT NULL PRIMARY KEY,\n\
             \x20   description VARCHAR(255) NOT NULL,\n\
             \x20   applied_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)\n\
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            t.migrations
        );
        run_ddl(conn, t, &create_versions).await?;
        // Under the lock: what another process may have applied meanwhile.
        let now = current_version(conn, t).await?;
        if now > latest {
            return Err(newer(t, now, latest));
        }
        for m in list
            .into_iter()
            .filter(|m| m.version > now && m.version <= up_to)
        {
            run_ddl(conn, t, &m.sql).await?;
            let record = format!(
                "INSERT INTO {} (version, description) VALUES (?, ?)",
                t.migrations
            );
            sqlx::query(&record)
                .bind(m.version)
                .bind(m.description)
                .execute(&mut *conn)
                .await
                .map_err(|e| store_err("migrate", e))?;
            tracing::info!(table = %t.display, version = m.version, "idem: applied MySQL migration");
        }
        Ok(())
    })
}

/// Runs DDL, turning a missing privilege into an error that names it.
fn run_ddl<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
    sql: &'a str,
) -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async move {
        for stmt in sql.split(";\n") {
            run_one(conn, t, stmt).await?;
        }
        Ok(())
    })
}

/// One statement of [`run_ddl`]. A column or index that exists already (ER_DUP_FIELDNAME,
/// ER_DUP_KEYNAME, and ER_CANT_DROP_FIELD_OR_KEY for one dropped) means that the migration ran
/// this ALTER before it could record its version: MySQL commits DDL at once.
fn run_one<'a>(
    conn: &'a mut MySqlConnection,
    t: &'a Table,
    sql: &'a str,
) -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async move {
        match sqlx::Executor::execute(&mut *conn, sql).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db))
                if sql.starts_with("ALTER TABLE")
                    && matches!(super::error_number(&*db), 1060 | 1061 | 1091) =>
            {
                Ok(())
            }
            // ER_TABLEACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
            Err(sqlx::Error::Database(db)) if matches!(super::error_number(&*db), 1142 | 1044) => {
                Err(Error::store_kind(
                    BACKEND,
                    "migrate",
                    StoreErrorKind::Permission,
                    format!(
                        "cannot create the idem table {}: {} (the connecting user lacks the \
                         CREATE privilege on its database). Grant it (`GRANT CREATE ON db.* \
                         TO ...`), or let a privileged user create the schema first with \
                         `MysqlStore::migrate` or the SQL of `MysqlStore::migrations` (see \
                         docs/mysql.md)",
                        t.display,
                        db.message()
                    ),
                ))
            }
            Err(e) => Err(store_err("migrate", e)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_quoted() {
        let t = Table::parse("idem_records").unwrap();
        assert_eq!(t.records, "`idem_records`");
        assert_eq!(t.migrations, "`idem_records_migrations`");
        let t = Table::parse("app.Keys2").unwrap();
        assert_eq!(t.records, "`app`.`Keys2`");
        assert_eq!(t.schema.as_deref(), Some("app"));
        for bad in [
            "",
            "a;drop table x",
            "a`b",
            "a'b",
            "1abc",
            "a.b.c",
            "a.",
            ".a",
            "a b",
            "ä",
            &"x".repeat(49),
        ] {
            assert!(
                matches!(Table::parse(bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }
}
