//! A checkout in three steps — reserve stock, charge the card, send the receipt — whose receipt
//! step fails on the first attempt. The retry replays the finished steps and runs only the
//! rest: the card is charged once and the receipt sent once.
//!
//! `cargo run --example checkout`

use idem::{idempotent, Idem};
use std::sync::atomic::{AtomicUsize, Ordering};

static RESERVED: AtomicUsize = AtomicUsize::new(0);
static CHARGED: AtomicUsize = AtomicUsize::new(0);
static MAILS_TRIED: AtomicUsize = AtomicUsize::new(0);
static MAILS_SENT: AtomicUsize = AtomicUsize::new(0);

/// The checkout's own error: its failures, plus idem's (every `#[idempotent]` function's error
/// type needs `From<idem::Error>`, so that a store failure or an in-progress duplicate reaches
/// the caller).
#[derive(Debug)]
enum CheckoutError {
    Idem(idem::Error),
    /// The mail server refused the receipt.
    Mail(String),
}

impl std::fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckoutError::Idem(e) => write!(f, "{e}"),
            CheckoutError::Mail(e) => write!(f, "mail: {e}"),
        }
    }
}

impl From<idem::Error> for CheckoutError {
    fn from(e: idem::Error) -> Self {
        CheckoutError::Idem(e)
    }
}

#[idempotent(step)]
async fn reserve_stock(order: u64, items: u32) -> Result<u32, CheckoutError> {
    RESERVED.fetch_add(1, Ordering::SeqCst);
    println!("  reserve_stock: {items} items for order {order}");
    Ok(items)
}

#[idempotent(step)]
async fn charge_card(order: u64, cents: u64) -> Result<String, CheckoutError> {
    CHARGED.fetch_add(1, Ordering::SeqCst);
    println!("  charge_card: {cents} cents for order {order}");
    Ok(format!("ch_{order}"))
}

async fn send_receipt(order: u64) -> Result<(), CheckoutError> {
    // The receipt is a block, not worth its own function: `idem::step`.
    idem::step(("receipt", order), || async move {
        if MAILS_TRIED.fetch_add(1, Ordering::SeqCst) == 0 {
            println!("  send_receipt: mail server unavailable");
            return Err(CheckoutError::Mail("server unavailable".into()));
        }
        MAILS_SENT.fetch_add(1, Ordering::SeqCst);
        println!("  send_receipt: sent for order {order}");
        Ok(())
    })
    .await
}

#[idempotent(key = order, ttl = "7d")]
async fn checkout(order: u64, items: u32, cents: u64) -> Result<String, CheckoutError> {
    reserve_stock(order, items).await?;
    let charge = charge_card(order, cents).await?;
    send_receipt(order).await?;
    Ok(charge)
}

#[tokio::main]
async fn main() {
    Idem::memory().install();
    for attempt in 1..=3 {
        println!("attempt {attempt}:");
        match checkout(1001, 2, 4_999).await {
            Ok(charge) => println!("  -> done, charge {charge}"),
            Err(e) => println!("  -> failed: {e}"),
        }
    }
    println!(
        "stock reserved {} time(s), card charged {} time(s), receipt sent {} time(s) ({} tries)",
        RESERVED.load(Ordering::SeqCst),
        CHARGED.load(Ordering::SeqCst),
        MAILS_SENT.load(Ordering::SeqCst),
        MAILS_TRIED.load(Ordering::SeqCst),
    );
}
