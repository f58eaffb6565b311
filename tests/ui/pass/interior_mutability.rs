// Interior mutability is refused only where it would be part of the key or fingerprint.
use idem::{idempotent, Idem};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[idempotent(store = idem, skip(seen))]
async fn skipped(order: u64, seen: &AtomicU64, idem: &Idem) -> Result<u64, idem::Error> {
    seen.fetch_add(1, Ordering::Relaxed);
    Ok(order)
}

#[idempotent(store = idem, key = order, fingerprint = order)]
async fn explicit(order: u64, log: Arc<Mutex<Vec<u64>>>, idem: &Idem) -> Result<u64, idem::Error> {
    log.lock().unwrap().push(order);
    Ok(order)
}

fn main() {
    let idem = Idem::memory();
    let _ = skipped(1, &AtomicU64::new(0), &idem);
    let _ = explicit(1, Arc::default(), &idem);
}
