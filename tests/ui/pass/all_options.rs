use idem::{idempotent, Idem, OnError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize)]
pub enum PayError {
    Declined,
    Idem(String),
}

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

fn decide(e: &PayError) -> OnError {
    match e {
        PayError::Declined => OnError::Keep,
        PayError::Idem(_) => OnError::Release,
    }
}

mod policy {
    pub fn never_keep(_: &super::PayError) -> idem::OnError {
        idem::OnError::Release
    }
}

pub struct Client;

#[idempotent(
    key = (order, "charge"),
    store = idem,
    ttl = "24h",
    lease = "30s",
    wait = "250ms",
    tombstone = "90d",
    max_value = "1MiB",
    fingerprint = amount,
    skip(client),
    scope = tenant,
    name = "charges.v1",
    on_error = decide,
    crate = ::idem,
)]
async fn everything(
    tenant: &str,
    order: u64,
    amount: u64,
    idem: &Idem,
    client: &Client,
) -> Result<u64, PayError> {
    let _ = client;
    Ok(amount)
}

#[idempotent(store = idem, ttl = Duration::from_secs(60), lease = Duration::from_millis(1500), wait = std::time::Duration::ZERO, tombstone = Duration::from_secs(86_400), max_value = 64 * 1024, on_error = keep)]
async fn exprs(n: u64, idem: &Idem) -> Result<u64, PayError> {
    Ok(n)
}

#[idempotent(store = idem, on_error = policy::never_keep, ttl = "7d", lease = "2m",)]
async fn path_policy(n: u64, idem: &Idem) -> Result<u64, PayError> {
    Ok(n)
}

#[idempotent(store = idem, on_error = release)]
async fn release(n: u64, idem: &Idem) -> Result<u64, PayError> {
    Ok(n)
}

fn main() {
    let idem = Idem::memory();
    let _ = everything("t", 1, 2, &idem, &Client);
    let _ = exprs(1, &idem);
    let _ = path_policy(1, &idem);
    let _ = release(1, &idem);
}
