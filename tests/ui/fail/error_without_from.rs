use idem::{idempotent, Idem};

#[derive(Debug)]
pub struct PayError;

#[idempotent(store = idem)]
async fn charge(order: u64, idem: &Idem) -> Result<u64, PayError> {
    Ok(order)
}

fn main() {}
