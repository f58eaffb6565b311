//! The databases the outbox tests run on, shared by the scenarios (outbox_common/) and the
//! kill -9 test (outbox_kill_common/): each one's idempotency store and outbox, and the dialect
//! of the tests' own statements ([`Sql`]).
#![allow(dead_code)]

#[path = "../sql_common/mod.rs"]
pub mod sql_common;

use idem::outbox::{Outbox, OutboxDatabase};
use idem::{Error, Idem};
use sqlx::Pool;
use std::future::Future;

pub use sql_common::Sql;

/// A database an outbox test runs on.
pub trait OutboxDb: Sized + 'static {
    /// The outbox's database.
    type Db: OutboxDatabase;
    /// The dialect of the test's own statements.
    const SQL: Sql;

    /// The idempotency store in `table` of `url`'s database (its schema created): the `Idem`
    /// over it and its pool.
    fn store(url: &str, table: &str) -> impl Future<Output = (Idem, Pool<Self::Db>)>;

    /// The outbox in `table` of `pool`'s database (`Error::Config` for a bad table name).
    fn outbox(pool: Pool<Self::Db>, table: &str) -> Result<Outbox<Self::Db>, Error>;
}

/// PostgreSQL.
pub struct Pg;

impl OutboxDb for Pg {
    type Db = sqlx::Postgres;
    const SQL: Sql = Sql::Postgres;

    async fn store(url: &str, table: &str) -> (Idem, Pool<sqlx::Postgres>) {
        let store = idem::store::postgres::PostgresOptions::from_url(url)
            .unwrap()
            .table(table)
            .connect()
            .await
            .unwrap();
        (Idem::from_store(store.clone()), store.pool().clone())
    }

    fn outbox(pool: Pool<sqlx::Postgres>, table: &str) -> Result<Outbox, Error> {
        Outbox::with_table(pool, table)
    }
}

/// MySQL / MariaDB.
#[cfg(feature = "mysql")]
pub struct Mysql;

#[cfg(feature = "mysql")]
impl OutboxDb for Mysql {
    type Db = sqlx::MySql;
    const SQL: Sql = Sql::Mysql;

    async fn store(url: &str, table: &str) -> (Idem, Pool<sqlx::MySql>) {
        let store = idem::store::mysql::MysqlOptions::from_url(url)
            .unwrap()
            .table(table)
            .connect()
            .await
            .unwrap();
        (Idem::from_store(store.clone()), store.pool().clone())
    }

    fn outbox(pool: Pool<sqlx::MySql>, table: &str) -> Result<Outbox<sqlx::MySql>, Error> {
        Outbox::mysql_with_table(pool, table)
    }
}
