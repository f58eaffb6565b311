use idem::{idempotent, Idem};

#[idempotent(key = order, store = idem, skip(idem), on_abandoned = retry)]
async fn pay(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
