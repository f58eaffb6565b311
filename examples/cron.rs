//! Three schedulers fire the same monthly invoice job at once; each (customer, period) is
//! invoiced once. The key is the hash of the arguments: no key to invent.
//!
//! `cargo run --example cron`

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct CustomerId(u32);

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct YearMonth {
    year: u16,
    month: u8,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct InvoiceId(usize);

#[derive(Debug)]
enum Error {
    Idem(idem::Error),
}

impl From<idem::Error> for Error {
    fn from(e: idem::Error) -> Self {
        Error::Idem(e)
    }
}

/// The invoices table.
#[derive(Default)]
struct Db {
    invoices: Mutex<Vec<(CustomerId, YearMonth)>>,
}

#[idempotent(name = "monthly-invoice", ttl = "40d", lease = "1m", skip(db))]
async fn invoice(customer: CustomerId, period: YearMonth, db: &Db) -> Result<InvoiceId, Error> {
    tokio::time::sleep(Duration::from_millis(20)).await; // render and send the invoice
    let mut invoices = db.invoices.lock().unwrap();
    invoices.push((customer, period));
    Ok(InvoiceId(invoices.len()))
}

#[tokio::main]
async fn main() -> Result<(), idem::Error> {
    let dir = std::env::temp_dir().join(format!("idem-cron-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    Idem::sqlite(&url).await?.install();

    let db = Arc::new(Db::default());
    let period = YearMonth {
        year: 2026,
        month: 11,
    };
    let schedulers: Vec<_> = (1..=3)
        .map(|instance| {
            let db = db.clone();
            tokio::spawn(async move {
                let (mut ran, mut skipped) = (0, 0);
                for c in 1..=10 {
                    match invoice(CustomerId(c), period, &db).await {
                        Ok(_) => ran += 1,
                        // Another instance is on it right now: nothing to do here.
                        Err(Error::Idem(e)) if e.is_in_progress() => skipped += 1,
                        Err(e) => panic!("scheduler {instance}: {e:?}"),
                    }
                }
                println!("scheduler {instance}: {ran} answered (run or replayed), {skipped} left to another instance");
            })
        })
        .collect();
    for s in schedulers {
        s.await.expect("scheduler");
    }

    let mut per_key: BTreeMap<(CustomerId, YearMonth), usize> = BTreeMap::new();
    for k in db.invoices.lock().unwrap().iter() {
        *per_key.entry(*k).or_default() += 1;
    }
    let doubled = per_key.values().filter(|n| **n > 1).count();
    println!(
        "{} invoices for {} customers in {}-{:02}; invoiced twice: {doubled}",
        per_key.values().sum::<usize>(),
        per_key.len(),
        period.year,
        period.month
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
