//! Contention: 1 000 concurrent duplicates of one key on each store, the time until all have
//! their answer (one runs the body, 999 wait and replay). Every round asserts, through
//! `idem::testkit::stampede`, that the body ran exactly once.
//!
//! Memory and SQLite always; PostgreSQL with `IDEM_TEST_POSTGRES_URL`, Redis with
//! `IDEM_TEST_REDIS_URL`. `cargo bench -p idem-benches --bench contention`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use idem::testkit::stampede;
use idem::Idem;
use std::time::Duration;

const DUPLICATES: usize = 1000;
/// How long the one execution takes: the others find it in flight and wait for its result.
const BODY: std::time::Duration = std::time::Duration::from_millis(1);

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sqlite_url = format!("sqlite://{}", dir.path().join("contention.db").display());
    // Pushed to only with the `postgres` or `redis` feature.
    #[allow(unused_mut)]
    let mut stores = vec![
        ("memory", Idem::memory()),
        ("sqlite", rt.block_on(Idem::sqlite(&sqlite_url)).unwrap()),
    ];
    #[cfg(feature = "postgres")]
    match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) => stores.push(("postgres", rt.block_on(Idem::postgres(&url)).unwrap())),
        Err(_) => eprintln!("skipped: postgres contention (IDEM_TEST_POSTGRES_URL is not set)"),
    }
    #[cfg(feature = "redis")]
    match std::env::var("IDEM_TEST_REDIS_URL") {
        Ok(url) => stores.push(("redis", rt.block_on(Idem::redis(&url)).unwrap())),
        Err(_) => eprintln!("skipped: redis contention (IDEM_TEST_REDIS_URL is not set)"),
    }
    let mut g = c.benchmark_group("contention");
    // One round is one stampede (tens to hundreds of ms): a few flat samples are enough.
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (label, idem) in &stores {
        g.bench_with_input(
            BenchmarkId::new(*label, DUPLICATES),
            idem,
            |b, idem: &Idem| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| rt.block_on(stampede(idem, DUPLICATES, BODY)))
                        .sum()
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
