use idem::store::postgres::sqlx::{self, PgConnection, Postgres, Transaction};
use idem::{idempotent, Idem, OnError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum PayError {
    Declined,
    Idem(String),
}

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

fn decide(e: &PayError) -> OnError {
    match e {
        PayError::Declined => OnError::Keep,
        PayError::Idem(_) => OnError::Release,
    }
}

// Every option that applies, `?` and `return` in the body, the transaction used in it.
#[idempotent(
    transaction = tx,
    key = order,
    store = idem,
    fingerprint = amount,
    scope = tenant,
    ttl = "24h",
    lease = "30s",
    name = "charges.v1",
    on_error = decide
)]
async fn charge(
    order: u64,
    amount: i64,
    tenant: &str,
    idem: &Idem,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<u64, PayError> {
    if amount < 0 {
        return Err(PayError::Declined);
    }
    sqlx::query("SELECT 1")
        .execute(&mut **tx)
        .await
        .map_err(|e| PayError::Idem(e.to_string()))?;
    Ok(order)
}

// The installed handle, a bare connection, a default key without the transaction in it.
#[idempotent(transaction = conn, on_error = keep)]
async fn record(order: u64, conn: &mut PgConnection) -> Result<u64, PayError> {
    sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .map_err(|e| PayError::Idem(e.to_string()))?;
    Ok(order)
}

fn assert_send<F: std::future::Future + Send>(_: F) {}

#[allow(dead_code)]
async fn callers(idem: &Idem, tx: &mut Transaction<'_, Postgres>) {
    assert_send(charge(1, 2, "t", idem, tx));
    assert_send(record(1, tx));
}

fn main() {}
