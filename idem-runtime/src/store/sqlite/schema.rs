//! The SQLite schema: versioned migrations recorded in `<table>_migrations`, as the PostgreSQL
//! store records its own.
//!
//! Files written by idem 0.1 keep working unchanged. Their table is `idem_keys` and their
//! version sits in `<table>_schema`; a store opened with the default table on such a file uses
//! `idem_keys` (renaming it would split the keys between processes of the two versions during a
//! rolling deploy), and its first migration copies the recorded version into
//! `<table>_migrations`, leaving `<table>_schema` for the earlier version's processes.

use super::{err, SqliteStore, BACKEND};
use crate::error::{Error, StoreErrorKind};
use crate::store::{BoxFuture, Migration, SchemaVersion};
use sqlx::SqliteConnection;

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: SchemaVersion = 3;

/// The default table of idem 0.1, kept by the files it wrote.
pub(super) const LEGACY_TABLE: &str = "idem_keys";

/// Every migration, in order, for table `t`.
pub(crate) fn migrations(t: &str) -> Vec<Migration> {
    vec![
        Migration {
            version: 1,
            description: "idempotency records and the expiry index",
            sql: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
             key BLOB PRIMARY KEY NOT NULL, name TEXT NOT NULL, fingerprint BLOB NOT NULL, \
             token INTEGER NOT NULL, status INTEGER NOT NULL, value BLOB, \
             created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID;\n\
             CREATE INDEX IF NOT EXISTS {t}_expires ON {t} (expires_at)"
            ),
        },
        Migration {
            version: 2,
            description: "abandoned attempts: attempt numbers, keep_until, released and parked",
            // Before this version an in-progress row whose lease had ended meant a free key (a
            // release ended it so): it becomes released, not abandoned, or the first claim after
            // the upgrade would take over attempts nobody abandoned. The purge goes by
            // `keep_until` from now on, so its index replaces the one on `expires_at`.
            sql: format!(
                "ALTER TABLE {t} ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;\n\
             ALTER TABLE {t} ADD COLUMN keep_until INTEGER NOT NULL DEFAULT 0;\n\
             UPDATE {t} SET keep_until = expires_at, status = CASE WHEN status = 0 AND \
             expires_at <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) \
             THEN 2 ELSE status END;\n\
             CREATE INDEX IF NOT EXISTS {t}_keep ON {t} (keep_until);\n\
             DROP INDEX IF EXISTS {t}_expires"
            ),
        },
        Migration {
            version: 3,
            description: "resumable calls: the index of in-progress rows that keep arguments",
            // Partial: a resumable call's in-progress row is the only in-progress row with a
            // value, so the index holds the resumable calls in flight and nothing else.
            sql: format!(
                "CREATE INDEX IF NOT EXISTS {t}_resume ON {t} (name, expires_at) \
                 WHERE status = 0 AND value IS NOT NULL"
            ),
        },
    ]
}

// The helpers taking a connection return boxed futures: as plain `async fn`s over
// `&mut SqliteConnection`, the futures of their callers are not provably `Send` (the
// higher-ranked `Executor` bound), and `Idem::sqlite` must be spawnable.

fn table_exists<'a>(
    conn: &'a mut SqliteConnection,
    name: &'a str,
) -> BoxFuture<'a, Result<bool, Error>> {
    Box::pin(async move {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        )
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(err("open"))?;
        Ok(n > 0)
    })
}

fn max_version<'a>(
    conn: &'a mut SqliteConnection,
    table: &'a str,
) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
    Box::pin(async move {
        let v: Option<i64> = sqlx::query_scalar(&format!("SELECT max(version) FROM {table}"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err("open"))?;
        Ok(v.map_or(0, |v| {
            SchemaVersion::try_from(v).unwrap_or(SchemaVersion::MAX)
        }))
    })
}

/// The table a store with the default table uses on this file: `idem_keys` when an earlier
/// idem wrote it and there is no `idem_records`, the default otherwise.
pub(super) fn resolve_default<'a>(
    conn: &'a mut SqliteConnection,
    default: &'a str,
) -> BoxFuture<'a, Result<String, Error>> {
    Box::pin(async move {
        if !table_exists(conn, default).await?
            && table_exists(conn, LEGACY_TABLE).await?
            && table_exists(conn, &format!("{LEGACY_TABLE}_schema")).await?
        {
            return Ok(LEGACY_TABLE.to_string());
        }
        Ok(default.to_string())
    })
}

/// The schema version of table `t`: `<t>_migrations`, else the `<t>_schema` of idem 0.1, else 0
/// (no table). Creates nothing.
fn current_version<'a>(
    conn: &'a mut SqliteConnection,
    t: &'a str,
) -> BoxFuture<'a, Result<SchemaVersion, Error>> {
    Box::pin(async move {
        if !table_exists(conn, t).await? {
            return Ok(0);
        }
        for versions in [format!("{t}_migrations"), format!("{t}_schema")] {
            if table_exists(conn, &versions).await? {
                return max_version(conn, &versions).await;
            }
        }
        Ok(0)
    })
}

fn newer(t: &str, found: SchemaVersion) -> Error {
    Error::store_kind(
        BACKEND,
        "open",
        StoreErrorKind::SchemaNewer,
        format!(
            "the SQLite table `{t}` has schema version {found}, written by a newer idem; this \
             version reads {SCHEMA_VERSION}: upgrade idem"
        ),
    )
}

/// Checks that the schema of the store's table is current, creating nothing.
pub(super) fn check(store: &SqliteStore) -> BoxFuture<'_, Result<(), Error>> {
    Box::pin(async move {
        let mut conn = store.pool.acquire().await.map_err(err("open"))?;
        let found = current_version(&mut conn, &store.table).await?;
        let t = &store.table;
        match found {
            0 => Err(Error::store_kind(
                BACKEND,
                "open",
                StoreErrorKind::SchemaMissing,
                format!(
                    "the SQLite database has no idem table `{t}`: create it by running the \
                 migrations (or open it once with migrate_on_open)"
                ),
            )),
            v if v < SCHEMA_VERSION => Err(Error::store_kind(
                BACKEND,
                "open",
                StoreErrorKind::SchemaOutdated,
                format!(
                    "the SQLite table `{t}` has schema version {v}, this version of idem reads \
                 {SCHEMA_VERSION}: run the migrations"
                ),
            )),
            v if v > SCHEMA_VERSION => Err(newer(t, v)),
            _ => Ok(()),
        }
    })
}

/// Creates or upgrades the schema; returns the version found before (0: none).
pub(super) fn ensure(store: &SqliteStore) -> BoxFuture<'_, Result<SchemaVersion, Error>> {
    Box::pin(async move {
        let t = &store.table;
        // IMMEDIATE: take the write lock up front, waiting `busy_timeout` for it. A deferred
        // transaction that read the schema and then writes fails at once (SQLITE_BUSY, no
        // waiting) when another process migrated in between, as processes starting together do.
        let mut tx = store
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(err("migrate"))?;
        let found = current_version(&mut tx, t).await?;
        if found > SCHEMA_VERSION {
            return Err(newer(t, found));
        }
        let versions = format!("{t}_migrations");
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {versions} (version INTEGER PRIMARY KEY, \
         description TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
        );
        sqlx::query(&ddl)
            .execute(&mut *tx)
            .await
            .map_err(err("migrate"))?;
        let recorded = max_version(&mut tx, &versions).await?;
        let record = format!("INSERT INTO {versions} (version, description) VALUES (?1, ?2)");
        for m in migrations(t) {
            if m.version <= recorded {
                continue;
            }
            if m.version > found {
                // One statement per `query`: a prepared statement holds one.
                for stmt in m.sql.split(";\n") {
                    sqlx::query(stmt)
                        .execute(&mut *tx)
                        .await
                        .map_err(err("migrate"))?;
                }
                tracing::info!(table = %t, version = m.version, "idem: applied SQLite migration");
            }
            // A version idem 0.1 applied is recorded here without running it again.
            sqlx::query(&record)
                .bind(m.version)
                .bind(m.description)
                .execute(&mut *tx)
                .await
                .map_err(err("migrate"))?;
        }
        tx.commit().await.map_err(err("migrate"))?;
        Ok(found)
    })
}
