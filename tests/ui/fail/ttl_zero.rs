use idem::{idempotent, Idem};

#[idempotent(store = idem, ttl = "0s")]
async fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
