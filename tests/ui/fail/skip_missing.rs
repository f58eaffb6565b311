use idem::{idempotent, Idem};

pub struct Client;

#[idempotent(store = idem, skip(clinet))]
async fn charge(order: u64, client: &Client, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = client;
    Ok(order)
}

fn main() {}
