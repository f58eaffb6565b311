//! The outbox table and its versioned migrations, recorded in `<table>_migrations` by the
//! PostgreSQL store's migration runner (the same lock, version table and error kinds).

use crate::store::postgres::schema::Table;
use crate::store::{Migration, SchemaVersion};

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

/// Every outbox migration, in order.
pub(crate) fn migrations(t: &Table) -> Vec<Migration> {
    let name = t.display.rsplit('.').next().unwrap_or(&t.display);
    vec![Migration {
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
