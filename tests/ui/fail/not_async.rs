use idem::{idempotent, Idem};

#[idempotent(store = idem)]
fn charge(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {
    let _ = charge(1, &Idem::memory());
}
