//! Calls per second of the MySQL / MariaDB store at concurrency 1, 16 and 64, fresh and replay,
//! against raw sqlx executing the same statements (`raw`: the store's own SQL text, bound the
//! same way, one round trip after another as the store makes them) and the least MySQL can do
//! for the same job without fencing or fingerprints (`raw_minimal`: `INSERT IGNORE` + `UPDATE`
//! for a fresh call, one `SELECT` by key for a replay).
//!
//! `IDEM_TEST_MYSQL_URL` names the server; without it the bench does nothing. A fresh call is
//! two autocommit statements on every side, so with `innodb_flush_log_at_trx_commit = 1` (the
//! default, and global only: the bench leaves the server's settings alone) it measures two log
//! flushes for idem and raw alike. Each side has a pool of 40 connections. The bench's table
//! is its own and is dropped at the end.

use criterion::{criterion_group, criterion_main, Criterion};
use idem::store::mysql::MysqlOptions;
use idem::Idem;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
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

const TABLE: &str = "idem_bench_mysql";
/// What each group compares, idem first: see the module docs.
const VARIANTS: [&str; 3] = ["idem", "raw", "raw_minimal"];
const POOL: u32 = 40;

struct Setup {
    idem: Idem,
    pool: MySqlPool,
    claim: Arc<str>,
    get: Arc<str>,
    complete: Arc<str>,
}

/// The store's statements as it runs them: the claim (an upsert whose outcome is the insert
/// id); then the completion when it claimed, or the read of the live row when it did not.
async fn raw(s: &Setup, mode: Mode, i: u64) {
    let n = key_number(mode, i);
    let key = raw_key(n);
    let done = sqlx::query(&s.claim)
        .bind(&key[..])
        .bind("bench")
        .bind(&key[..])
        .bind(30_000i64)
        .bind("bench")
        .bind(&key[..])
        .bind(30_000i64)
        .execute(&s.pool)
        .await
        .unwrap();
    let token = done.last_insert_id();
    if token != 0 {
        sqlx::query(&s.complete)
            .bind(&n.to_be_bytes()[..])
            .bind(86_400_000i64)
            .bind(0i64) // no tombstone
            .bind(&key[..])
            .bind(token as i64)
            .execute(&s.pool)
            .await
            .unwrap();
    } else {
        let row = sqlx::query(&s.get)
            .bind(&key[..])
            .fetch_optional(&s.pool)
            .await
            .unwrap();
        debug_assert!(row.is_some());
    }
}

async fn raw_minimal(s: &Setup, mode: Mode, i: u64) {
    match mode {
        Mode::Fresh => {
            let key = raw_key(key_number(Mode::Fresh, i));
            let inserted = sqlx::query(&format!(
                "INSERT IGNORE INTO {TABLE} \
                   (`key`, `name`, `fingerprint`, `token`, `status`, `created_at`, `expires_at`) \
                 VALUES (?, 'bench', ?, 1, 0, 0, 9000000000000)"
            ))
            .bind(&key[..])
            .bind(&key[..])
            .execute(&s.pool)
            .await
            .unwrap();
            debug_assert_eq!(inserted.rows_affected(), 1);
            sqlx::query(&format!(
                "UPDATE {TABLE} SET `status` = 1, `value` = ? WHERE `key` = ? AND `status` = 0"
            ))
            .bind(&key[..8])
            .bind(&key[..])
            .execute(&s.pool)
            .await
            .unwrap();
        }
        Mode::Replay => {
            let key = raw_key(key_number(Mode::Replay, i));
            let _: Option<(Option<Vec<u8>>,)> =
                sqlx::query_as(&format!("SELECT `value` FROM {TABLE} WHERE `key` = ?"))
                    .bind(&key[..])
                    .fetch_optional(&s.pool)
                    .await
                    .unwrap();
        }
    }
}

fn bench(c: &mut Criterion) {
    let Ok(url) = std::env::var("IDEM_TEST_MYSQL_URL") else {
        eprintln!("skipped: the mysql bench needs IDEM_TEST_MYSQL_URL");
        return;
    };
    let rt = drive::runtime();
    let setup = rt.block_on(async {
        let store = MysqlOptions::from_url(&url)
            .unwrap()
            .table(TABLE)
            .max_connections(POOL)
            .connect()
            .await
            .unwrap();
        sqlx::query(&format!("TRUNCATE TABLE {TABLE}"))
            .execute(store.pool())
            .await
            .unwrap();
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL)
            .test_before_acquire(false)
            .connect(&url)
            .await
            .unwrap();
        let text = |step| -> Arc<str> { store.statement_text(step).unwrap().into() };
        let setup = Setup {
            idem: Idem::from_store(store.clone()),
            claim: text("claim"),
            get: text("get"),
            complete: text("complete"),
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
            raw(&setup, Mode::Replay, n).await;
        }
        sqlx::query(&format!("ANALYZE TABLE {TABLE}"))
            .execute(&setup.pool)
            .await
            .unwrap();
        Arc::new(setup)
    });

    // Replays first, then fresh calls (see support/sql.rs).
    sql::compare(c, &rt, "mysql", "MySQL", VARIANTS, |mode, variant| {
        op(&setup, mode, variant)
    });

    // Give the space back: the bench table is the bench's alone.
    rt.block_on(async {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {TABLE}, {TABLE}_migrations"))
            .execute(&setup.pool)
            .await;
    });
}

/// One call of `variant` (`idem`, `raw` or `raw_minimal`).
fn op(setup: &Arc<Setup>, mode: Mode, variant: &'static str) -> paired::Op {
    let setup = setup.clone();
    Arc::new(move |i| {
        let s = setup.clone();
        Box::pin(async move {
            match variant {
                "idem" => idem_call(&s.idem, mode, i).await,
                "raw" => raw(&s, mode, i).await,
                _ => raw_minimal(&s, mode, i).await,
            }
        })
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
