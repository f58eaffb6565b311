// An atomic serializes its current value: in the default key it would make a new key on
// every call.
use idem::{idempotent, Idem};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

#[idempotent(store = idem)]
async fn counter(order: u64, count: &AtomicU64, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = count;
    Ok(order)
}

#[idempotent(store = idem)]
async fn flag(order: u64, done: Arc<AtomicBool>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = done;
    Ok(order)
}

#[idempotent(store = idem)]
async fn in_a_vec(order: u64, slots: Box<Vec<std::sync::atomic::AtomicUsize>>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = slots;
    Ok(order)
}

fn main() {}
