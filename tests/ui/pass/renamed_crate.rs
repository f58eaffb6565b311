extern crate idem as renamed;

mod reexport {
    pub use ::idem as idem_again;
}

use renamed::{idempotent, Idem};

#[idempotent(store = idem, crate = ::renamed)]
async fn a(n: u64, idem: &Idem) -> Result<u64, renamed::Error> {
    Ok(n)
}

#[idempotent(store = idem, crate = crate::reexport::idem_again)]
async fn b(n: u64, idem: &Idem) -> Result<u64, renamed::Error> {
    Ok(n)
}

fn main() {
    let _ = a(1, &Idem::memory());
    let _ = b(1, &Idem::memory());
}
