//! The transactional outbox against a real MySQL / MariaDB (`IDEM_TEST_MYSQL_URL`): the
//! scenarios of outbox_postgres.rs on `Outbox<MySql>`. What a transaction enqueues is sent if
//! and only if it commits, a retried call enqueues once, relays (which poll: MySQL has no
//! NOTIFY) share the work and keep the order of each key, a failing publisher is retried and
//! then dead-lettered, delivered messages are purged. The scenarios are in outbox_common/; here
//! is what is MySQL's.

mod outbox_common;

use idem::outbox::{Message, Outbox};
use idem::{idempotent, Error, Idem};
use outbox_common::outbox_db::Mysql;
use outbox_common::{Backend, Setup};
use sqlx::{MySql, Transaction};
use std::future::Future;

#[idempotent(transaction = tx, key = order, store = idem, skip(outbox))]
async fn place_in_tx(
    order: &str,
    idem: &Idem,
    outbox: &Outbox<MySql>,
    tx: &mut Transaction<'_, MySql>,
) -> Result<String, Error> {
    outbox_common::place_in_tx(order, outbox, tx).await
}

impl Backend for Mysql {
    const PREFIX: &'static str = "my_";
    /// A `TEXT` column, which sqlx's `Any` driver reads as bytes whatever its character set: as
    /// a `VARCHAR` of the longest error kept (8000 bytes), a string.
    const LAST_ERROR: &'static str = "CAST(last_error AS CHAR(8000))";

    fn place_in_tx<'a>(
        order: &'a str,
        idem: &'a Idem,
        outbox: &'a Outbox<MySql>,
        tx: &'a mut Transaction<'static, MySql>,
    ) -> impl Future<Output = Result<String, Error>> + 'a {
        place_in_tx(order, idem, outbox, tx)
    }

    async fn refusals_of_this_database(s: &Setup<Self>) {
        // MySQL's columns: an id or ordering key over 255 characters is refused before the
        // statement, never truncated.
        let mut tx = s.admin.begin().await.unwrap();
        let long = "k".repeat(256);
        for m in [
            Message::new("t", Vec::new()).ordering_key(long.clone()),
            Message::new("t", Vec::new()).id(long.clone()),
        ] {
            let err = s.outbox.enqueue(&mut tx, m).await.unwrap_err();
            assert!(err.is_config(), "{err:?}");
        }
        tx.rollback().await.unwrap();
        assert_eq!(s.all().await, 0);
        // The schema: version 1, and the SQL a DBA would run.
        assert_eq!(s.outbox.schema_version().await.unwrap(), 1);
        let sql = Outbox::mysql_migrations(&s.table).unwrap();
        assert_eq!(sql.len(), 1);
        assert!(sql[0].sql.contains("ENGINE=InnoDB"), "{}", sql[0].sql);
        // Migrating again is a no-op.
        let again = s.outbox.clone().migrate().await.unwrap();
        assert_eq!(again.schema_version().await.unwrap(), 1);
    }
}

outbox_common::scenarios!(Mysql, MYSQL);
