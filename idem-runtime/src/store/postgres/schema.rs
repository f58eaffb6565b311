//! The schema: table names (validated identifiers, always quoted) and versioned migrations.
//!
//! Migrations are plain SQL kept in this file, applied in order and recorded in a version table
//! of our own, `<table>_migrations`. They run in one transaction under a transaction-scoped
//! advisory lock derived from the table name, so processes that open the same database at the
//! same time never race on DDL: the first applies what is missing, the others wait for it and
//! then find the schema current.

use super::BACKEND;
use crate::error::{Error, StoreErrorKind};
use crate::store::{BoxFuture, Migration, SchemaVersion};
use sqlx::{Connection, PgConnection, Row};

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: SchemaVersion = 5;

/// The advisory lock class for idem migrations (the object id is `hashtext(table)`).
const LOCK_CLASS: i32 = 0x1de3;

/// Longest accepted table name part: derived names (`<table>_migrations`, `<table>_expires_idx`)
/// must stay under PostgreSQL's 63-byte identifier limit.
const MAX_PART: usize = 48;

/// A validated table name and the names derived from it, each already quoted.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// As the user gave it (`idem_records`, `app.idem_records`).
    pub(crate) display: String,
    /// `"app"."idem_records"` or `"idem_records"`.
    pub(crate) records: String,
    /// The version table.
    pub(crate) migrations: String,
    /// The expiry index, unqualified (indexes live in their table's schema).
    pub(crate) expires_idx: String,
    /// The index on `keep_until` (what the purge reads), unqualified.
    pub(crate) keep_idx: String,
    /// The NOTIFY channel (a plain string, passed to `pg_notify` as a bound parameter).
    pub(crate) channel: String,
    /// The channel operators' releases are announced on (`Store::releases`).
    pub(crate) released_channel: String,
    /// The schema given in the name, if any.
    pub(crate) schema: Option<String>,
}

fn valid_part(part: &str) -> bool {
    let mut chars = part.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && part.len() <= MAX_PART
}

impl Table {
    /// Validates `name` (`table` or `schema.table`, each part `[A-Za-z_][A-Za-z0-9_]*`, at most
    /// 48 bytes). Anything else is `Error::Config`: a name is never interpolated unchecked.
    pub(crate) fn parse(name: &str) -> Result<Table, Error> {
        let parts: Vec<&str> = name.split('.').collect();
        let ok = matches!(parts.len(), 1 | 2) && parts.iter().all(|p| valid_part(p));
        if !ok {
            return Err(Error::config(format!(
                "invalid PostgreSQL table name {name:?} for idem: use letters, digits and \
                 underscores (not starting with a digit, at most {MAX_PART} bytes), optionally \
                 qualified by a schema as `schema.table`"
            )));
        }
        let (schema, table) = match parts[..] {
            [t] => (None, t),
            [s, t] => (Some(s), t),
            _ => unreachable!("checked above"),
        };
        let q = |t: &str| match schema {
            Some(s) => format!("\"{s}\".\"{t}\""),
            None => format!("\"{t}\""),
        };
        Ok(Table {
            display: name.to_string(),
            records: q(table),
            migrations: q(&format!("{table}_migrations")),
            expires_idx: format!("\"{table}_expires_idx\""),
            keep_idx: format!("\"{table}_keep_idx\""),
            channel: format!("idem_{table}"),
            released_channel: format!("idem_{table}_released"),
            schema: schema.map(str::to_string),
        })
    }
}

/// Every migration, in order, for `table`.
pub(crate) fn migrations(t: &Table) -> Vec<Migration> {
    vec![
        Migration {
            version: 1,
            description: "idempotency records",
            sql: format!(
                "CREATE TABLE IF NOT EXISTS {records} (\n\
                 \x20   key         bytea    PRIMARY KEY CHECK (octet_length(key) = 32),\n\
                 \x20   name        text     NOT NULL,\n\
                 \x20   fingerprint bytea    NOT NULL,\n\
                 \x20   token       bigint   NOT NULL,\n\
                 \x20   status      smallint NOT NULL,\n\
                 \x20   value       bytea,\n\
                 \x20   created_at  bigint   NOT NULL,\n\
                 \x20   expires_at  bigint   NOT NULL\n\
                 )",
                records = t.records
            ),
        },
        Migration {
            version: 2,
            description: "index on expires_at for the reaper",
            sql: format!(
                "CREATE INDEX IF NOT EXISTS {idx} ON {records} (expires_at)",
                idx = t.expires_idx,
                records = t.records
            ),
        },
        Migration {
            version: 3,
            description: "waiters flag: completions notify only keys that someone waits for",
            // A constant default: PostgreSQL 11 and later add the column without rewriting
            // the table.
            sql: format!(
                "ALTER TABLE {records} ADD COLUMN IF NOT EXISTS waiters boolean NOT NULL DEFAULT FALSE",
                records = t.records
            ),
        },
        Migration {
            version: 4,
            description: "abandoned attempts: attempt numbers, keep_until, released and parked",
            // Before this version an in-progress row whose lease had ended meant a free key (a
            // release ended it so): it becomes released, not abandoned, or the first claim
            // after the upgrade would take over attempts nobody abandoned. The purge goes by
            // `keep_until` from now on, through an index of its own; the one on `expires_at`
            // stays for the operators' pages, which list live records in expiry order.
            sql: format!(
                "ALTER TABLE {records} ADD COLUMN IF NOT EXISTS attempt integer NOT NULL DEFAULT 1;\n\
                 ALTER TABLE {records} ADD COLUMN IF NOT EXISTS keep_until bigint NOT NULL DEFAULT 0;\n\
                 UPDATE {records} SET keep_until = expires_at, status = CASE WHEN status = 0 AND \
                 expires_at <= {clock} THEN 2 ELSE status END;\n\
                 CREATE INDEX IF NOT EXISTS {keep_idx} ON {records} (keep_until)",
                records = t.records,
                clock = super::CLOCK,
                keep_idx = t.keep_idx,
            ),
        },
        Migration {
            version: 5,
            description: "resumable calls: the index of in-progress rows that keep arguments",
            // Partial: a resumable call's in-progress row is the only in-progress row with a
            // value, so the index holds the resumable calls in flight and nothing else.
            sql: format!(
                "CREATE INDEX IF NOT EXISTS {resume_idx} ON {records} (name, expires_at) \
                 WHERE status = 0 AND value IS NOT NULL",
                records = t.records,
                resume_idx = t.keep_idx.replace("_keep_idx", "_resume_idx"),
            ),
        },
    ]
}

fn store_err(op: &'static str, e: sqlx::Error) -> Error {
    super::pg_error(op, e)
}

/// The schema version recorded for `t`, 0 when there is no version table.
pub(crate) fn current_version<'a>(
    conn: &'a mut PgConnection,
    t: &'a Table,
) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
    Box::pin(async move {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(&t.migrations)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_err("migrate", e))?;
        if !exists {
            return Ok(0);
        }
        let sql = format!("SELECT coalesce(max(version), 0) FROM {}", t.migrations);
        sqlx::query_scalar(&sql)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_err("migrate", e))
    })
}

fn newer(t: &Table, version: SchemaVersion, latest: SchemaVersion) -> Error {
    Error::store_kind(
        BACKEND,
        "open",
        StoreErrorKind::SchemaNewer,
        format!(
            "the idem table {} is at schema version {version}, newer than this version of idem \
         understands ({latest}); it was upgraded by a newer release: upgrade idem, or \
         point this deployment at another table",
            t.display
        ),
    )
}

/// Checks the schema of `t` and, when `apply`, brings it up to [`SCHEMA_VERSION`]. Refuses a
/// schema newer than the code. Returns the version found before any change.
pub(crate) fn ensure<'a>(
    conn: &'a mut PgConnection,
    t: &'a Table,
    apply: bool,
    up_to: SchemaVersion,
) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
    ensure_with(conn, t, apply, up_to, migrations(t))
}

/// [`ensure`] for any list of versioned migrations of a table of ours (the records table's, or
/// an integration's such as the outbox's): the same version table, lock and error messages.
/// `list` is in order; its last version is what the code writes and reads.
pub(crate) fn ensure_with<'a>(
    conn: &'a mut PgConnection,
    t: &'a Table,
    apply: bool,
    up_to: SchemaVersion,
    list: Vec<Migration>,
) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
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
                    format!("the PostgreSQL database has no idem table {}", t.display),
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
                    "{what}: run the migrations (`PostgresOptions::migrate`, or the SQL of \
                     `PostgresStore::migrations`) from a role that may create tables, or open \
                     with `migrate_on_open(true)`"
                ),
            ));
        }
        let who = whoami(conn).await;
        let mut tx = conn.begin().await.map_err(|e| store_err("migrate", e))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(LOCK_CLASS)
            .bind(&t.records)
            .execute(&mut *tx)
            .await
            .map_err(|e| store_err("migrate", e))?;
        let create_versions = format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
         \x20   version     integer     PRIMARY KEY,\n\
         \x20   description text        NOT NULL,\n\
         \x20   applied_at  timestamptz NOT NULL DEFAULT now()\n\
         )",
            t.migrations
        );
        run_ddl(&mut tx, t, who.as_ref(), &create_versions).await?;
        // Under the lock: what another process may have applied meanwhile.
        let now = current_version(&mut tx, t).await?;
        if now > latest {
            return Err(newer(t, now, latest));
        }
        for m in list
            .into_iter()
            .filter(|m| m.version > now && m.version <= up_to)
        {
            run_ddl(&mut tx, t, who.as_ref(), &m.sql).await?;
            let record = format!(
                "INSERT INTO {} (version, description) VALUES ($1, $2)",
                t.migrations
            );
            sqlx::query(&record)
                .bind(m.version)
                .bind(m.description)
                .execute(&mut *tx)
                .await
                .map_err(|e| store_err("migrate", e))?;
            tracing::info!(table = %t.display, version = m.version, "idem: applied PostgreSQL migration");
        }
        tx.commit().await.map_err(|e| store_err("migrate", e))?;
        Ok(found)
    })
}

/// Runs DDL, turning a missing privilege into an error that names it.
fn run_ddl<'a>(
    conn: &'a mut PgConnection,
    t: &'a Table,
    who: Option<&'a (String, String)>,
    sql: &'a str,
) -> BoxFuture<'a, Result<(), Error>> {
    Box::pin(async move {
        match sqlx::Executor::execute(&mut *conn, sql).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42501") => {
                let message = db.message().to_string();
                let (role, schema) = match who {
                    Some((role, current)) => (
                        format!("role \"{role}\""),
                        format!("schema \"{}\"", t.schema.as_deref().unwrap_or(current)),
                    ),
                    None => (
                        "the connecting role".to_string(),
                        "the table's schema".to_string(),
                    ),
                };
                Err(Error::store_kind(
                    BACKEND,
                    "migrate",
                    StoreErrorKind::Permission,
                    format!(
                    "cannot create the idem table {}: {message} (SQLSTATE 42501): {role} lacks \
                     the CREATE privilege on {schema}. Grant it (`GRANT CREATE ON SCHEMA ...`), \
                     or let a privileged role create the schema first with \
                     `PostgresOptions::migrate` or the SQL of `PostgresStore::migrations` \
                     (see docs/postgres.md)",
                    t.display
                ),
                ))
            }
            Err(e) => Err(store_err("migrate", e)),
        }
    })
}

/// Reads who we are and where tables go, for error messages.
pub(crate) fn whoami(conn: &mut PgConnection) -> BoxFuture<'_, Option<(String, String)>> {
    Box::pin(async move {
        let row = sqlx::query("SELECT current_user::text, coalesce(current_schema(), '')::text")
            .fetch_one(conn)
            .await
            .ok()?;
        Some((row.try_get(0).ok()?, row.try_get(1).ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_quoted() {
        let t = Table::parse("idem_records").unwrap();
        assert_eq!(t.records, "\"idem_records\"");
        assert_eq!(t.migrations, "\"idem_records_migrations\"");
        let t = Table::parse("app.Keys2").unwrap();
        assert_eq!(t.records, "\"app\".\"Keys2\"");
        for bad in [
            "",
            "a;drop table x",
            "a\"b",
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
