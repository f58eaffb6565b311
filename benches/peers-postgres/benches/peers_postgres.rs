//! idem's PostgreSQL store against `agent-effects` 0.2 with `agent-effects-postgres` on the same
//! server, the same work (a no-op body returning a small struct), fresh and replay, at
//! concurrency 1, 16 and 64. Groups `peers_postgres/fresh` and `peers_postgres/replay`.
//!
//! Both sides get a pool of 40 connections and `synchronous_commit = off` (as in
//! `benches/postgres.rs`: otherwise each commit's WAL flush is all a fresh call measures).
//! agent-effects keeps its tables in a schema of its own, `idem_bench_agent_effects`.
//!
//! `IDEM_TEST_POSTGRES_URL` names the server; without it the bench does nothing. Run it from
//! the repository root with `benches/report.sh`, or alone:
//! `CARGO_TARGET_DIR=target cargo bench --manifest-path benches/peers-postgres/Cargo.toml`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::Idem;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[path = "../../support/agent_effects.rs"]
mod agent_effects_peer;
#[path = "../../support/drive.rs"]
mod drive;
#[path = "../../support/postgres.rs"]
mod pg;
use agent_effects_peer::{with_agent_effects, Receipt};
use pg::bench_url;

const TABLE: &str = "idem_bench_peers";
const SCHEMA: &str = "idem_bench_agent_effects";
const REPLAY_KEYS: u64 = 1024;
/// Fresh keys start above the replayed ones and above any earlier run's (agent-effects keeps
/// its rows; a key it has seen would be a replay).
static NEXT: AtomicU64 = AtomicU64::new(0);

async fn with_idem(idem: &Idem, order: u64) -> Receipt {
    idem.call("bench")
        .key(&order)
        .run(async move {
            Ok::<_, idem::Error>(Receipt {
                id: black_box(order),
                amount: 100,
            })
        })
        .await
        .unwrap()
        .into_inner()
}

fn bench(c: &mut Criterion) {
    let Some(url) = bench_url("peers_postgres") else {
        return;
    };
    let rt = drive::runtime();
    let (idem, effects) = rt.block_on(async {
        let opts = PostgresOptions::from_url(&url)
            .unwrap()
            .table(TABLE)
            .max_connections(40);
        let store = opts.connect().await.unwrap();
        let effects = agent_effects_postgres::PostgresOptions::new()
            .schema(SCHEMA)
            .max_connections(40)
            .connect(&url)
            .await
            .unwrap();
        (
            Idem::from_store(store.clone()),
            Arc::new(agent_effects::Runtime::new(effects)),
        )
    });
    // Above every key an earlier run used, on either side.
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    NEXT.store(start, Ordering::Relaxed);
    rt.block_on(async {
        for n in 0..REPLAY_KEYS {
            with_idem(&idem, n).await;
            with_agent_effects(&effects, n).await;
        }
    });

    for (label, fresh) in [("replay", false), ("fresh", true)] {
        let key = move |i: u64| {
            if fresh {
                NEXT.fetch_add(1, Ordering::Relaxed)
            } else {
                i % REPLAY_KEYS
            }
        };
        let mut g = c.benchmark_group(format!("peers_postgres/{label}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Elements(1));
        for (round, conc) in [1u64, 16, 64].into_iter().enumerate() {
            // The order rotates with the concurrency, so neither side always runs first.
            let mut variants = ["idem", "agent_effects"];
            variants.rotate_left(round % 2);
            for variant in variants {
                g.bench_with_input(BenchmarkId::new(variant, conc), &conc, |b, &conc| {
                    b.iter_custom(|iters| {
                        let (idem, effects) = (idem.clone(), effects.clone());
                        rt.block_on(drive::drive(conc, iters, move |i| {
                            let (idem, effects) = (idem.clone(), effects.clone());
                            async move {
                                let n = key(i);
                                let r = match variant {
                                    "idem" => with_idem(&idem, n).await,
                                    _ => with_agent_effects(&effects, n).await,
                                };
                                debug_assert_eq!(r.id, n);
                            }
                        }))
                    })
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
