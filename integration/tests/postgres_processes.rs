//! Several OS processes on one PostgreSQL database: four racing over the same keys, and the
//! transactional mode with its worker killed (`SIGKILL`) at random points, fifty times.
//!
//! Workers are this test binary itself (`std::env::current_exe()`), running the `worker` test
//! with its job and role in the environment (`sql_common::Job`). Without them, `worker` runs
//! both roles in-process on a few keys, so it is a test of its own.

mod pg_common;

use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::{Error, Idem, Outcome};
use pg_common::*;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn store(job: &Job) -> PostgresStore {
    PostgresOptions::from_url(&job.url)
        .unwrap()
        .table(&job.table)
        .max_connections(8)
        .connect()
        .await
        .expect("open the store")
}

/// The job's tables (the store's created by opening it) and an admin pool.
async fn setup(url: &str, prefix: &str, keys: usize) -> (Job, sqlx::AnyPool) {
    let (job, admin) = Job::create(Sql::Postgres, url, prefix, keys).await;
    store(&job).await;
    (job, admin)
}

/// One racing worker: every key once in random order, eight at a time. Returns how many keys
/// this process ran fresh.
async fn race_worker(job: &Job) -> usize {
    let store = store(job).await;
    let (pool, sql) = (store.pool().clone(), job.insert_sql());
    let effect = move |k: usize| {
        let (pool, sql) = (pool.clone(), sql.clone());
        async move {
            sqlx::query(&sql)
                .bind(k as i64)
                .bind(i64::from(std::process::id()))
                .execute(&pool)
                .await
                .map_err(|e| Error::store("postgres", "side effect", e))?;
            Ok(())
        }
    };
    let order = Rng::new().shuffled(job.keys);
    race(&Idem::from_store(store), job, order, effect).await
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
    let out = Idem::from_store(store.clone())
        .call(job.ns.clone())
        .key(&k)
        .in_transaction(&mut tx, async move |conn| {
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
        .await?;
    tx.commit()
        .await
        .map_err(|e| Error::store("postgres", "commit", e))?;
    Ok(out)
}

/// The worker that gets killed: transactional calls over all keys in random order, four at a
/// time, forever. Prints `C k` once a key's fresh call committed.
async fn txkill_worker(job: &Job) {
    let store = store(job).await;
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
        // Not a worker: both roles in-process, on a few keys.
        None => rt.block_on(async {
            let (job, admin) = setup(&url, "wrk", 40).await;
            let (a, b) = tokio::join!(race_worker(&job), race_worker(&job));
            assert_eq!(a + b, job.keys);
            job.assert_exactly_once(&admin).await;
            job.cleanup(&admin).await;

            let (job, admin) = setup(&url, "wrktx", 40).await;
            let store = store(&job).await;
            for round in 0..2 {
                for k in 0..job.keys {
                    let out = tx_once(&store, &job, k, Duration::ZERO).await.unwrap();
                    assert_eq!(out.is_replayed(), round == 1);
                }
            }
            job.assert_exactly_once(&admin).await;
            job.cleanup(&admin).await;
        }),
    }
}

/// Four processes race over the same 500 keys; each body inserts a row into a table without a
/// unique constraint. At the end: exactly one row per key, and the processes together ran 500
/// bodies.
fn four_processes_race_over_500_keys(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (job, admin) = rt.block_on(setup(&url, "race", 500));
    four_processes_race(&job, "worker");
    rt.block_on(job.assert_exactly_once(&admin));
    rt.block_on(job.cleanup(&admin));
}

/// The transactional mode under `kill -9`: a worker process (four transactions in flight) is
/// killed at a random point fifty times over the same keys. Killed transactions roll back with
/// their side effects; after a recovery pass every key's side effect is there exactly once.
fn transactional_mode_survives_kill_9(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (job, admin) = rt.block_on(setup(&url, "kill", 1500));
    let started = Instant::now();
    let mut rng = Rng::new();
    let committed_before_kill = kill_fifty_times(&job, "worker", |_| {
        Duration::from_millis(150 + rng.below(350))
    });
    let killing = started.elapsed();

    // Recovery: every key once more; what the killed workers committed replays.
    let recovered_fresh = rt.block_on(async {
        let store = store(&job).await;
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
        fresh.load(Ordering::SeqCst)
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

idem_integration::server_tests! {
    blocking POSTGRES => [
        worker,
        four_processes_race_over_500_keys,
        transactional_mode_survives_kill_9,
    ],
}
