use idem::{idempotent, Idem};

async fn charged(order: u64) -> Result<Option<u64>, idem::Error> {
    Ok(Some(order))
}

#[idempotent(key = order, store = idem, skip(idem), reconcile = charged(order), on_abandoned = park)]
async fn pay(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
