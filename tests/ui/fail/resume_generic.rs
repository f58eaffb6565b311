use idem::idempotent;

#[idempotent(resume)]
async fn ship<T: serde::Serialize>(order: T) -> Result<u64, idem::Error> {
    let _ = order;
    Ok(1)
}

fn main() {}
