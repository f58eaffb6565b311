//! The outbox under `kill -9` on MySQL / MariaDB: outbox_kill.rs's test with the producers'
//! transactions, the idempotency stores, the outbox and the consumer's effect table on MySQL
//! (`IDEM_TEST_MYSQL_URL`), the relays (which poll: MySQL has no NOTIFY) publishing to NATS
//! JetStream. The test is in outbox_kill_common/; here is what is MySQL's.

mod outbox_kill_common;

use idem::outbox::Outbox;
use idem::{idempotent, Error, Idem};
use outbox_kill_common::outbox_db::Mysql;
use outbox_kill_common::{insert_id, placed, Backend, Sql};
use sqlx::{MySql, Transaction};
use std::future::Future;

/// The producer's business transaction: the order row and its message commit together.
#[idempotent(transaction = tx, key = order, store = idem, skip(outbox, orders), name = "checkout")]
async fn checkout(
    order: i64,
    idem: &Idem,
    outbox: &Outbox<MySql>,
    orders: &str,
    tx: &mut Transaction<'_, MySql>,
) -> Result<String, Error> {
    sqlx::query(&insert_id(Sql::Mysql, orders))
        .bind(order)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::store("mysql", "body", e))?;
    Ok(outbox.enqueue(tx, placed(order)?).await?.id)
}

impl Backend for Mysql {
    // Table names stay under the MySQL store's limit of 48 bytes.
    const PREFIX: &'static str = "my_obxk";
    const ORDERS: usize = 1500;
    const ROUNDS: u64 = 25;

    fn checkout<'a>(
        order: i64,
        idem: &'a Idem,
        outbox: &'a Outbox<MySql>,
        orders: &'a str,
        tx: &'a mut Transaction<'static, MySql>,
    ) -> impl Future<Output = Result<String, Error>> + 'a {
        checkout(order, idem, outbox, orders, tx)
    }
}

async fn killed_producers_and_relays_lose_nothing_and_duplicate_nothing(
    mysql: String,
    nats: String,
) {
    outbox_kill_common::run::<Mysql>(
        "killed_producers_and_relays_lose_nothing_and_duplicate_nothing",
        mysql,
        nats,
    )
    .await
}

idem_integration::server_tests! {
    MYSQL_AND_NATS => [
        killed_producers_and_relays_lose_nothing_and_duplicate_nothing,
    ],
}
