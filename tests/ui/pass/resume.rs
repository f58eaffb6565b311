use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Serialize, Deserialize, Clone)]
struct Order {
    id: u64,
}

/// A pool: provided to the resumer by type.
struct Pool;

#[derive(Clone)]
struct Client(Arc<()>);

#[idempotent(resume, skip(pool, client), lease = "1s")]
async fn ship(order: &Order, note: &str, tags: Vec<String>, pool: &Pool, client: Client) -> Result<u64, idem::Error> {
    let _ = (note, tags, pool, client);
    Ok(order.id)
}

#[idempotent(resume, store = idem, name = "orders.v2")]
async fn place(id: u64, idem: &Idem) -> Result<(), idem::Error> {
    let _ = id;
    Ok(())
}

#[idempotent(resume, key = "all")]
async fn nothing() -> Result<(), idem::Error> {
    Ok(())
}

fn main() {
    let idem = Idem::memory();
    let _ = idem.resumer().provide(Pool).provide(Client(Arc::new(()))).functions();
}
