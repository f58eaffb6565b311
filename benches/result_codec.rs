//! What the way to the store costs a replay: a handle with the local cache (no round trip)
//! against one that asks the store, and one that asks the store for an encrypted and
//! compressed value. Paired ratios (support/paired.rs) on the memory store and, with
//! `IDEM_TEST_POSTGRES_URL`, on PostgreSQL; written as the note `paired-result-codec.md`.
//!
//!   cargo bench -p idem-benches --bench result_codec

use idem::{CacheOptions, Idem, Keyring};
use std::sync::Arc;
use std::time::Duration;

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "support/postgres.rs"]
mod pg;

/// Keys the replays read, stored before they run.
const KEYS: u64 = 1024;
/// What each comparison measures; the first is compared with the others (first / other: above
/// 1, the other is faster).
const VARIANTS: [&str; 3] = ["store", "cached", "sealed"];

/// A receipt-like result of a few hundred bytes, so that compression has something to do.
fn receipt(n: u64) -> String {
    format!("order {n}: ").repeat(40)
}

/// The three handles on one store; each variant replays its own namespace.
fn handles(base: Idem) -> [(&'static str, Idem); 3] {
    let ring = Keyring::new("bench", [7; 32]).unwrap();
    [
        ("store", base.clone()),
        ("cached", base.clone().with_cache(CacheOptions::new())),
        ("sealed", base.with_encryption(ring).with_compression(256)),
    ]
}

async fn replay(idem: &Idem, name: &'static str, n: u64) {
    let out = idem
        .call(name)
        .key(&n)
        .ttl(Duration::from_secs(3600))
        .run(async move { Ok::<_, idem::Error>(receipt(n)) })
        .await
        .unwrap();
    debug_assert!(out.is_replayed());
}

fn compare(
    rt: &tokio::runtime::Runtime,
    label: &'static str,
    base: Idem,
) -> Vec<(&'static str, u64, paired::Paired)> {
    let handles = handles(base);
    rt.block_on(async {
        for (name, idem) in &handles {
            for n in 0..KEYS {
                replay(idem, name, n).await;
            }
        }
    });
    let ops: Vec<(&'static str, paired::Op)> = VARIANTS
        .iter()
        .map(|v| {
            let (name, idem) = handles.iter().find(|(n, _)| n == v).unwrap().clone();
            let op: paired::Op = Arc::new(move |i| {
                let idem = idem.clone();
                Box::pin(async move { replay(&idem, name, i % KEYS).await })
            });
            (name, op)
        })
        .collect();
    [1u64, 16]
        .into_iter()
        .map(|conc| (label, conc, paired::paired(rt, conc, &ops)))
        .collect()
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent: nothing to measure.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = drive::runtime();
    let mut rows = compare(&rt, "memory replay", Idem::memory());
    if let Some(url) = pg::bench_url("result_codec") {
        let base = rt.block_on(Idem::postgres(&url)).unwrap();
        rows.extend(compare(&rt, "postgres replay", base));
    }
    notes::write_note(
        "paired-result-codec.md",
        &paired::table("replays: store, local cache, encrypted + compressed", &rows),
    );
}
