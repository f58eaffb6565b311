//! idem's memory store against in-memory peers doing the same job, in one run (c = 1):
//!
//! - `idempotent` 0.3 (its `MemoryStore`: claim with `try_insert`, run, `complete`, replay the
//!   cached response), driven the way its docs describe;
//! - `agent-effects` 0.2 with `agent-effects-memory` (`Runtime::effect(..).run(..)`);
//! - `cached` 4 (`#[cached]` on an async fn): memoisation, no claim, so replay only.
//!
//! Groups `peers/fresh` and `peers/replay`; variant `idem` is `#[idempotent]` on `Idem::memory()`.
//! Then, outside criterion, the replay of `idem` against `cached` as paired ratios
//! (support/paired.rs) at c = 1 and c = 16, written as the note `paired-peers-replay.md`: the
//! figure issue 24 asks to be within 2×; beside them the floor of any replay from stored bytes,
//! a map lookup and the decode of the stored JSON (`lookup + decode`); and the same two replays
//! of a unit result, whose decode is next to nothing, so that the ratio shows what idem's replay
//! costs besides the decode. `cargo bench -p idem-benches --bench peers`.

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;

#[path = "support/agent_effects.rs"]
mod agent_effects_peer;

use agent_effects_peer::{with_agent_effects, Receipt};
use cached::proc_macro::cached;
use criterion::{criterion_group, BenchmarkId, Criterion};
use idem::{idempotent, Idem};
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(86_400);
const REPLAYED: u64 = 7;
static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

#[idempotent(key = order, store = idem, skip(idem))]
async fn with_idem(order: u64, amount: u64, idem: &Idem) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        id: black_box(order),
        amount,
    })
}

/// The `idempotent` crate's protocol, as its docs lay it out: claim, run, store the response;
/// a completed entry is replayed from its cached body.
async fn with_idempotent(store: &idempotent::store::memory::MemoryStore, order: u64) -> Receipt {
    let key = IdempotencyKey::new(order.to_string()).unwrap();
    let fingerprint = DefaultFingerprintStrategy.compute("bench", &order.to_be_bytes());
    let entry = IdempotencyEntry::new(fingerprint, TTL);
    match store.try_insert(&key, entry.clone()).await.unwrap() {
        InsertResult::Claimed { fencing_token } => {
            let receipt = Receipt {
                id: black_box(order),
                amount: 100,
            };
            let body = serde_json::to_vec(&receipt).unwrap();
            let response = CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body: body.into(),
            };
            store
                .complete(&key, entry.complete(response), fencing_token)
                .await
                .unwrap();
            receipt
        }
        InsertResult::Exists(ExistingEntry::Completed(done)) => {
            serde_json::from_slice(&done.response().body).unwrap()
        }
        InsertResult::Exists(ExistingEntry::Processing(_)) => panic!("in progress"),
    }
}

/// [`with_idem`] with a result that takes next to nothing to decode (`null`), for the paired
/// replays: what a replay costs besides the decode.
#[idempotent(key = order, store = idem, skip(idem))]
async fn with_idem_unit(order: u64, idem: &Idem) -> Result<(), idem::Error> {
    black_box(order);
    Ok(())
}

/// [`with_cached`] with a unit result, the peer of [`with_idem_unit`].
#[cached]
async fn with_cached_unit(order: u64) {
    black_box(order);
}

#[cached]
async fn with_cached(order: u64) -> Receipt {
    Receipt {
        id: black_box(order),
        amount: 100,
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let idem = Idem::memory();
    let idempotent_store = rt.block_on(async {
        idempotent::store::memory::MemoryStore::new(1024, Duration::from_secs(3600))
    });
    let effects = agent_effects::Runtime::new(agent_effects_memory::MemoryStore::new());
    rt.block_on(async {
        with_idem(REPLAYED, 100, &idem).await.unwrap();
        with_idempotent(&idempotent_store, REPLAYED).await;
        with_agent_effects(&effects, REPLAYED).await;
        with_cached(REPLAYED).await;
    });
    for (mode, fresh) in [("replay", false), ("fresh", true)] {
        let mut g = c.benchmark_group(format!("peers/{mode}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(2));
        let key = move || {
            if fresh {
                NEXT.fetch_add(1, Ordering::Relaxed)
            } else {
                REPLAYED
            }
        };
        g.bench_function(BenchmarkId::new("idem", 1), |b| {
            b.to_async(&rt)
                .iter(|| async { with_idem(key(), 100, &idem).await.unwrap() })
        });
        g.bench_function(BenchmarkId::new("idempotent", 1), |b| {
            b.to_async(&rt)
                .iter(|| with_idempotent(&idempotent_store, key()))
        });
        g.bench_function(BenchmarkId::new("agent_effects", 1), |b| {
            b.to_async(&rt).iter(|| with_agent_effects(&effects, key()))
        });
        if !fresh {
            g.bench_function(BenchmarkId::new("cached", 1), |b| {
                b.to_async(&rt).iter(|| with_cached(key()))
            });
        }
        g.finish();
    }
}

/// The floor of any replay from stored bytes, for the paired replays: `cached`'s lookup (a map
/// behind a lock) plus the decode of the stored JSON into the caller's type, with nothing else
/// (no key encoding, no digest, no claim, no fingerprint check, no expiry).
fn with_stored(order: u64) -> Receipt {
    static STORED: OnceLock<std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>> =
        OnceLock::new();
    let stored = STORED.get_or_init(|| {
        let receipt = Receipt {
            id: REPLAYED,
            amount: 100,
        };
        let bytes = serde_json::to_vec(&receipt).unwrap();
        std::sync::Mutex::new([(REPLAYED, bytes)].into())
    });
    let map = stored.lock().unwrap();
    serde_json::from_slice(&map[&order]).unwrap()
}

/// The handle the paired replays share: `'static`, so that a call borrows it as
/// `criterion`'s loop does, with no clone on the idem side only.
static PAIRED_IDEM: OnceLock<Idem> = OnceLock::new();

/// The replay of one key, idem against `cached` and against the floor of a replay from stored
/// bytes ([`with_stored`]), in alternation (support/paired.rs): no call boxed, all driven by
/// the same tasks (support/drive.rs).
fn paired_replays() {
    let rt = drive::runtime();
    let idem = PAIRED_IDEM.get_or_init(Idem::memory);
    rt.block_on(async {
        with_idem(REPLAYED, 100, idem).await.unwrap();
        with_cached(REPLAYED).await;
        with_idem_unit(REPLAYED, idem).await.unwrap();
        with_cached_unit(REPLAYED).await;
    });
    let rows = at_each_concurrency(
        "replay",
        &["idem", "cached", "lookup + decode"],
        |conc, v, calls| match v {
            0 => rt.block_on(drive::drive(conc, calls, |_| async {
                let idem = PAIRED_IDEM.get().expect("set above");
                black_box(with_idem(REPLAYED, 100, idem).await.unwrap());
            })),
            1 => rt.block_on(drive::drive(conc, calls, |_| async {
                black_box(with_cached(REPLAYED).await);
            })),
            _ => rt.block_on(drive::drive(conc, calls, |_| async {
                black_box(with_stored(REPLAYED));
            })),
        },
    );
    // The same with a unit result: the decode, which `cached` never does, next to nothing.
    let units = at_each_concurrency(
        "replay of ()",
        &["idem", "cached"],
        |conc, v, calls| match v {
            0 => rt.block_on(drive::drive(conc, calls, |_| async {
                let idem = PAIRED_IDEM.get().expect("set above");
                with_idem_unit(REPLAYED, idem).await.unwrap();
            })),
            _ => rt.block_on(drive::drive(conc, calls, |_| async {
                with_cached_unit(REPLAYED).await;
            })),
        },
    );
    let mut note = paired::table(
        "memory store replays: idem against the memoiser cached",
        &rows,
    );
    note.push('\n');
    note.push_str(&paired::table(
        "memory store replays of a unit result (nothing to decode to speak of)",
        &units,
    ));
    notes::write_note("paired-peers-replay.md", &note);
}

/// The paired comparison of `names` at c = 1 and c = 16, as rows of a [`paired::table`]:
/// `run(conc, v, calls)` makes `calls` calls of variant `v` at concurrency `conc`.
fn at_each_concurrency(
    call: &'static str,
    names: &[&'static str],
    run: impl Fn(u64, usize, u64) -> Duration,
) -> Vec<(&'static str, u64, paired::Paired)> {
    [1u64, 16]
        .into_iter()
        .map(|conc| {
            let p = paired::paired_by(conc, names, |v, calls| run(conc, v, calls));
            (call, conc, p)
        })
        .collect()
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // `cargo test --benches` runs bench binaries with `--bench` absent: nothing to measure.
    if std::env::args().any(|a| a == "--bench") {
        paired_replays();
    }
}
