// Built without the `postgres` feature (tests/ui.rs, `ui_without_postgres`): the transactional
// mode's error names the feature it needs.
use idem::{idempotent, Idem};

pub struct Transaction;

#[idempotent(transaction = tx, store = idem)]
async fn charge(order: u64, idem: &Idem, tx: &mut Transaction) -> Result<u64, idem::Error> {
    let _ = tx;
    Ok(order)
}

fn main() {}
