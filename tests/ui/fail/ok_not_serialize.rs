use idem::{idempotent, Idem};

pub struct Receipt;

#[idempotent(store = idem)]
async fn charge(order: u64, idem: &Idem) -> Result<Receipt, idem::Error> {
    let _ = order;
    Ok(Receipt)
}

fn main() {}
