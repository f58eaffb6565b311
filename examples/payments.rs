//! Three incidents that charge a customer twice, replayed against a fake payment gateway:
//! once unprotected, once with `#[idempotent]` on the embedded SQLite store.
//!
//! `cargo run --example payments`

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeRequest {
    /// Chosen by the client, the same on every retry of one payment.
    idempotency_key: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    charge_id: usize,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug)]
enum PayError {
    Idem(idem::Error),
}

impl std::fmt::Display for PayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayError::Idem(e) => write!(f, "payment not processed: {e}"),
        }
    }
}

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError::Idem(e)
    }
}

/// A payment gateway that charges whatever it is asked to: it does not deduplicate.
#[derive(Default)]
struct Gateway {
    ledger: Mutex<Vec<(String, u64)>>,
}

impl Gateway {
    async fn charge(&self, customer: &str, amount_cents: u64) -> Result<Receipt, PayError> {
        tokio::time::sleep(Duration::from_millis(200)).await; // the bank is slow
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((customer.to_string(), amount_cents));
        Ok(Receipt {
            charge_id: ledger.len(),
            customer: customer.to_string(),
            amount_cents,
        })
    }
}

async fn charge_unprotected(req: ChargeRequest, gateway: &Gateway) -> Result<Receipt, PayError> {
    gateway.charge(&req.customer, req.amount_cents).await
}

/// The same handler, idempotent on the client's key. A duplicate that arrives while the first
/// attempt runs waits for it (`wait`) and gets the same receipt.
#[idempotent(key = req.idempotency_key, skip(gateway), ttl = "24h", wait = "5s")]
async fn charge(req: ChargeRequest, gateway: &Gateway) -> Result<Receipt, PayError> {
    // A real gateway takes an idempotency key too: pass on this call's stable id.
    let _downstream_key = idem::current_key().expect("inside an idempotent call");
    gateway.charge(&req.customer, req.amount_cents).await
}

#[derive(Clone, Copy)]
enum Handler {
    Unprotected,
    Protected,
}

async fn handle(
    h: Handler,
    req: ChargeRequest,
    gateway: Arc<Gateway>,
) -> Result<Receipt, PayError> {
    match h {
        Handler::Unprotected => charge_unprotected(req, &gateway).await,
        Handler::Protected => charge(req, &gateway).await,
    }
}

fn request(key: &str, customer: &str) -> ChargeRequest {
    ChargeRequest {
        idempotency_key: key.to_string(),
        customer: customer.to_string(),
        amount_cents: 4_999,
    }
}

/// Replays the three incidents; returns the gateway's ledger.
async fn incidents(h: Handler) -> Vec<(String, u64)> {
    let gateway = Arc::new(Gateway::default());
    let tag = match h {
        Handler::Unprotected => "u",
        Handler::Protected => "p",
    };

    // 1. A double click: two identical requests at once.
    let alice = request(&format!("{tag}-alice-1"), "alice");
    let (a, b) = tokio::join!(
        handle(h, alice.clone(), gateway.clone()),
        handle(h, alice, gateway.clone())
    );
    for r in [a, b] {
        if let Err(e) = r {
            panic!("{e}");
        }
    }

    // 2. A phone loses signal: the charge went through, the response did not; the app
    //    reconnects and retries with the same key while the server is still working.
    let bob = request(&format!("{tag}-bob-1"), "bob");
    let first = tokio::spawn(handle(h, bob.clone(), gateway.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await; // the client gives up waiting
    handle(h, bob, gateway.clone()).await.unwrap();
    first.await.unwrap().unwrap();

    // 3. A broker redelivers: the consumer is slower than its ack timeout (100 ms), so the
    //    message is delivered again while it runs, and once more after the lost ack.
    let carol = request(&format!("{tag}-carol-1"), "carol");
    let mut deliveries = Vec::new();
    for delay in [0, 100, 400] {
        let (req, gateway) = (carol.clone(), gateway.clone());
        deliveries.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            handle(h, req, gateway).await
        }));
    }
    for d in deliveries {
        d.await.unwrap().unwrap();
    }

    let ledger = gateway.ledger.lock().unwrap().clone();
    ledger
}

fn print_ledger(title: &str, ledger: &[(String, u64)]) {
    let mut per_customer: BTreeMap<&str, usize> = BTreeMap::new();
    for (customer, _) in ledger {
        *per_customer.entry(customer).or_default() += 1;
    }
    let twice: Vec<String> = per_customer
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(c, n)| format!("{c} ({n}x)"))
        .collect();
    println!("{title}");
    for (customer, n) in &per_customer {
        println!("  {customer:<6} charged {n} time(s)");
    }
    println!(
        "  {} charges for 3 payments; customers charged more than once: {}",
        ledger.len(),
        if twice.is_empty() {
            "none".to_string()
        } else {
            twice.join(", ")
        }
    );
}

#[tokio::main]
async fn main() -> Result<(), idem::Error> {
    let dir = std::env::temp_dir().join(format!("idem-payments-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    Idem::sqlite(&url).await?.install();

    let unprotected = incidents(Handler::Unprotected).await;
    print_ledger("Unprotected handler:", &unprotected);
    let protected = incidents(Handler::Protected).await;
    print_ledger("With #[idempotent] (SQLite store):", &protected);

    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
