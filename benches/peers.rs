//! idem's memory store against in-memory peers doing the same job, in one run (c = 1):
//!
//! - `idempotent` 0.3 (its `MemoryStore`: claim with `try_insert`, run, `complete`, replay the
//!   cached response), driven the way its docs describe;
//! - `agent-effects` 0.2 with `agent-effects-memory` (`Runtime::effect(..).run(..)`);
//! - `cached` 4 (`#[cached]` on an async fn): memoisation, no claim, so replay only.
//!
//! Groups `peers/fresh` and `peers/replay`; variant `idem` is `#[idempotent]` on `Idem::memory()`.
//! `cargo bench -p idem-benches --bench peers`.

#[path = "support/agent_effects.rs"]
mod agent_effects_peer;

use agent_effects_peer::{with_agent_effects, Receipt};
use cached::proc_macro::cached;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idem::{idempotent, Idem};
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
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

criterion_group!(benches, bench);
criterion_main!(benches);
