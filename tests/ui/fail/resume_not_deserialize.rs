use idem::idempotent;

#[derive(serde::Serialize)]
struct Order {
    id: u64,
}

#[idempotent(resume)]
async fn ship(order: Order) -> Result<u64, idem::Error> {
    Ok(order.id)
}

fn main() {}
