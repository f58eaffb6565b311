use idem::{idempotent, Idem};

#[idempotent(store = idem, lease = "s")]
async fn no_number(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, wait = "30")]
async fn no_unit(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, ttl = 30)]
async fn bare_integer(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, lease = "0s")]
async fn zero_lease(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
