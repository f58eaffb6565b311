use idem::{idempotent, Idem};

struct Gateway;

impl Gateway {
    async fn find(&self, order: u64) -> Result<Option<u64>, idem::Error> {
        Ok(Some(order))
    }
}

#[idempotent(key = order, store = idem, skip(idem, gateway), reconcile = gateway.find(order))]
async fn pay(order: u64, idem: &Idem, gateway: &Gateway) -> Result<u64, idem::Error> {
    let _ = gateway;
    Ok(order)
}

#[idempotent(key = order, store = idem, skip(idem), on_abandoned = park, step)]
async fn ship(order: u64, idem: &Idem) -> Result<u64, idem::Error> {
    Ok(order)
}

fn main() {
    let _ = pay;
    let _ = ship;
}
