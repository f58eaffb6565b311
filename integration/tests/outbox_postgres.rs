//! The transactional outbox against a real PostgreSQL: what a transaction enqueues is sent if
//! and only if it commits, a retried call enqueues once, relays share the work and keep the
//! order of each key, a failing publisher is retried and then dead-lettered. The scenarios are
//! in outbox_common/ (shared with outbox_mysql.rs); here is what is PostgreSQL's.

mod outbox_common;

use idem::outbox::Outbox;
use idem::{idempotent, Error, Idem};
use outbox_common::outbox_db::Pg;
use outbox_common::{Backend, Setup};
use sqlx::{Postgres, Transaction};
use std::future::Future;

#[idempotent(transaction = tx, key = order, store = idem, skip(outbox))]
async fn place_in_tx(
    order: &str,
    idem: &Idem,
    outbox: &Outbox,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<String, Error> {
    outbox_common::place_in_tx(order, outbox, tx).await
}

impl Backend for Pg {
    const PREFIX: &'static str = "";
    const LAST_ERROR: &'static str = "last_error";

    fn place_in_tx<'a>(
        order: &'a str,
        idem: &'a Idem,
        outbox: &'a Outbox,
        tx: &'a mut Transaction<'static, Postgres>,
    ) -> impl Future<Output = Result<String, Error>> + 'a {
        place_in_tx(order, idem, outbox, tx)
    }

    /// PostgreSQL's columns are `TEXT`: no length to refuse.
    async fn refusals_of_this_database(_: &Setup<Self>) {}
}

outbox_common::scenarios!(Pg, POSTGRES);
