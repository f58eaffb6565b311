use idem::{idempotent, Idem};

const NAME: &str = "charges.v1";

#[idempotent(store = idem, name = NAME)]
async fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
