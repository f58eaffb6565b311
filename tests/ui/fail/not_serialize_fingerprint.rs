use idem::{idempotent, Idem};

pub struct Pool;

// `key` is given, so the default fingerprint (every argument not skipped) still takes `pool`.
#[idempotent(store = idem, key = order)]
async fn charge(order: u64, pool: Pool, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = pool;
    Ok(order)
}

fn main() {}
