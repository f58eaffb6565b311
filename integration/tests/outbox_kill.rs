//! The outbox under `kill -9` on PostgreSQL: producer processes (an
//! `#[idempotent(transaction = tx)]` checkout that inserts the order and enqueues
//! `order.placed`) and relay processes (to NATS JetStream) are killed with SIGKILL at random
//! points, over and over, while a consumer whose handler is `#[idempotent]` on the message id
//! counts its effects in its own table. Then a recovery pass. Every committed order has exactly
//! one message and exactly one effect, and nothing uncommitted is ever delivered. The figures are
//! printed (docs/outbox.md has a run's). The test is in outbox_kill_common/ (shared with
//! outbox_kill_mysql.rs); here is what is PostgreSQL's.

mod outbox_kill_common;

use idem::outbox::Outbox;
use idem::{idempotent, Error, Idem};
use outbox_kill_common::outbox_db::Pg;
use outbox_kill_common::{insert_id, placed, Backend, Sql};
use sqlx::{Postgres, Transaction};
use std::future::Future;

/// The producer's business transaction: the order row and its message commit together.
#[idempotent(transaction = tx, key = order, store = idem, skip(outbox, orders), name = "checkout")]
async fn checkout(
    order: i64,
    idem: &Idem,
    outbox: &Outbox,
    orders: &str,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<String, Error> {
    sqlx::query(&insert_id(Sql::Postgres, orders))
        .bind(order)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::store("postgres", "body", e))?;
    Ok(outbox.enqueue(tx, placed(order)?).await?.id)
}

impl Backend for Pg {
    const PREFIX: &'static str = "obxk";
    const ORDERS: usize = 1500;
    const ROUNDS: u64 = 25;

    fn checkout<'a>(
        order: i64,
        idem: &'a Idem,
        outbox: &'a Outbox,
        orders: &'a str,
        tx: &'a mut Transaction<'static, Postgres>,
    ) -> impl Future<Output = Result<String, Error>> + 'a {
        checkout(order, idem, outbox, orders, tx)
    }
}

async fn killed_producers_and_relays_lose_nothing_and_duplicate_nothing(pg: String, nats: String) {
    outbox_kill_common::run::<Pg>(
        "killed_producers_and_relays_lose_nothing_and_duplicate_nothing",
        pg,
        nats,
    )
    .await
}

idem_integration::server_tests! {
    POSTGRES_AND_NATS => [
        killed_producers_and_relays_lose_nothing_and_duplicate_nothing,
    ],
}
