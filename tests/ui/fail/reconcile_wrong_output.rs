use idem::{idempotent, Idem};

async fn charged(order: u64) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(key = order, store = idem, skip(idem), reconcile = charged(order))]
async fn pay(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
