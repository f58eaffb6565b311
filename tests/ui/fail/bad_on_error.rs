use idem::{idempotent, Idem};

#[idempotent(store = idem, on_error = "keep")]
async fn quoted(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, on_error = |_e| idem::OnError::Keep)]
async fn closure(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

#[idempotent(store = idem, on_error = keep())]
async fn called(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
