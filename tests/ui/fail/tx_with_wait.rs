use idem::store::postgres::sqlx::{Postgres, Transaction};
use idem::{idempotent, Idem};

#[idempotent(transaction = tx, store = idem, wait = "5s")]
async fn charge(
    order: u64,
    idem: &Idem,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<u64, idem::Error> {
    let _ = tx;
    Ok(order)
}

fn main() {}
