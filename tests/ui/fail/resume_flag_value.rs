use idem::idempotent;

#[idempotent(resume = true)]
async fn ship(order: u64) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {}
