use idem::{idempotent, Idem};

const TTL_SECS: u64 = 30;

// A non-literal is taken as a `Duration` expression.
#[idempotent(store = idem, ttl = TTL_SECS)]
async fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
