// A cell serializes its current contents: in the default key it would make a new key on
// every call.
use idem::{idempotent, Idem};
use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::sync::OnceLock;

#[idempotent(store = idem)]
async fn cell(order: u64, calls: &Cell<u32>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = calls;
    Ok(order)
}

#[idempotent(store = idem)]
async fn ref_cell(order: u64, log: Rc<RefCell<Vec<u64>>>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = log;
    Ok(order)
}

#[idempotent(store = idem)]
async fn once_cell(order: u64, first: &OnceCell<u64>, idem: &Idem) -> Result<u64, idem::Error> {
    let _ = first;
    Ok(order)
}

// `fingerprint` is given, so the default key still takes the cell (inside a tuple).
#[idempotent(store = idem, fingerprint = order)]
async fn once_lock(order: u64, pair: (u64, &OnceLock<u64>), idem: &Idem) -> Result<u64, idem::Error> {
    let _ = pair;
    Ok(order)
}

fn main() {}
