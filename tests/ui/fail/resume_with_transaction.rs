use idem::store::postgres::sqlx::{Postgres, Transaction};
use idem::idempotent;

#[idempotent(resume, transaction = tx)]
async fn charge(order: u64, tx: &mut Transaction<'_, Postgres>) -> Result<u64, idem::Error> {
    let _ = tx;
    Ok(order)
}

fn main() {}
