//! Schema versions, shared by the SQL stores: every store records its migrations in
//! `<table>_migrations (version, description, applied_at)` and counts versions in
//! [`SchemaVersion`]; what opening or migrating did is a [`Migrated`].

use super::Backend;

/// A schema version: 0 is "no schema", each migration adds one.
pub type SchemaVersion = i32;

/// The table every store names its records table by default.
pub const DEFAULT_TABLE: &str = "idem_records";

/// One schema migration, as SQL a DBA can review and run.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The version this migration brings the schema to.
    pub version: SchemaVersion,
    /// What it does.
    pub description: &'static str,
    /// The SQL (one or more statements), with the table names filled in.
    pub sql: String,
}

/// What a migration found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migrated {
    /// The backend.
    pub backend: Backend,
    /// The schema version found before (0: none).
    pub from: SchemaVersion,
    /// The schema version now (equal to `from` when there was nothing to do; 0 for a store
    /// without a schema, such as Redis).
    pub to: SchemaVersion,
    /// Where: `table <name>`, or `key prefix <prefix>`.
    pub location: String,
}

impl Migrated {
    /// A migration report (for store implementors).
    pub fn new(
        backend: Backend,
        from: SchemaVersion,
        to: SchemaVersion,
        location: impl Into<String>,
    ) -> Self {
        Migrated {
            backend,
            from,
            to,
            location: location.into(),
        }
    }

    /// True when the schema was created or upgraded.
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}
