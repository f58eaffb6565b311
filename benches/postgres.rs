//! Calls per second of the PostgreSQL store at concurrency 1, 16 and 64, fresh and replay,
//! against raw sqlx executing the same statements (`raw_same`: idem's own SQL text, bound the
//! same way) and the most minimal statements that do the same job (`raw_minimal`: a plain
//! INSERT + UPDATE for a fresh call, a SELECT by key for a replay).
//!
//! `IDEM_TEST_POSTGRES_URL` names the server; without it the bench does nothing. Both sides
//! run with `synchronous_commit = off`: otherwise the WAL flush of every commit (about 5 ms on
//! the development machine's disk) is all a fresh call measures, for idem and raw alike. Each
//! side has a pool of 40 connections (the server allows 100 in all).

use criterion::{criterion_group, criterion_main, Criterion};
use idem::store::postgres::{sqlx, PostgresOptions};
use idem::Idem;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Row;
use std::sync::Arc;

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "support/sql.rs"]
mod sql;
use sql::{idem_call, key_number, raw_key, Mode, REPLAY_KEYS};
#[path = "support/postgres.rs"]
mod pg;
use pg::bench_url;

const TABLE: &str = "idem_bench";
/// What each group compares, idem first: see the module docs.
const VARIANTS: [&str; 3] = ["idem", "raw_same", "raw_minimal"];

struct Setup {
    idem: Idem,
    pool: PgPool,
    claim: Arc<str>,
    complete: Arc<str>,
    channel: Arc<str>,
}

async fn raw_same(s: &Setup, mode: Mode, i: u64) {
    let n = key_number(mode, i);
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
            .bind(0i64) // no tombstone
            .fetch_optional(&s.pool)
            .await
            .unwrap();
    }
}

async fn raw_minimal(s: &Setup, mode: Mode, i: u64) {
    match mode {
        Mode::Fresh => {
            let key = raw_key(key_number(Mode::Fresh, i));
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
            let key = raw_key(key_number(Mode::Replay, i));
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
        let opts = PostgresOptions::from_url(&url)
            .unwrap()
            .table(TABLE)
            .max_connections(40);
        let store = opts.connect().await.unwrap();
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
            idem: Idem::from_store(store.clone()),
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
    sql::compare(
        c,
        &rt,
        "postgres",
        "PostgreSQL",
        VARIANTS,
        |mode, variant| op(&setup, mode, variant),
    );
}

/// One call of `variant` (`idem`, `raw_same` or `raw_minimal`).
fn op(setup: &Arc<Setup>, mode: Mode, variant: &'static str) -> paired::Op {
    let setup = setup.clone();
    Arc::new(move |i| {
        let s = setup.clone();
        Box::pin(async move {
            match variant {
                "idem" => idem_call(&s.idem, mode, i).await,
                "raw_same" => raw_same(&s, mode, i).await,
                _ => raw_minimal(&s, mode, i).await,
            }
        })
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
