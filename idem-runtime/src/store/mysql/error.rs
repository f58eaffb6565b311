//! What a MySQL failure means: `sqlx` errors as [`StoreErrorKind`]s, by the server's error
//! number (`ER_…`), never by its message (which the server translates: `lc_messages`).
//!
//! | numbers | kind |
//! |---|---|
//! | 1045 (access denied), 1698 (no password), 1130 (host not allowed), 1862 (password expired) | `Authentication` |
//! | 1044 (database), 1142 (table), 1143 (column), 1227 (`SUPER`-like privilege), 1370 (routine) | `Permission` |
//! | 1049 (unknown database) | `DatabaseMissing` |
//! | 1146 (no such table) | `SchemaMissing` |
//! | 1213 (deadlock), 1205 (lock wait timeout), 3572 (`NOWAIT`), TiDB's 9007 (write conflict) | `Busy` |
//! | 1969 (MariaDB `max_statement_time`), 3024 (MySQL `max_execution_time`) | `Timeout` |
//! | 1290 (`--read-only`), 1792 (read-only transaction), 1836 (read-only mode) | `ReadOnly` |
//! | 1021 (disk full), 1037/1038 (out of memory), 1040/1203 (too many connections), 1041 (out of resources), 1114 (table full), 1153 (`max_allowed_packet`) | `Capacity` |
//! | 1053 (shutdown), 1927 (MariaDB: connection killed), 4031 (MySQL: idle session closed), and every I/O, TLS or protocol failure | `Unreachable` |
//! | 1235 (not supported yet), 1251 (authentication method), 1286 (unknown storage engine) | `Unsupported` |
//!
//! Lock conflicts (`Busy`) are retried inside the store's own steps (see `locks.rs`); a
//! caller sees one only when the retries ran out or inside the caller's transaction, where
//! InnoDB rolled the whole transaction back and only the caller can run it again. TiDB reports
//! an optimistic transaction's write conflict at commit as 9007; it means what a deadlock means
//! here (the statement or transaction lost a race and may run again), so it is classified and
//! retried like 1213. That mapping is from TiDB's documentation: no TiDB runs in these tests.

use super::BACKEND;
use crate::error::{Error, StoreErrorKind};
use sqlx::mysql::MySqlDatabaseError;

/// ER_LOCK_DEADLOCK: this statement was the victim of a deadlock and was rolled back.
pub(crate) const DEADLOCK: u16 = 1213;
/// ER_LOCK_WAIT_TIMEOUT: this statement waited `innodb_lock_wait_timeout` for a row lock.
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// TiDB's ErrWriteConflict: an optimistic transaction lost a write conflict at commit.
pub(crate) const TIDB_WRITE_CONFLICT: u16 = 9007;

/// The server's error number (`ER_…`) of a database error, 0 when it has none.
pub(crate) fn error_number(db: &dyn sqlx::error::DatabaseError) -> u16 {
    db.try_downcast_ref::<MySqlDatabaseError>()
        .map_or(0, MySqlDatabaseError::number)
}

/// The server's error number of `e`, when it is a database error.
fn number_of(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => Some(error_number(&**db)),
        _ => None,
    }
}

/// What a server error number means (see the table above); `Query` for any other.
pub(crate) fn kind_of_number(number: u16) -> StoreErrorKind {
    match number {
        1045 | 1698 | 1130 | 1862 => StoreErrorKind::Authentication,
        1044 | 1142 | 1143 | 1227 | 1370 => StoreErrorKind::Permission,
        1049 => StoreErrorKind::DatabaseMissing,
        1146 => StoreErrorKind::SchemaMissing,
        DEADLOCK | LOCK_WAIT_TIMEOUT | 3572 | TIDB_WRITE_CONFLICT => StoreErrorKind::Busy,
        1969 | 3024 => StoreErrorKind::Timeout,
        1290 | 1792 | 1836 => StoreErrorKind::ReadOnly,
        1021 | 1037 | 1038 | 1040 | 1041 | 1114 | 1153 | 1203 => StoreErrorKind::Capacity,
        1053 | 1927 | 4031 => StoreErrorKind::Unreachable,
        1235 | 1251 | 1286 => StoreErrorKind::Unsupported,
        _ => StoreErrorKind::Query,
    }
}

/// What a `sqlx` failure means, by its class or the server's error number.
pub(crate) fn kind_of(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        // Refused, reset, closed mid-statement, a handshake that went wrong, no connection
        // came free in time, the pool was closed.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Unreachable,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Database(db) => kind_of_number(error_number(&**db)),
        _ => StoreErrorKind::Query,
    }
}

/// A `sqlx` failure as an `idem::Error` of the mysql store, with its kind.
pub(crate) fn my_error(op: &'static str, e: sqlx::Error) -> Error {
    let kind = kind_of(&e);
    match e {
        sqlx::Error::PoolTimedOut => Error::store_kind(
            BACKEND,
            op,
            kind,
            "timed out waiting for a connection: the MySQL server is down or unreachable, \
             or every connection of the pool is busy (see `acquire_timeout`, `max_connections`)",
        ),
        e => Error::store_kind(BACKEND, op, kind, e),
    }
}

/// True when `e` means the connection (not the statement) failed: the step may be retried on
/// another connection.
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        // ER_SERVER_SHUTDOWN, ER_CONNECTION_KILLED (MariaDB), ER_CLIENT_INTERACTION_TIMEOUT
        // (MySQL 8): the server ended the session.
        e => matches!(number_of(e), Some(1053 | 1927 | 4031)),
    }
}

/// The error number of a lock conflict a statement may simply run again after (see
/// `locks.rs`), if `e` is one.
pub(crate) fn lock_conflict(e: &sqlx::Error) -> Option<u16> {
    number_of(e).filter(|n| matches!(*n, DEADLOCK | LOCK_WAIT_TIMEOUT | TIDB_WRITE_CONFLICT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_map_to_kinds() {
        use StoreErrorKind::*;
        for (n, kind) in [
            (1045, Authentication),
            (1044, Permission),
            (1142, Permission),
            (1227, Permission),
            (1049, DatabaseMissing),
            (1146, SchemaMissing),
            (1213, Busy),
            (1205, Busy),
            (9007, Busy),
            (1290, ReadOnly),
            (1040, Capacity),
            (1927, Unreachable),
            (1064, Query),
            (0, Query),
        ] {
            assert_eq!(kind_of_number(n), kind, "{n}");
        }
        assert!(kind_of_number(DEADLOCK).is_transient());
        assert!(kind_of_number(LOCK_WAIT_TIMEOUT).is_transient());
    }

    #[test]
    fn connection_failures_are_unreachable() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(kind_of(&refused), StoreErrorKind::Unreachable);
        assert!(is_connection_error(&refused));
        assert_eq!(
            kind_of(&sqlx::Error::PoolTimedOut),
            StoreErrorKind::Unreachable
        );
        assert_eq!(kind_of(&sqlx::Error::RowNotFound), StoreErrorKind::Query);
        assert_eq!(lock_conflict(&refused), None);
    }
}
