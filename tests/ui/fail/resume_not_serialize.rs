use idem::idempotent;

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

#[idempotent(resume, key = order.id)]
async fn ship(order: Order) -> Result<u64, idem::Error> {
    Ok(order.id)
}

fn main() {}
