//! Helpers shared by the MySQL test binaries: what every SQL backend's tests share
//! (`sql_common`), an admin pool, and the server's counters.
#![allow(dead_code)]

#[path = "../sql_common/mod.rs"]
mod sql_common;
#[allow(unused_imports)]
pub use sql_common::*;

use idem::store::mysql::{MysqlOptions, MysqlStore};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

/// A table name no other test, process or run uses (under MySQL's 48-byte limit for idem).
pub fn unique_table(prefix: &str) -> String {
    sql_common::unique_table(&format!("my_{prefix}"))
}

/// A small pool for the test's own statements.
pub async fn admin(url: &str) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("admin connection to MySQL")
}

/// A store on a table of its own.
pub async fn store(url: &str, table: &str) -> MysqlStore {
    MysqlOptions::from_url(url)
        .unwrap()
        .table(table)
        .connect()
        .await
        .expect("open the MySQL store")
}

/// Drops a store table and its version table.
pub async fn drop_table(admin: &MySqlPool, table: &str) {
    for t in [table.to_string(), format!("{table}_migrations")] {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS `{t}`"))
            .execute(admin)
            .await;
    }
}

/// A global status counter of the server (`Innodb_deadlocks`, `Com_stmt_execute`, …), read
/// with the text protocol so that the read is not a prepared statement itself.
pub async fn global_status(admin: &MySqlPool, name: &str) -> u64 {
    use sqlx::Row;
    let row = sqlx::raw_sql(&format!("SHOW GLOBAL STATUS LIKE '{name}'"))
        .fetch_one(admin)
        .await
        .unwrap_or_else(|e| panic!("SHOW GLOBAL STATUS LIKE '{name}': {e}"));
    let value: String = row.try_get(1).unwrap();
    value.parse().unwrap()
}
