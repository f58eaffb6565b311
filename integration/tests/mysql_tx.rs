//! The transactional mode on MySQL: `#[idempotent(transaction = tx)]` with a
//! `&mut sqlx::Transaction<'_, MySql>`, and `Call::in_transaction`. The claim, the body's writes
//! and the result commit together; a rolled-back attempt leaves nothing.

mod mysql_common;

use idem::{idempotent, Error, Idem};
use mysql_common::*;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, MySqlConnection, Transaction};
use std::time::Duration;

/// Inserts the order into the side-effect table `side`, inside the caller's transaction.
#[idempotent(transaction = tx, key = order, store = idem, skip(side), ttl = "1h")]
async fn place(
    order: &str,
    side: &str,
    idem: &Idem,
    tx: &mut Transaction<'_, MySql>,
) -> Result<String, Error> {
    sqlx::query(&format!("INSERT INTO `{side}` (k) VALUES (?)"))
        .bind(order)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::store("mysql", "body", e))?;
    ran(order);
    Ok(format!("placed {order}"))
}

struct Setup {
    admin: MySqlPool,
    idem: Idem,
    pool: MySqlPool,
    table: String,
    side: String,
}

async fn setup(url: &str) -> Setup {
    let admin = admin(url).await;
    let table = unique_table("tx");
    let store = store(url, &table).await;
    let side = format!("{table}_side");
    sqlx::query(&format!(
        "CREATE TABLE `{side}` (k VARCHAR(64) NOT NULL) ENGINE=InnoDB"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let pool = store.pool().clone();
    Setup {
        admin,
        idem: Idem::from_store(store),
        pool,
        table,
        side,
    }
}

impl Setup {
    async fn side_rows(&self, order: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `{}` WHERE k = ?", self.side))
            .bind(order)
            .fetch_one(&self.admin)
            .await
            .unwrap()
    }

    async fn records(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `{}`", self.table))
            .fetch_one(&self.admin)
            .await
            .unwrap()
    }

    async fn cleanup(&self) {
        drop_table(&self.admin, &self.table).await;
        drop_table(&self.admin, &self.side).await;
    }
}

/// Committed: the side effect and the record are there once, and a repeat replays in a new
/// transaction without running the body.
async fn attribute_commits_the_claim_with_the_body(url: String) {
    let s = setup(&url).await;
    let order = idem::testkit::unique("o");
    for round in 0..2 {
        let mut tx = s.pool.begin().await.unwrap();
        let out = place(&order, &s.side, &s.idem, &mut tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(out, format!("placed {order}"), "round {round}");
    }
    assert_eq!(runs(&order), 1);
    assert_eq!(s.side_rows(&order).await, 1);
    assert_eq!(s.records().await, 1);
    s.cleanup().await;
}

/// Rolled back: neither the side effect nor the claim survives, and the retry runs the body.
async fn a_rolled_back_attempt_leaves_nothing(url: String) {
    let s = setup(&url).await;
    let order = idem::testkit::unique("r");
    let mut tx = s.pool.begin().await.unwrap();
    place(&order, &s.side, &s.idem, &mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(s.side_rows(&order).await, 0);
    assert_eq!(s.records().await, 0, "the claim rolled back with the body");
    let mut tx = s.pool.begin().await.unwrap();
    place(&order, &s.side, &s.idem, &mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(runs(&order), 2);
    assert_eq!(s.side_rows(&order).await, 1);
    s.cleanup().await;
}

/// A duplicate in another transaction waits on the first one's row lock, then replays what it
/// committed; the function API on a bare connection does the same.
async fn a_concurrent_duplicate_waits_then_replays(url: String) {
    let s = setup(&url).await;
    let order = idem::testkit::unique("d");
    let mut tx1 = s.pool.begin().await.unwrap();
    place(&order, &s.side, &s.idem, &mut tx1).await.unwrap();
    let dup = {
        let (pool, idem, order, side) = (
            s.pool.clone(),
            s.idem.clone(),
            order.clone(),
            s.side.clone(),
        );
        tokio::spawn(async move {
            let mut tx2 = pool.begin().await.unwrap();
            let out = place(&order, &side, &idem, &mut tx2).await;
            tx2.commit().await.unwrap();
            out
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!dup.is_finished(), "the duplicate waits on the row lock");
    tx1.commit().await.unwrap();
    assert_eq!(dup.await.unwrap().unwrap(), format!("placed {order}"));
    assert_eq!(runs(&order), 1);
    assert_eq!(s.side_rows(&order).await, 1);

    // The function API, on the transaction's bare connection.
    let fn_order = idem::testkit::unique("f");
    for round in 0..2 {
        let mut tx = s.pool.begin().await.unwrap();
        let sql = format!("INSERT INTO `{}` (k) VALUES (?)", s.side);
        let o = fn_order.clone();
        let out = s
            .idem
            .call("fn")
            .key(&fn_order)
            .in_transaction(&mut *tx, async move |conn: &mut MySqlConnection| {
                sqlx::query(&sql)
                    .bind(&o)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| Error::store("mysql", "body", e))?;
                Ok::<_, Error>(o.len())
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(out.is_replayed(), round == 1);
        assert_eq!(out.into_inner(), fn_order.len());
    }
    assert_eq!(s.side_rows(&fn_order).await, 1);
    s.cleanup().await;
}

/// A handle on another store than the transaction's database is a typed error, and a bare
/// pooled connection outside a transaction is refused.
async fn wrong_store_or_no_transaction_is_a_config_error(url: String) {
    let s = setup(&url).await;
    let memory = Idem::memory();
    let mut tx = s.pool.begin().await.unwrap();
    match place("memory-1", &s.side, &memory, &mut tx).await {
        Err(Error::Config(m)) => assert!(
            m.contains("needs a MySQL store") && m.contains("memory"),
            "{m}"
        ),
        other => panic!("expected Error::Config, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    let mut conn = s.pool.acquire().await.unwrap();
    let r = s
        .idem
        .call("bare")
        .key("k")
        .in_transaction(&mut conn, async |_| Ok::<_, Error>(1u8))
        .await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    drop(conn);
    s.cleanup().await;
}

idem_integration::server_tests! {
    MYSQL => [
        attribute_commits_the_claim_with_the_body,
        a_rolled_back_attempt_leaves_nothing,
        a_concurrent_duplicate_waits_then_replays,
        wrong_store_or_no_transaction_is_a_config_error,
    ],
}
