use idem::idempotent;

/// A client that cannot be cloned: a resumer could not provide it by value.
struct Client;

#[idempotent(resume, skip(client))]
async fn ship(order: u64, client: Client) -> Result<u64, idem::Error> {
    let _ = client;
    Ok(order)
}

fn main() {}
