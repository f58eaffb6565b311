use idem::{idempotent, Idem};

#[idempotent(store = idem, ttl = "99999999999999d")]
async fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, lease = "36501d")]
async fn refund(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
