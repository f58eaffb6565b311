//! Several OS processes on one MySQL database: four racing over the same 300 keys, each body
//! inserting one row into a side-effect table that has no unique constraint; and the
//! transactional mode with its worker killed (`SIGKILL`) at random points, fifty times.
//!
//! Workers are this test binary itself (`std::env::current_exe()`), running the `worker` test
//! with its job and role in the environment (`sql_common::Job`). Without them, `worker` runs
//! two racers in-process on a few keys, so it is a test of its own.

mod mysql_common;

use idem::store::mysql::{MysqlOptions, MysqlStore};
use idem::{Error, Idem};
use mysql_common::*;
use sqlx::mysql::MySqlPool;
use std::io::Write;
use std::time::{Duration, Instant};

const KEYS: usize = 300;

async fn open(job: &Job) -> MysqlStore {
    MysqlOptions::from_url(&job.url)
        .unwrap()
        .table(&job.table)
        .max_connections(8)
        .connect()
        .await
        .expect("open the store")
}

/// The job's tables (the store's created by opening it) and an admin pool.
async fn setup(url: &str, prefix: &str, keys: usize) -> (Job, sqlx::AnyPool) {
    let (job, admin) = Job::create(Sql::Mysql, url, &format!("my_{prefix}"), keys).await;
    store(url, &job.table).await;
    (job, admin)
}

/// One racing worker: every key once, in an order of its own, eight at a time, waiting for
/// duplicates in flight. Returns how many keys this process ran fresh.
async fn race_worker(job: &Job) -> usize {
    let store = open(job).await;
    let (pool, sql) = (store.pool().clone(), job.insert_sql());
    let effect = move |k: usize| {
        let (pool, sql) = (pool.clone(), sql.clone());
        async move {
            sqlx::query(&sql)
                .bind(k as i64)
                .bind(i64::from(std::process::id()))
                .execute(&pool)
                .await
                .map_err(|e| Error::store("mysql", "side effect", e))?;
            Ok(())
        }
    };
    // Each process walks the keys from its own offset, so that they meet on every key.
    let offset = std::process::id() as usize % job.keys;
    let order = (0..job.keys).map(|i| (i + offset) % job.keys).collect();
    race(&Idem::from_store(store), job, order, effect).await
}

/// One transactional call for key `k`: the side effect and the record in one transaction.
async fn tx_once(
    idem: &Idem,
    pool: &MySqlPool,
    job: &Job,
    k: usize,
    hold: Duration,
) -> Result<idem::Outcome<usize>, Error> {
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| Error::store("mysql", "begin", e))?;
    let sql = job.insert_sql();
    let out = idem
        .call(job.ns.clone())
        .key(&k)
        .in_transaction(&mut tx, async move |conn| {
            sqlx::query(&sql)
                .bind(k as i64)
                .bind(i64::from(std::process::id()))
                .execute(&mut *conn)
                .await
                .map_err(|e| Error::store("mysql", "side effect", e))?;
            // Widens the window in which a kill finds the transaction open.
            tokio::time::sleep(hold).await;
            Ok::<_, Error>(k)
        })
        .await?;
    tx.commit()
        .await
        .map_err(|e| Error::store("mysql", "commit", e))?;
    Ok(out)
}

/// The worker that gets killed: transactional calls over all keys, four at a time, forever.
/// Prints `C k` once a key's fresh call committed.
async fn txkill_worker(job: &Job) {
    let store = open(job).await;
    let pool = store.pool().clone();
    let idem = Idem::from_store(store);
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (idem, pool, job) = (idem.clone(), pool.clone(), job.clone());
            tokio::spawn(async move {
                let offset = std::process::id() as usize;
                loop {
                    for i in (t..job.keys).step_by(4) {
                        let k = (i + offset) % job.keys;
                        let hold = Duration::from_millis((k % 4) as u64);
                        match tx_once(&idem, &pool, &job, k, hold).await {
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

/// The transactional mode under `kill -9`: a worker process (four transactions in flight) is
/// killed at a random point fifty times over the same keys. Killed transactions roll back with
/// their side effects; after a recovery pass every key's side effect is there exactly once, and
/// no claim outlives its transaction.
fn transactional_mode_survives_kill_9(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (job, admin) = rt.block_on(setup(&url, "kill", 600));
    let started = Instant::now();
    let committed_before_kill = kill_fifty_times(&job, "worker", |i| {
        Duration::from_millis(150 + (i * 37) % 350)
    });
    let killing = started.elapsed();
    let recovered_fresh = rt.block_on(async {
        let store = open(&job).await;
        let pool = store.pool().clone();
        let idem = Idem::from_store(store);
        let mut fresh = 0;
        for k in 0..job.keys {
            let out = tx_once(&idem, &pool, &job, k, Duration::ZERO)
                .await
                .unwrap();
            if !out.is_replayed() {
                fresh += 1;
            }
        }
        fresh
    });
    eprintln!(
        "50 kills in {killing:?}: {committed_before_kill} keys committed by killed workers, \
         {recovered_fresh} run by the recovery pass"
    );
    rt.block_on(assert_recovered(
        &job,
        &admin,
        committed_before_kill,
        recovered_fresh,
    ));
    rt.block_on(job.cleanup(&admin));
}

fn worker(url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match Job::of_worker() {
        Some((job, role)) if role == "race" => {
            let fresh = rt.block_on(race_worker(&job));
            println!("\nfresh={fresh}");
        }
        Some((job, role)) if role == "txkill" => rt.block_on(txkill_worker(&job)),
        Some((_, other)) => panic!("unknown worker role {other}"),
        // Not a worker: two racers in-process, on a few keys.
        None => rt.block_on(async {
            let (job, admin) = setup(&url, "wrk", 40).await;
            let (a, b) = tokio::join!(race_worker(&job), race_worker(&job));
            assert_eq!(a + b, job.keys);
            job.assert_exactly_once(&admin).await;
            job.cleanup(&admin).await;
        }),
    }
}

/// Four processes race over the same 300 keys; each body inserts a row into a table without a
/// unique constraint. At the end: exactly one row per key, and the processes together ran 300
/// bodies.
fn four_processes_race_over_300_keys(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (job, admin) = rt.block_on(setup(&url, "race", KEYS));
    four_processes_race(&job, "worker");
    rt.block_on(job.assert_exactly_once(&admin));
    rt.block_on(job.cleanup(&admin));
}

idem_integration::server_tests! {
    blocking MYSQL => [
        transactional_mode_survives_kill_9,
        worker,
        four_processes_race_over_300_keys,
    ],
}
