//! Calls per second of the PostgreSQL store at concurrency 1, 16 and 64, fresh and replay,
//! against raw sqlx executing the same statements (`raw_same`: idem's own SQL text, bound the
//! same way) and the most minimal statements that do the same job (`raw_minimal`: a plain
//! INSERT + UPDATE for a fresh call, a SELECT by key for a replay).
//!
//! `IDEM_TEST_POSTGRES_URL` names the server; without it the bench does nothing. Both sides
//! run with `synchronous_commit = off`: otherwise the WAL flush of every commit (about 5 ms on
//! the development machine's disk) is all a fresh call measures, for idem and raw alike. Each
//! side has a pool of 40 connections (the server allows 100 in all).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idem::store::postgres::{sqlx, PostgresOptions, PostgresStore};
use idem::Idem;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;
use std::sync::atomic::{AtomicU64, Ordering};
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
use pg::bench_url;

const TABLE: &str = "idem_bench";
/// What each group compares, idem first: see the module docs.
const VARIANTS: [&str; 3] = ["idem", "raw_same", "raw_minimal"];
const REPLAY_KEYS: u64 = 1024;
static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

/// A raw key: a sha256 digest like idem's (spread over the index as idem's are), in a
/// namespace of its own.
fn raw_key(n: u64) -> [u8; 32] {
    idem::key::key_digest("raw-bench", None, &n.to_be_bytes()).0
}

#[derive(Clone, Copy)]
enum Mode {
    Fresh,
    Replay,
}

struct Setup {
    idem: Idem,
    pool: PgPool,
    claim: Arc<str>,
    complete: Arc<str>,
    channel: Arc<str>,
}

async fn idem_call(s: &Setup, mode: Mode, i: u64) {
    let n = match mode {
        Mode::Fresh => NEXT.fetch_add(1, Ordering::Relaxed),
        Mode::Replay => i % REPLAY_KEYS,
    };
    let out = s
        .idem
        .call("bench")
        .key(&n)
        .run(async move { Ok::<_, idem::Error>(n) })
        .await
        .unwrap();
    debug_assert_eq!(out.is_replayed(), matches!(mode, Mode::Replay));
}

async fn raw_same(s: &Setup, mode: Mode, i: u64) {
    let n = match mode {
        Mode::Fresh => NEXT.fetch_add(1, Ordering::Relaxed),
        Mode::Replay => i % REPLAY_KEYS,
    };
    let key = raw_key(n);
    let r = sqlx::query(&s.claim)
        .bind(&key[..])
        .bind("bench")
        .bind(&key[..])
        .bind(30_000i64)
        .fetch_one(&s.pool)
        .await
        .unwrap();
    let claimed: bool = r.get(0);
    if claimed {
        let token: i64 = r.get(3);
        sqlx::query(&s.complete)
            .bind(&key[..])
            .bind(token)
            .bind(&n.to_be_bytes()[..])
            .bind(86_400_000i64)
            .bind(&*s.channel)
            .fetch_optional(&s.pool)
            .await
            .unwrap();
    }
}

async fn raw_minimal(s: &Setup, mode: Mode, i: u64) {
    match mode {
        Mode::Fresh => {
            let key = raw_key(NEXT.fetch_add(1, Ordering::Relaxed));
            sqlx::query(&format!(
                "INSERT INTO {TABLE} (key, name, fingerprint, token, status, created_at, expires_at) \
                 VALUES ($1, 'bench', $1, 1, 0, 0, 9000000000000)"
            ))
            .bind(&key[..])
            .execute(&s.pool)
            .await
            .unwrap();
            sqlx::query(&format!(
                "UPDATE {TABLE} SET status = 1, value = $2 WHERE key = $1 AND token = 1 AND status = 0"
            ))
            .bind(&key[..])
            .bind(&key[..8])
            .execute(&s.pool)
            .await
            .unwrap();
        }
        Mode::Replay => {
            let key = raw_key(i % REPLAY_KEYS);
            let _: Option<(Option<Vec<u8>>,)> =
                sqlx::query_as(&format!("SELECT value FROM {TABLE} WHERE key = $1"))
                    .bind(&key[..])
                    .fetch_optional(&s.pool)
                    .await
                    .unwrap();
        }
    }
}

fn bench(c: &mut Criterion) {
    let Some(url) = bench_url("postgres") else {
        return;
    };
    let rt = drive::runtime();
    let setup = rt.block_on(async {
        let opts = PostgresOptions::new().table(TABLE).max_connections(40);
        let store = PostgresStore::open_with(&url, opts).await.unwrap();
        sqlx::query(&format!("TRUNCATE {TABLE}"))
            .execute(store.pool())
            .await
            .unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(40)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .unwrap();
        let setup = Setup {
            idem: store.idem(),
            claim: store.statement_text("claim").unwrap().into(),
            complete: store.statement_text("complete").unwrap().into(),
            channel: format!("idem_{TABLE}").into(),
            pool,
        };
        // The keys replays read: stored by idem, and the same keys' raw twins.
        for n in 0..REPLAY_KEYS {
            setup
                .idem
                .call("bench")
                .key(&n)
                .run(async move { Ok::<_, idem::Error>(n) })
                .await
                .unwrap();
            raw_same(&setup, Mode::Replay, n).await;
        }
        Arc::new(setup)
    });

    // Replays first, on a table that fresh inserts have not yet bloated (autovacuum after them
    // would load whichever bench runs next). Inside a group, the order of the variants rotates
    // with the concurrency, so neither side always runs first.
    rt.block_on(async {
        sqlx::query(&format!("VACUUM ANALYZE {TABLE}"))
            .execute(&setup.pool)
            .await
            .unwrap();
    });
    for (mode, label) in [(Mode::Replay, "replay"), (Mode::Fresh, "fresh")] {
        let mut g = c.benchmark_group(format!("postgres/{label}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Elements(1));
        for (round, conc) in [1u64, 16, 64].into_iter().enumerate() {
            let mut variants = VARIANTS;
            variants.rotate_left(round);
            for variant in variants {
                let op = op(&setup, mode, variant);
                g.bench_with_input(BenchmarkId::new(variant, conc), &conc, |b, &conc| {
                    b.iter_custom(|iters| {
                        let op = op.clone();
                        rt.block_on(drive::drive(conc, iters, move |i| op(i)))
                    })
                });
            }
        }
        g.finish();
    }

    // The same comparisons as paired ratios (see support/paired.rs).
    let mut rows = Vec::new();
    for (mode, label) in [(Mode::Replay, "replay"), (Mode::Fresh, "fresh")] {
        for conc in [1u64, 16, 64] {
            let variants: Vec<_> = VARIANTS.map(|v| (v, op(&setup, mode, v))).into();
            rows.push((label, conc, paired::paired(&rt, conc, &variants)));
        }
    }
    notes::write_note("paired-postgres.md", &paired::table("PostgreSQL", &rows));
}

/// One call of `variant` (`idem`, `raw_same` or `raw_minimal`).
fn op(setup: &Arc<Setup>, mode: Mode, variant: &'static str) -> paired::Op {
    let setup = setup.clone();
    Arc::new(move |i| {
        let s = setup.clone();
        Box::pin(async move {
            match variant {
                "idem" => idem_call(&s, mode, i).await,
                "raw_same" => raw_same(&s, mode, i).await,
                _ => raw_minimal(&s, mode, i).await,
            }
        })
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
