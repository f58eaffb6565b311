//! `#[idempotent(transaction = tx)]` against a real PostgreSQL: the handler's writes and the
//! idempotency record commit or roll back together.

mod pg_common;

use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::{idempotent, Error, Idem};
use pg_common::*;
use sqlx::{PgConnection, Postgres, Transaction};

/// Inserts the order into the side-effect table `side`, inside the caller's transaction.
#[idempotent(transaction = tx, key = order, store = idem, skip(side), ttl = "1h")]
async fn place(
    order: &str,
    side: &str,
    idem: &Idem,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<String, Error> {
    if order.is_empty() {
        // `return` inside the body still returns from the body.
        return Err(Error::Config("empty order".into()));
    }
    sqlx::query(&format!("INSERT INTO \"{side}\" (k) VALUES ($1)"))
        .bind(order)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::store("postgres", "body", e))?;
    ran(order);
    Ok(format!(
        "placed {order} as {}",
        idem::current_key().unwrap().len()
    ))
}

/// The same with a bare `&mut PgConnection` (the caller passes `&mut *tx`).
#[idempotent(transaction = conn, key = order, store = idem, skip(side), name = "place")]
async fn place_on_conn(
    order: &str,
    side: &str,
    idem: &Idem,
    conn: &mut PgConnection,
) -> Result<String, Error> {
    sqlx::query(&format!("INSERT INTO \"{side}\" (k) VALUES ($1)"))
        .bind(order)
        .execute(&mut *conn)
        .await
        .map_err(|e| Error::store("postgres", "body", e))?;
    ran(order);
    Ok(format!(
        "placed {order} as {}",
        idem::current_key().unwrap().len()
    ))
}

struct Setup {
    admin: sqlx::PgPool,
    store: PostgresStore,
    idem: Idem,
    table: String,
    side: String,
}

async fn setup(url: &str) -> Setup {
    let admin = admin(url).await;
    let table = unique_table("txattr");
    let store = PostgresOptions::from_url(url)
        .unwrap()
        .table(&table)
        .connect()
        .await
        .unwrap();
    let side = unique_table("txside");
    sqlx::query(&format!("CREATE TABLE \"{side}\" (k text NOT NULL)"))
        .execute(&admin)
        .await
        .unwrap();
    let idem = Idem::from_store(store.clone());
    Setup {
        admin,
        store,
        idem,
        table,
        side,
    }
}

impl Setup {
    async fn rows(&self, k: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\" WHERE k = $1",
            self.side
        ))
        .bind(k)
        .fetch_one(&self.admin)
        .await
        .unwrap()
    }

    async fn cleanup(self) {
        drop_table(&self.admin, &self.table).await;
        drop_table(&self.admin, &self.side).await;
    }
}

/// Committed: a second call in a new transaction replays and inserts nothing; a body `Err`
/// releases the key inside the transaction.
async fn committed_result_replays_without_running_again(url: String) {
    let s = setup(&url).await;

    let mut tx = s.store.pool().begin().await.unwrap();
    let first = place("commit-1", &s.side, &s.idem, &mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first, "placed commit-1 as 64");
    assert_eq!(s.rows("commit-1").await, 1);

    let mut tx = s.store.pool().begin().await.unwrap();
    let again = place("commit-1", &s.side, &s.idem, &mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(s.rows("commit-1").await, 1, "the replay inserted nothing");
    assert_eq!(runs("commit-1"), 1, "the body ran once");

    // The same namespace and key through a `&mut PgConnection` argument: a replay too.
    let mut tx = s.store.pool().begin().await.unwrap();
    let on_conn = place_on_conn("commit-1", &s.side, &s.idem, &mut tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(on_conn, first);
    assert_eq!(runs("commit-1"), 1);

    // An `Err` from the body (an early `return`) releases the key; the caller may commit.
    let mut tx = s.store.pool().begin().await.unwrap();
    let failed = place("", &s.side, &s.idem, &mut tx).await;
    assert!(
        matches!(failed, Err(Error::Config(ref m)) if m == "empty order"),
        "{failed:?}"
    );
    tx.commit().await.unwrap();
    let mut tx = s.store.pool().begin().await.unwrap();
    assert!(place("", &s.side, &s.idem, &mut tx).await.is_err());
    tx.rollback().await.unwrap();
    s.cleanup().await;
}

/// Rolled back after the body: neither the insert nor the claim remains, so the next attempt
/// runs again; in the end the side effect exists exactly once.
async fn rolled_back_attempt_runs_again_and_the_effect_exists_once(url: String) {
    let s = setup(&url).await;

    let mut tx = s.store.pool().begin().await.unwrap();
    place("rollback-1", &s.side, &s.idem, &mut tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(s.rows("rollback-1").await, 0);

    for _ in 0..2 {
        let mut tx = s.store.pool().begin().await.unwrap();
        let out = place("rollback-1", &s.side, &s.idem, &mut tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(out, "placed rollback-1 as 64");
    }
    assert_eq!(s.rows("rollback-1").await, 1, "exactly once");
    assert_eq!(
        runs("rollback-1"),
        2,
        "the rolled-back attempt and the committed one ran; the last call replayed"
    );
    s.cleanup().await;
}

/// A handle whose store is not PostgreSQL is a configuration error, and the body does not run.
async fn a_store_that_is_not_postgres_is_a_config_error(url: String) {
    let s = setup(&url).await;
    let memory = Idem::memory();
    let mut tx = s.store.pool().begin().await.unwrap();
    let out = place("memory-1", &s.side, &memory, &mut tx).await;
    tx.commit().await.unwrap();
    match out {
        Err(Error::Config(m)) => assert!(
            m.contains("needs a PostgreSQL store") && m.contains("memory"),
            "{m}"
        ),
        other => panic!("expected Error::Config, got {other:?}"),
    }
    assert_eq!(s.rows("memory-1").await, 0);
    s.cleanup().await;
}

idem_integration::server_tests! {
    POSTGRES => [
        committed_result_replays_without_running_again,
        rolled_back_attempt_runs_again_and_the_effect_exists_once,
        a_store_that_is_not_postgres_is_a_config_error,
    ],
}
