// A lock serializes its current contents: in the default key it would make a new key on
// every call. Recognised by the type's last path segment, behind references and pointers.
use idem::{idempotent, Idem};
use std::sync::{Arc, Mutex, RwLock};

mod parking_lot {
    pub struct Mutex<T>(pub T);
}

#[idempotent(store = idem)]
async fn std_mutex(order: u64, seen: &Mutex<u64>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = seen;
    Ok(order)
}

#[idempotent(store = idem)]
async fn shared_rwlock(order: u64, cache: Arc<RwLock<Vec<u64>>>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = cache;
    Ok(order)
}

#[idempotent(store = idem)]
async fn tokio_mutex(order: u64, state: &mut tokio::sync::Mutex<u64>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = state;
    Ok(order)
}

// `key` is given, so the default fingerprint still takes the lock.
#[idempotent(store = idem, key = order)]
async fn other_mutex(order: u64, lock: Box<parking_lot::Mutex<u8>>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = lock;
    Ok(order)
}

fn main() {}
