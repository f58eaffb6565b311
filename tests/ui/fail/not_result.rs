use idem::{idempotent, Idem};

#[idempotent(store = idem)]
async fn charge(order: u64, idem: &Idem) -> Option<u64> {
    Some(order)
}

type Res<T> = Result<T, idem::Error>;

#[idempotent(store = idem)]
async fn aliased(order: u64, idem: &Idem) -> Res<u64> {
    Ok(order)
}

fn main() {}
