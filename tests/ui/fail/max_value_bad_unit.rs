use idem::{idempotent, Idem};

#[idempotent(store = idem, max_value = "1MB")]
async fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
