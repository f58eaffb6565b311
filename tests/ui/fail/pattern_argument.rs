use idem::{idempotent, Idem};

#[idempotent(store = idem)]
async fn pair((a, b): (u8, u8), idem: &Idem) -> Result<u8, idem::Error> {
    Ok(a + b)
}

#[idempotent(store = idem, key = a)]
async fn half(Wrapper(a): Wrapper, idem: &Idem) -> Result<u8, idem::Error> {
    Ok(a)
}

pub struct Wrapper(u8);

fn main() {}
