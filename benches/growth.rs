//! Growth: fresh-call (claim + complete) and replay latency on PostgreSQL, MySQL / MariaDB and
//! SQLite as the table holds 10 thousand, 1 million (and, with `IDEM_BENCH_GROWTH_10M=1`, 10 million) live
//! rows; then `purge_expired`'s cost per row and the p99 of concurrent calls while it runs.
//!
//! The rows are made by one `INSERT … SELECT` (PostgreSQL `generate_series`, SQLite a recursive
//! CTE, MariaDB a `seq_0_to_<n>` table of its Sequence engine) into a bench-only table.
//! PostgreSQL runs with `synchronous_commit = off` and SQLite with `synchronous = NORMAL` (WAL):
//! with a flush per commit, the disk is all a fresh call measures and index depth would not
//! show. MySQL's counterpart, `innodb_flush_log_at_trx_commit`, is global only: the bench runs
//! with the server's setting. PostgreSQL needs `IDEM_TEST_POSTGRES_URL`, MySQL
//! `IDEM_TEST_MYSQL_URL` (and MariaDB's Sequence engine, which MySQL 8 lacks: without it the
//! MySQL part says so and is skipped).
//!
//! `IDEM_BENCH_GROWTH_STORES=postgres` (or `mysql`, or `sqlite`, or a comma-separated list)
//! runs those stores only.
//!
//! `cargo bench -p idem-benches --bench growth`. The purge figures are printed and written to
//! `target/criterion/idem-notes/purge.md`, which `benches/bench_report.rs` includes.

#[path = "support/notes.rs"]
mod notes;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use idem::store::sqlite::SqliteOptions;
use idem::Idem;
use sqlx::sqlite::SqliteSynchronous;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TABLE: &str = "idem_bench_growth";
const REPLAY_KEYS: u64 = 1024;
/// Expired rows made for the purge measurement.
const EXPIRED: i64 = 100_000;
/// Calls running beside the purge.
const PURGE_CALLERS: usize = 16;
static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

/// The two SQL databases, for what the bench does behind idem's back (filling, counting).
enum Db {
    #[cfg(feature = "postgres")]
    Pg(idem::store::postgres::sqlx::PgPool),
    #[cfg(feature = "mysql")]
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

impl Db {
    /// Adds rows numbered `from..=to` that live until `expires_at` (ms; 1 = expired long ago),
    /// in one statement. Their keys are distinct from any idem key and from each other.
    async fn fill(&self, from: i64, to: i64, expires_at: i64) {
        match self {
            #[cfg(feature = "postgres")]
            Db::Pg(pool) => {
                use idem::store::postgres::sqlx;
                sqlx::query(&format!(
                    "INSERT INTO {TABLE} (key, name, fingerprint, token, status, value, created_at, expires_at) \
                     SELECT sha256(int8send(g)), 'fill', sha256(int8send(g)), 1, 1, '\\x01'::bytea, 0, $3 \
                     FROM generate_series($1::bigint, $2::bigint) g"
                ))
                .bind(from)
                .bind(to)
                .bind(expires_at)
                .execute(pool)
                .await
                .unwrap();
                sqlx::query(&format!("VACUUM ANALYZE {TABLE}"))
                    .execute(pool)
                    .await
                    .unwrap();
            }
            #[cfg(feature = "mysql")]
            Db::My(pool) => {
                // `seq` is unsigned: made signed before the (possibly negative) offset is added.
                let key = "UNHEX(SHA2(CONCAT('fill:', CAST(seq AS SIGNED) + ?), 256))";
                sqlx::query(&format!(
                    "INSERT INTO {TABLE} \
                       (`key`, `name`, `fingerprint`, `token`, `status`, `value`, `created_at`, `expires_at`) \
                     SELECT {key}, 'fill', {key}, 1, 1, x'01', 0, ? FROM seq_0_to_{}",
                    to - from
                ))
                .bind(from)
                .bind(from)
                .bind(expires_at)
                .execute(pool)
                .await
                .unwrap();
                sqlx::query(&format!("ANALYZE TABLE {TABLE}"))
                    .execute(pool)
                    .await
                    .unwrap();
            }
            Db::Lite(pool) => {
                sqlx::query(&format!(
                    "INSERT INTO {TABLE} (key, name, fingerprint, token, status, value, created_at, expires_at) \
                     WITH RECURSIVE g(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2) \
                     SELECT randomblob(32), 'fill', randomblob(32), 1, 1, x'01', 0, ?3 FROM g"
                ))
                .bind(from)
                .bind(to)
                .bind(expires_at)
                .execute(pool)
                .await
                .unwrap();
                sqlx::query("ANALYZE").execute(pool).await.unwrap();
            }
        }
    }
}

/// Far in the future: a live row.
const LIVE: i64 = 9_000_000_000_000_000;

async fn call(idem: &Idem, n: u64) -> bool {
    idem.call("bench")
        .key(&n)
        .run(async move { Ok::<_, idem::Error>(n) })
        .await
        .unwrap()
        .is_replayed()
}

fn sizes() -> Vec<i64> {
    let mut sizes = vec![10_000, 1_000_000];
    if std::env::var("IDEM_BENCH_GROWTH_10M").as_deref() == Ok("1") {
        sizes.push(10_000_000);
    }
    sizes
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Latencies of fresh calls by `PURGE_CALLERS` tasks until `stop` is set.
async fn callers(idem: &Idem, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let tasks: Vec<_> = (0..PURGE_CALLERS)
        .map(|_| {
            let (idem, stop) = (idem.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    call(&idem, NEXT.fetch_add(1, Ordering::Relaxed)).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all
}

/// `purge_expired` over `EXPIRED` expired rows beside `PURGE_CALLERS` calling tasks, against
/// the same callers for as long without the purge. One line of the notes.
async fn purge(label: &str, idem: &Idem, db: &Db, live: i64) -> String {
    let stop = Arc::new(AtomicBool::new(false));
    let quiet = tokio::spawn({
        let (idem, stop) = (idem.clone(), stop.clone());
        async move { callers(&idem, stop).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let quiet = quiet.await.unwrap();

    // Negative numbers: keys no live row has.
    db.fill(-EXPIRED, -1, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let busy = tokio::spawn({
        let (idem, stop) = (idem.clone(), stop.clone());
        async move { callers(&idem, stop).await }
    });
    let started = Instant::now();
    let purged = idem.purge_expired(1000).await.unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let busy = busy.await.unwrap();
    assert!(purged >= EXPIRED as u64, "{label}: purged {purged}");
    let line = format!(
        "| {label} | {live} | {purged} | {:.2} µs | {:.2} ms | {:.2} ms ({} calls) | {:.2} ms ({} calls) |",
        took.as_secs_f64() * 1e6 / purged as f64,
        took.as_secs_f64() * 1e3,
        percentile(&quiet, 0.99).as_secs_f64() * 1e3,
        quiet.len(),
        percentile(&busy, 0.99).as_secs_f64() * 1e3,
        busy.len(),
    );
    println!("{line}");
    line
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut targets: Vec<(&str, Idem, Db)> = Vec::new();
    let only = std::env::var("IDEM_BENCH_GROWTH_STORES").unwrap_or_default();
    let wanted = |store: &str| only.is_empty() || only.split(',').any(|s| s.trim() == store);
    rt.block_on(async {
        let url = format!("sqlite://{}", dir.path().join("growth.db").display());
        let store = SqliteOptions::from_url(&url)
            .unwrap()
            .table(TABLE)
            .synchronous(SqliteSynchronous::Normal)
            .connect()
            .await
            .unwrap();
        let pool = store.pool().clone();
        if wanted("sqlite") {
            targets.push(("sqlite", Idem::from_store(store), Db::Lite(pool)));
        }
        #[cfg(feature = "postgres")]
        match std::env::var("IDEM_TEST_POSTGRES_URL") {
            Ok(url) if wanted("postgres") => {
                use idem::store::postgres::{sqlx, PostgresOptions};
                let sep = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{sep}options=-c%20synchronous_commit%3Doff");
                let opts = PostgresOptions::from_url(&url)
                    .unwrap()
                    .table(TABLE)
                    .max_connections(20);
                let store = opts.connect().await.unwrap();
                sqlx::query(&format!("TRUNCATE {TABLE}"))
                    .execute(store.pool())
                    .await
                    .unwrap();
                let pool = store.pool().clone();
                targets.push(("postgres", Idem::from_store(store.clone()), Db::Pg(pool)));
            }
            Ok(_) => {}
            Err(_) => eprintln!("skipped: postgres growth (IDEM_TEST_POSTGRES_URL is not set)"),
        }
        #[cfg(feature = "mysql")]
        match std::env::var("IDEM_TEST_MYSQL_URL") {
            Ok(url) if wanted("mysql") => {
                use idem::store::mysql::MysqlOptions;
                let store = MysqlOptions::from_url(&url)
                    .unwrap()
                    .table(TABLE)
                    .max_connections(20)
                    .connect()
                    .await
                    .unwrap();
                let pool = store.pool().clone();
                if sqlx::query("SELECT 1 FROM seq_0_to_0")
                    .execute(&pool)
                    .await
                    .is_ok()
                {
                    sqlx::query(&format!("TRUNCATE TABLE {TABLE}"))
                        .execute(&pool)
                        .await
                        .unwrap();
                    targets.push(("mysql", Idem::from_store(store), Db::My(pool)));
                } else {
                    eprintln!(
                        "skipped: mysql growth (the server has no Sequence engine to fill the \
                         table: MariaDB has one, MySQL 8 does not)"
                    );
                    let _ =
                        sqlx::query(&format!("DROP TABLE IF EXISTS {TABLE}, {TABLE}_migrations"))
                            .execute(&pool)
                            .await;
                }
            }
            Ok(_) => {}
            Err(_) => eprintln!("skipped: mysql growth (IDEM_TEST_MYSQL_URL is not set)"),
        }
    });

    let mut notes = String::from(
        "## Purge\n\n\
         `purge_expired(1000)` (batches of 1 000; the SQLite store deletes each in 100-row \
         statements with a pause after each) deleting 100 000 expired rows beside 16 tasks \
         making fresh calls in a loop; p99 of those calls for 1 s before (quiet) and during the \
         purge.\n\n\
         | store | live rows | purged | per row | total | p99 quiet | p99 during purge |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for (label, idem, db) in &targets {
        let mut filled = 0i64;
        rt.block_on(async {
            for n in 0..REPLAY_KEYS {
                call(idem, n).await;
            }
        });
        let mut g = c.benchmark_group(format!("growth/{label}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        for size in sizes() {
            let started = Instant::now();
            rt.block_on(db.fill(filled + 1, size, LIVE));
            filled = size;
            eprintln!("{label}: {size} live rows in {:?}", started.elapsed());
            g.bench_with_input(BenchmarkId::new("fresh", size), &size, |b, _| {
                b.to_async(&rt).iter(|| async {
                    assert!(!call(idem, NEXT.fetch_add(1, Ordering::Relaxed)).await)
                })
            });
            let i = AtomicU64::new(0);
            g.bench_with_input(BenchmarkId::new("replay", size), &size, |b, _| {
                b.to_async(&rt).iter(|| async {
                    assert!(call(idem, i.fetch_add(1, Ordering::Relaxed) % REPLAY_KEYS).await)
                })
            });
        }
        g.finish();
        let line = rt.block_on(purge(label, idem, db, filled));
        let _ = writeln!(notes, "{line}");
    }
    notes::write_note("purge.md", &notes);
    // Give the space back: the bench table is the bench's alone.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    rt.block_on(async {
        let drop = format!("DROP TABLE IF EXISTS {TABLE}, {TABLE}_migrations");
        for (_, _, db) in &targets {
            match db {
                #[cfg(feature = "postgres")]
                Db::Pg(pool) => {
                    let _ = sqlx::query(&drop).execute(pool).await;
                }
                #[cfg(feature = "mysql")]
                Db::My(pool) => {
                    let _ = sqlx::query(&drop).execute(pool).await;
                }
                Db::Lite(_) => {}
            }
        }
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
