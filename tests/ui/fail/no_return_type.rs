use idem::{idempotent, Idem};

#[idempotent(store = idem)]
async fn notify(order: u64, idem: &Idem) {
    let _ = order;
}

fn main() {}
