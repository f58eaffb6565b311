use idem::{idempotent, Idem};

#[idempotent(transaction = tx, store = idem)]
async fn charge(order: u64, idem: &Idem, tx: &mut String) -> Result<u64, idem::Error> {
    tx.push('x');
    Ok(order)
}

fn main() {}
