//! The crash window, closed by a reconcile: the body charges a card at a gateway under the
//! call's idempotency key (`idem::current_key()`) and fencing token (`idem::current_token()`),
//! then its process dies before idem stores the result. The next call takes the abandoned
//! attempt over, and its reconcile looks the charge up at the gateway by that key: the charge is
//! stored as the call's result, and the card is not charged twice. The token passed down lets
//! the gateway refuse an attempt that was only frozen and wakes up after the takeover.
//!
//! `cargo run --example payment_reconcile` (docs/crash-window.md explains it)

use idem::{idempotent, Idem};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// A charge as the gateway keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    pub id: u64,
    pub cents: u64,
}

/// A payment gateway that records each charge under the idempotency key it is sent, and
/// refuses a fencing token below the highest it has seen for that key.
#[derive(Default)]
pub struct Gateway {
    charges: Mutex<HashMap<String, Charge>>,
    fences: Mutex<HashMap<String, u64>>,
    pub made: Mutex<u64>,
}

impl Gateway {
    /// `POST /charges` with `Idempotency-Key: key` and `Fencing-Token: token`.
    pub async fn charge(&self, key: &str, token: u64, cents: u64) -> Result<Charge, String> {
        let mut fences = self.fences.lock().unwrap();
        let fence = fences.entry(key.to_string()).or_default();
        if token < *fence {
            return Err(format!("stale token {token}: the key was taken over"));
        }
        *fence = token;
        let mut made = self.made.lock().unwrap();
        let mut charges = self.charges.lock().unwrap();
        let charge = charges.entry(key.to_string()).or_insert_with(|| {
            *made += 1;
            Charge { id: *made, cents }
        });
        Ok(*charge)
    }

    /// `GET /charges?idempotency_key=key`, raising the key's fence to `token` first: from now
    /// on the attempt that was taken over cannot charge under it.
    pub async fn find(&self, key: &str, token: u64) -> Result<Option<Charge>, String> {
        let mut fences = self.fences.lock().unwrap();
        let fence = fences.entry(key.to_string()).or_default();
        *fence = (*fence).max(token);
        Ok(self.charges.lock().unwrap().get(key).copied())
    }
}

/// The reconcile: did the abandoned attempt's charge reach the gateway?
async fn charge_made(gateway: &Gateway) -> Result<Option<Charge>, idem::Error> {
    let key = idem::current_key().expect("inside the call");
    let token = idem::current_token().expect("inside the call");
    gateway.find(&key, token).await.map_err(idem::Error::Config)
}

#[idempotent(key = order, store = idem, skip(idem, gateway, dies), lease = "200ms",
             reconcile = charge_made(gateway))]
pub async fn pay(
    order: u64,
    cents: u64,
    idem: &Idem,
    gateway: &Gateway,
    dies: bool,
) -> Result<Charge, idem::Error> {
    let key = idem::current_key().expect("inside the call");
    let token = idem::current_token().expect("inside the call");
    let charge = gateway
        .charge(&key, token, cents)
        .await
        .map_err(idem::Error::Config)?;
    if dies {
        // The process dies here: the card is charged, the result is not stored.
        std::future::pending::<()>().await;
    }
    Ok(charge)
}

/// The story, returned for the test that runs it: the charge each call got, and how many
/// charges the gateway made.
pub async fn demo() -> (Vec<Charge>, u64) {
    let idem = Idem::memory();
    let gateway = Gateway::default();
    let died = tokio::time::timeout(
        Duration::from_millis(50),
        pay(42, 1999, &idem, &gateway, true),
    )
    .await;
    assert!(died.is_err(), "the first attempt died after the charge");
    // The next call comes after the abandoned attempt's lease lapsed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(pay(42, 1999, &idem, &gateway, false).await.unwrap());
    }
    let made = *gateway.made.lock().unwrap();
    (got, made)
}

#[tokio::main]
async fn main() {
    let (got, made) = demo().await;
    println!(
        "after a crash inside the window: calls got {got:?}; the gateway made {made} charge(s)"
    );
}
