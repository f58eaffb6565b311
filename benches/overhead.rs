//! Call overhead of `#[idempotent]` on the memory and SQLite stores, fresh and replay, against
//! the same function without the attribute, all measured in one run.
//!
//! Then the same at concurrency 1, 16 and 64 on a 2-worker runtime (groups `memory/fresh`,
//! `memory/replay`, `sqlite/fresh`, `sqlite/replay`; variants `idem` and `no_attribute`), the
//! shape every store's bench has, for `benches/report.sh`.
//!
//! `cargo bench -p idem-benches --bench overhead`

#[path = "support/drive.rs"]
mod drive;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use drive::drive;
use idem::{idempotent, Idem};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    id: u64,
    amount: u64,
}

/// The floor: the same function without the attribute.
async fn plain(order: u64, amount: u64) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        id: black_box(order),
        amount,
    })
}

#[idempotent(key = order, store = idem, skip(idem))]
async fn protected(order: u64, amount: u64, idem: &Idem) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        id: black_box(order),
        amount,
    })
}

static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

fn bench_store(c: &mut Criterion, rt: &tokio::runtime::Runtime, label: &str, idem: &Idem) {
    let mut g = c.benchmark_group("overhead");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    rt.block_on(protected(7, 100, idem)).unwrap();
    g.bench_function(BenchmarkId::new("replay", label), |b| {
        b.to_async(rt).iter(|| protected(7, 100, idem))
    });
    g.bench_function(BenchmarkId::new("fresh", label), |b| {
        b.to_async(rt)
            .iter(|| protected(NEXT.fetch_add(1, Ordering::Relaxed), 100, idem))
    });
    g.finish();
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    c.benchmark_group("overhead")
        .measurement_time(Duration::from_secs(2))
        .bench_function("baseline/no-attribute", |b| {
            b.to_async(&rt).iter(|| plain(7, 100))
        });
    bench_store(c, &rt, "memory", &Idem::memory());
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let sqlite = rt.block_on(Idem::sqlite(&url)).unwrap();
    bench_store(c, &rt, "sqlite", &sqlite);
    drop(sqlite);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Keys the replays read, stored before they run (spread over the memory store's shards).
const REPLAY_KEYS: u64 = 1024;

fn concurrent_store(c: &mut Criterion, rt: &tokio::runtime::Runtime, store: &str, idem: &Idem) {
    rt.block_on(async {
        for n in 0..REPLAY_KEYS {
            protected(n, 100, idem).await.unwrap();
        }
    });
    for (mode, fresh) in [("replay", false), ("fresh", true)] {
        let mut g = c.benchmark_group(format!("{store}/{mode}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(2))
            .throughput(Throughput::Elements(1));
        for conc in [1u64, 16, 64] {
            let key = move |i: u64| {
                if fresh {
                    NEXT.fetch_add(1, Ordering::Relaxed)
                } else {
                    i % REPLAY_KEYS
                }
            };
            let h = idem.clone();
            g.bench_with_input(BenchmarkId::new("idem", conc), &conc, |b, &conc| {
                b.iter_custom(|iters| {
                    let h = h.clone();
                    rt.block_on(drive(conc, iters, move |i| {
                        let h = h.clone();
                        async move {
                            protected(key(i), 100, &h).await.unwrap();
                        }
                    }))
                })
            });
            g.bench_with_input(BenchmarkId::new("no_attribute", conc), &conc, |b, &conc| {
                b.iter_custom(|iters| {
                    rt.block_on(drive(conc, iters, move |i| async move {
                        plain(key(i), 100).await.unwrap();
                    }))
                })
            });
        }
        g.finish();
    }
}

fn concurrent(c: &mut Criterion) {
    let rt = drive::runtime();
    concurrent_store(c, &rt, "memory", &Idem::memory());
    let dir = std::env::temp_dir().join(format!("idem-bench-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let sqlite = rt.block_on(Idem::sqlite(&url)).unwrap();
    concurrent_store(c, &rt, "sqlite", &sqlite);
    drop(sqlite);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, overhead, concurrent);
criterion_main!(benches);
