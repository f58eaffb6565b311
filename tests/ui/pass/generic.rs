use idem::{idempotent, Idem};
use serde::{de::DeserializeOwned, Serialize};

#[idempotent(store = idem)]
async fn echo<T: Serialize + DeserializeOwned>(value: T, idem: &Idem) -> Result<T, idem::Error> {
    Ok(value)
}

#[idempotent(store = idem, skip(f))]
async fn apply<'a, K, F>(key: &'a K, f: F, idem: &'a Idem) -> Result<u64, idem::Error>
where
    K: Serialize + ?Sized,
    F: FnOnce() -> u64,
{
    let _ = key;
    Ok(f())
}

#[idempotent(store = idem)]
async fn impl_arg(value: impl Serialize, idem: &Idem) -> Result<u8, idem::Error> {
    let _ = value;
    Ok(1)
}

fn main() {
    let idem = Idem::memory();
    let _ = echo(1u8, &idem);
    let _ = apply("k", || 1, &idem);
    let _ = impl_arg("v", &idem);
}
