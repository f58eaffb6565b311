use idem::{idempotent, Idem};

#[derive(Debug)]
pub struct PayError(idem::Error);

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError(e)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub id: u64,
}

pub struct Gateway;

/// Doc comments and attributes stay.
#[idempotent(store = idem, skip(gateway))]
#[allow(clippy::needless_pass_by_value)]
pub async fn charge(order: u64, idem: &Idem, gateway: &Gateway) -> Result<Receipt, PayError> {
    let _ = gateway;
    Ok(Receipt { id: order })
}

/// No arguments at all: one key for the function.
#[idempotent(store = idem)]
async fn singleton(idem: Idem) -> Result<(), idem::Error> {
    Ok(())
}

/// Raw identifiers and `mut` bindings.
#[idempotent(store = idem)]
async fn r#match(mut r#type: String, idem: &Idem) -> Result<String, idem::Error> {
    r#type.push('!');
    Ok(r#type)
}

fn main() {
    let _ = charge(1, &Idem::memory(), &Gateway);
    let _ = singleton(Idem::memory());
    let _ = r#match(String::new(), &Idem::memory());
}
