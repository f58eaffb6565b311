//! Several OS processes on one PostgreSQL database: four racing over the same keys, and the
//! transactional mode with its worker killed (`SIGKILL`) at random points, fifty times.
//!
//! Workers are this test binary itself (`std::env::current_exe()`), running the `worker` test
//! with `IDEM_PG_WORKER` set to the role. Without it, `worker` runs both roles in-process on a
//! few keys, so it is a test of its own.
#![cfg(feature = "postgres")]

mod pg_common;

use idem::store::postgres::{sqlx, PostgresOptions, PostgresStore, TxCall};
use idem::{Error, Outcome};
use pg_common::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROLE: &str = "IDEM_PG_WORKER";

/// xorshift64*, seeded per process: enough to shuffle keys and pick kill times.
struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng((nanos ^ (u64::from(std::process::id()) << 32)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn shuffled(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
        v
    }
}

#[derive(Clone)]
struct Job {
    url: String,
    table: String,
    side: String,
    ns: String,
    keys: usize,
}

impl Job {
    fn from_env() -> Job {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
        Job {
            url: var("IDEM_TEST_POSTGRES_URL"),
            table: var("IDEM_PG_TABLE"),
            side: var("IDEM_PG_SIDE"),
            ns: var("IDEM_PG_NS"),
            keys: var("IDEM_PG_KEYS").parse().unwrap(),
        }
    }

    fn env(&self, cmd: &mut Command, role: &str) {
        cmd.env(ROLE, role)
            .env("IDEM_TEST_POSTGRES_URL", &self.url)
            .env("IDEM_PG_TABLE", &self.table)
            .env("IDEM_PG_SIDE", &self.side)
            .env("IDEM_PG_NS", &self.ns)
            .env("IDEM_PG_KEYS", self.keys.to_string());
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::open_with(
            &self.url,
            PostgresOptions::new().table(&self.table).max_connections(8),
        )
        .await
        .expect("open the store")
    }

    fn insert_sql(&self) -> String {
        format!("INSERT INTO \"{}\" (k, pid) VALUES ($1, $2)", self.side)
    }
}

/// Creates the store's table and a side-effect table WITHOUT a unique constraint.
async fn setup(url: &str, prefix: &str, keys: usize) -> (Job, sqlx::PgPool) {
    let admin = admin(url).await;
    let table = unique_table(prefix);
    let side = format!("{table}_side");
    sqlx::query(&format!(
        "CREATE TABLE \"{side}\" (k bigint NOT NULL, pid bigint NOT NULL)"
    ))
    .execute(&admin)
    .await
    .unwrap();
    PostgresStore::open_with(url, PostgresOptions::new().table(&table))
        .await
        .unwrap();
    let job = Job {
        url: url.to_string(),
        table,
        side,
        ns: idem::testkit::unique(prefix),
        keys,
    };
    (job, admin)
}

/// Every key has exactly one side-effect row.
async fn assert_exactly_once(admin: &sqlx::PgPool, job: &Job) {
    let (distinct, total): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(DISTINCT k), count(*) FROM \"{}\"",
        job.side
    ))
    .fetch_one(admin)
    .await
    .unwrap();
    let twice: Vec<(i64, i64)> = sqlx::query_as(&format!(
        "SELECT k, count(*) FROM \"{}\" GROUP BY k HAVING count(*) > 1 ORDER BY k LIMIT 10",
        job.side
    ))
    .fetch_all(admin)
    .await
    .unwrap();
    assert!(twice.is_empty(), "side effects executed twice: {twice:?}");
    assert_eq!((distinct, total), (job.keys as i64, job.keys as i64));
}

async fn cleanup(admin: &sqlx::PgPool, job: &Job) {
    drop_table(admin, &job.table).await;
    drop_table(admin, &job.side).await;
}

/// One racing worker: every key once, eight at a time, waiting for duplicates in flight.
/// Returns how many keys this process ran fresh.
async fn race_worker(job: &Job) -> usize {
    let store = job.store().await;
    let idem = store.idem();
    let order = Arc::new(Rng::new().shuffled(job.keys));
    let fresh = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (idem, store, order, fresh, job) = (
                idem.clone(),
                store.clone(),
                order.clone(),
                fresh.clone(),
                job.clone(),
            );
            tokio::spawn(async move {
                let sql = job.insert_sql();
                for &k in order.iter().skip(t).step_by(8) {
                    loop {
                        let (pool, sql) = (store.pool().clone(), sql.clone());
                        let out = idem
                            .call(job.ns.clone())
                            .key(&k)
                            .wait(Duration::from_secs(20))
                            .run(async move {
                                sqlx::query(&sql)
                                    .bind(k as i64)
                                    .bind(i64::from(std::process::id()))
                                    .execute(&pool)
                                    .await
                                    .map_err(|e| Error::store("postgres", "side effect", e))?;
                                Ok::<_, Error>(k)
                            })
                            .await;
                        match out {
                            Ok(out) => {
                                if !out.is_replayed() {
                                    fresh.fetch_add(1, Ordering::SeqCst);
                                }
                                assert_eq!(out.into_inner(), k);
                                break;
                            }
                            Err(Error::InProgress { .. }) => {
                                tokio::time::sleep(Duration::from_millis(5)).await
                            }
                            Err(e) => panic!("key {k}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    fresh.load(Ordering::SeqCst)
}

/// One transactional call for key `k`: the side effect and the record in one transaction.
async fn tx_once(
    store: &PostgresStore,
    job: &Job,
    k: usize,
    hold: Duration,
) -> Result<Outcome<usize>, Error> {
    let mut tx = store
        .pool()
        .begin()
        .await
        .map_err(|e| Error::store("postgres", "begin", e))?;
    let sql = job.insert_sql();
    let out = TxCall::new(job.ns.clone())
        .key(&k)
        .run(store, &mut tx, |conn| {
            Box::pin(async move {
                sqlx::query(&sql)
                    .bind(k as i64)
                    .bind(i64::from(std::process::id()))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| Error::store("postgres", "side effect", e))?;
                // Widens the window in which a kill finds the transaction open.
                tokio::time::sleep(hold).await;
                Ok::<_, Error>(k)
            })
        })
        .await?;
    tx.commit()
        .await
        .map_err(|e| Error::store("postgres", "commit", e))?;
    Ok(out)
}

/// The worker that gets killed: transactional calls over all keys in random order, four at a
/// time, forever. Prints `B k` when a key's side effect is written (transaction still open)
/// and `C k` once it committed.
async fn txkill_worker(job: &Job) {
    let store = job.store().await;
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (store, job) = (store.clone(), job.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new();
                loop {
                    for k in rng.shuffled(job.keys).into_iter().skip(t).step_by(4) {
                        let hold = Duration::from_millis(rng.below(4));
                        match tx_once(&store, &job, k, hold).await {
                            Ok(out) => {
                                if !out.is_replayed() {
                                    let mut o = std::io::stdout().lock();
                                    let _ = writeln!(o, "C {k}");
                                    let _ = o.flush();
                                }
                            }
                            Err(e) => eprintln!("key {k}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[test]
fn worker() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(ROLE).as_deref() {
        Ok("race") => {
            let fresh = rt.block_on(race_worker(&Job::from_env()));
            println!("\nfresh={fresh}");
        }
        Ok("txkill") => rt.block_on(txkill_worker(&Job::from_env())),
        Ok(other) => panic!("unknown worker role {other}"),
        // Not a worker: both roles in-process, on a few keys.
        Err(_) => rt.block_on(async {
            let Some(url) = url() else { return };
            let (job, admin) = setup(&url, "wrk", 40).await;
            let (a, b) = tokio::join!(race_worker(&job), race_worker(&job));
            assert_eq!(a + b, job.keys);
            assert_exactly_once(&admin, &job).await;
            cleanup(&admin, &job).await;

            let (job, admin) = setup(&url, "wrktx", 40).await;
            let store = job.store().await;
            for round in 0..2 {
                for k in 0..job.keys {
                    let out = tx_once(&store, &job, k, Duration::ZERO).await.unwrap();
                    assert_eq!(out.is_replayed(), round == 1);
                }
            }
            assert_exactly_once(&admin, &job).await;
            cleanup(&admin, &job).await;
        }),
    }
}

fn spawn_worker(job: &Job, role: &str) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["worker", "--exact", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    job.env(&mut cmd, role);
    cmd.spawn().expect("spawn a worker process")
}

/// Four processes race over the same 500 keys; each body inserts a row into a table without a
/// unique constraint. At the end: exactly one row per key, and the processes together ran 500
/// bodies.
#[test]
fn four_processes_race_over_500_keys() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(url) = url() else { return };
    let (job, admin) = rt.block_on(setup(&url, "race", 500));
    let workers: Vec<_> = (0..4).map(|_| spawn_worker(&job, "race")).collect();
    let mut fresh = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "worker failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: usize = stdout
            .lines()
            .find_map(|l| l.split_once("fresh=").map(|(_, n)| n))
            .unwrap_or_else(|| panic!("the worker reports its count: {stdout}"))
            .trim()
            .parse()
            .unwrap();
        eprintln!("worker ran {n} keys fresh");
        fresh += n;
    }
    assert_eq!(fresh, 500);
    rt.block_on(assert_exactly_once(&admin, &job));
    rt.block_on(cleanup(&admin, &job));
}

/// The transactional mode under `kill -9`: a worker process (four transactions in flight) is
/// killed at a random point fifty times over the same keys. Killed transactions roll back with
/// their side effects; after a recovery pass every key's side effect is there exactly once.
#[test]
fn transactional_mode_survives_kill_9() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(url) = url() else { return };
    let (job, admin) = rt.block_on(setup(&url, "kill", 1500));
    let started = Instant::now();
    let mut rng = Rng::new();
    let mut committed_before_kill = 0usize;
    for _ in 0..50 {
        let mut child = spawn_worker(&job, "txkill");
        std::thread::sleep(Duration::from_millis(150 + rng.below(350)));
        child.kill().expect("SIGKILL the worker"); // SIGKILL on Unix
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        committed_before_kill += String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("C "))
            .count();
    }
    let killing = started.elapsed();

    // Recovery: every key once more; what the killed workers committed replays.
    let (recovered_fresh, open_claims) = rt.block_on(async {
        let store = job.store().await;
        let fresh = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (store, job, fresh) = (store.clone(), job.clone(), fresh.clone());
                tokio::spawn(async move {
                    for k in (t..job.keys).step_by(8) {
                        let out = tx_once(&store, &job, k, Duration::ZERO).await.unwrap();
                        assert_eq!(out.into_inner(), k);
                        if !out.is_replayed() {
                            fresh.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let open: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{}\" WHERE status = 0",
            job.table
        ))
        .fetch_one(&admin)
        .await
        .unwrap();
        (fresh.load(Ordering::SeqCst), open)
    });
    eprintln!(
        "50 kills in {killing:?}: {committed_before_kill} keys committed by killed workers, \
         {recovered_fresh} run by the recovery pass"
    );
    assert!(
        committed_before_kill > 0,
        "the workers got work done before the kills"
    );
    // A worker killed between its commit and its `C` line leaves a key counted by neither.
    assert!(committed_before_kill + recovered_fresh <= job.keys);
    assert!(committed_before_kill + recovered_fresh >= job.keys - 4 * 50);
    assert_eq!(open_claims, 0, "no claim outlives its transaction");
    rt.block_on(assert_exactly_once(&admin, &job));
    rt.block_on(cleanup(&admin, &job));
}
