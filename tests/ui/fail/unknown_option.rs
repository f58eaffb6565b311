use idem::{idempotent, Idem};

#[idempotent(store = idem, leese = "30s")]
async fn misspelt(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, retries = 3)]
async fn unknown(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
