//! The README's three incidents, each replayed against a payment gateway that charges whatever
//! it is asked to: alice double-clicks "Pay", bob's phone reconnects and retries, carol's
//! payment message is redelivered by the broker. Once unprotected, once with `#[idempotent]` on
//! the embedded SQLite store; every call's outcome, then both ledgers.
//!
//! `cargo run --example payments`

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
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
}

/// A payment gateway that does not deduplicate: every request is a charge.
#[derive(Default)]
struct Gateway {
    ledger: Mutex<Vec<String>>,
}

impl Gateway {
    async fn charge(&self, customer: &str) -> Receipt {
        tokio::time::sleep(Duration::from_millis(200)).await; // the bank is slow
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push(customer.to_string());
        Receipt {
            charge_id: ledger.len(),
        }
    }

    fn charges_of(&self, customer: &str) -> usize {
        let ledger = self.ledger.lock().unwrap();
        ledger.iter().filter(|c| *c == customer).count()
    }
}

/// The handler, idempotent on the client's key. `ran` is here only so that this example can
/// print whether the body ran (fresh) or the stored receipt came back (replayed).
#[idempotent(key = req.idempotency_key, skip(gateway, ran), ttl = "24h")]
async fn charge(
    req: ChargeRequest,
    gateway: &Gateway,
    ran: &AtomicBool,
) -> Result<Receipt, idem::Error> {
    ran.store(true, Ordering::Relaxed);
    // A real gateway takes an idempotency key too: pass on this call's stable id.
    let _downstream_key = idem::current_key();
    Ok(gateway.charge(&req.customer).await)
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Unprotected,
    Idempotent,
}

/// One call, as the client saw it.
async fn call(mode: Mode, gateway: Arc<Gateway>, req: ChargeRequest) -> String {
    if mode == Mode::Unprotected {
        let receipt = gateway.charge(&req.customer).await;
        return format!("charged #{}", receipt.charge_id);
    }
    let ran = AtomicBool::new(false);
    match charge(req, &gateway, &ran).await {
        Ok(r) if ran.load(Ordering::Relaxed) => format!("fresh: charged #{}", r.charge_id),
        Ok(r) => format!("replayed #{}", r.charge_id),
        Err(e) if e.is_in_progress() => "in progress: not charged".to_string(),
        Err(e) => format!("failed: {e}"),
    }
}

/// Calls with the same payment at the given times (ms from the first), concurrently; returns
/// what each caller got, in the order they were sent.
async fn calls(mode: Mode, gateway: &Arc<Gateway>, customer: &str, at_ms: &[u64]) -> Vec<String> {
    let req = ChargeRequest {
        idempotency_key: format!("pay-{customer}"),
        customer: customer.to_string(),
        amount_cents: 4_999,
    };
    let tasks: Vec<_> = at_ms
        .iter()
        .map(|&ms| {
            let (gateway, req) = (gateway.clone(), req.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                call(mode, gateway, req).await
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.expect("call task"));
    }
    seen
}

#[tokio::main]
async fn main() -> Result<(), idem::Error> {
    let dir = std::env::temp_dir().join(format!("idem-payments-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Idem::sqlite(&format!("sqlite://{}", dir.join("idem.db").display()))
        .await?
        .install();

    // (customer, what happened, the calls' names, when each call is sent in ms)
    let incidents: [(&str, &str, [&str; 3], &[u64]); 3] = [
        (
            "alice",
            "— a double click: two identical requests at once",
            ["click 1", "click 2", ""],
            &[0, 0],
        ),
        (
            "bob",
            "— a retry after a reconnect: the app retries while the charge runs, then again",
            ["request", "retry", "retry"],
            &[0, 50, 600],
        ),
        (
            "carol",
            "— a redelivery after an ack timeout (100 ms): sent again while it runs, and after",
            ["delivery", "again", "again"],
            &[0, 100, 600],
        ),
    ];
    let ledgers = [
        (Mode::Unprotected, Arc::new(Gateway::default())),
        (Mode::Idempotent, Arc::new(Gateway::default())),
    ];

    for (customer, story, names, at_ms) in incidents {
        println!("{customer} {story}");
        for (mode, gateway) in &ledgers {
            let seen = calls(*mode, gateway, customer, at_ms).await;
            let seen: Vec<String> = names
                .iter()
                .zip(seen)
                .map(|(n, s)| format!("{n}: {s}"))
                .collect();
            let label = match mode {
                Mode::Unprotected => "unprotected",
                Mode::Idempotent => "#[idempotent]",
            };
            println!("  {label:<14}{}", seen.join(" · "));
        }
    }

    println!("\nThe gateway's ledgers (charges per customer, 3 payments made):");
    for (mode, gateway) in &ledgers {
        let label = match mode {
            Mode::Unprotected => "unprotected",
            Mode::Idempotent => "#[idempotent]",
        };
        let per: Vec<String> = ["alice", "bob", "carol"]
            .iter()
            .map(|c| format!("{c} {}", gateway.charges_of(c)))
            .collect();
        let total = gateway.ledger.lock().unwrap().len();
        println!("  {label:<14}{}   {total} charges", per.join("  "));
    }

    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
