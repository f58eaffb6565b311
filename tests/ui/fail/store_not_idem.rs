use idem::idempotent;

#[idempotent(store = idem)]
async fn charge(order: u64, idem: &str) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
