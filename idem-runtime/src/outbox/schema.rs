//! The outbox table and its versioned migrations, recorded in `<table>_migrations` by the
//! store's migration runner of its database (the same lock, version table and error kinds):
//! one list for PostgreSQL, one for MySQL / MariaDB.

use crate::store::SchemaVersion;

/// The outbox table's default name.
pub const DEFAULT_OUTBOX_TABLE: &str = "idem_outbox";

/// The outbox schema version this code writes and reads.
pub const OUTBOX_SCHEMA_VERSION: SchemaVersion = 1;

/// `status` of a message waiting for (another) delivery attempt.
pub(crate) const PENDING: i16 = 0;
/// `status` of a message the publisher accepted.
pub(crate) const DELIVERED: i16 = 1;
/// `status` of a message that failed `max_attempts` times: kept, no longer tried.
pub(crate) const DEAD: i16 = 2;

/// The longest message id and ordering key the MySQL table holds (`VARCHAR(255)`: both are
/// indexed, and InnoDB bounds an index's key).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_MAX_ID: usize = 255;

/// Every PostgreSQL outbox migration, in order.
#[cfg(feature = "postgres")]
pub(crate) fn postgres(t: &crate::store::postgres::schema::Table) -> Vec<crate::store::Migration> {
    let name = t.display.rsplit('.').next().unwrap_or(&t.display);
    vec![crate::store::Migration {
        version: 1,
        description: "outbox messages",
        // `seq` orders the messages of one ordering key (the order their INSERTs ran in); the
        // partial index serves the relay's "head of each key" query, the second the purge.
        sql: format!(
            "CREATE TABLE IF NOT EXISTS {records} (\n\
             \x20   id              text        PRIMARY KEY,\n\
             \x20   seq             bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,\n\
             \x20   topic           text        NOT NULL,\n\
             \x20   ordering_key    text        NOT NULL,\n\
             \x20   payload         bytea       NOT NULL,\n\
             \x20   headers         jsonb       NOT NULL,\n\
             \x20   status          smallint    NOT NULL DEFAULT 0,\n\
             \x20   attempts        integer     NOT NULL DEFAULT 0,\n\
             \x20   next_attempt_at timestamptz NOT NULL DEFAULT now(),\n\
             \x20   last_error      text,\n\
             \x20   created_at      timestamptz NOT NULL DEFAULT now(),\n\
             \x20   delivered_at    timestamptz\n\
             );\n\
             CREATE INDEX IF NOT EXISTS \"{name}_pending_idx\" ON {records} (ordering_key, seq) WHERE status = 0;\n\
             CREATE INDEX IF NOT EXISTS \"{name}_delivered_idx\" ON {records} (delivered_at) WHERE status = 1",
            records = t.records
        ),
    }]
}

/// Every MySQL / MariaDB outbox migration, in order. No partial indexes there: the indexes
/// lead with `status`. Times are the server's milliseconds since the epoch (`BIGINT`), as in
/// the MySQL store, never a session's time zone.
#[cfg(feature = "mysql")]
pub(crate) fn mysql(t: &crate::store::mysql::schema::Table) -> Vec<crate::store::mysql::Migration> {
    let name = &t.name;
    vec![crate::store::mysql::Migration {
        version: 1,
        description: "outbox messages",
        // `seq` (the clustered key) orders the messages; `id` is unique (the retry of a call
        // finds its message there). `(status, seq)` serves the relay's scan of pending messages
        // in order, `(status, ordering_key, seq)` its "no older pending message of the key"
        // test, `(status, delivered_at)` the purge.
        sql: format!(
            "CREATE TABLE IF NOT EXISTS {records} (\n\
             \x20   `seq`             BIGINT       NOT NULL AUTO_INCREMENT,\n\
             \x20   `id`              VARCHAR({max}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20   `topic`           TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20   `ordering_key`    VARCHAR({max}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20   `payload`         LONGBLOB     NOT NULL,\n\
             \x20   `headers`         LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20   `status`          SMALLINT     NOT NULL DEFAULT 0,\n\
             \x20   `attempts`        INT          NOT NULL DEFAULT 0,\n\
             \x20   `next_attempt_at` BIGINT       NOT NULL,\n\
             \x20   `last_error`      TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,\n\
             \x20   `created_at`      BIGINT       NOT NULL,\n\
             \x20   `delivered_at`    BIGINT,\n\
             \x20   PRIMARY KEY (`seq`),\n\
             \x20   UNIQUE KEY `{name}_id_key` (`id`),\n\
             \x20   KEY `{name}_status_idx` (`status`, `seq`),\n\
             \x20   KEY `{name}_pending_idx` (`status`, `ordering_key`, `seq`),\n\
             \x20   KEY `{name}_delivered_idx` (`status`, `delivered_at`)\n\
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            records = t.records,
            max = MYSQL_MAX_ID,
        ),
    }]
}
