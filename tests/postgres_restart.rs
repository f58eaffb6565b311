//! The server stopped and started during a load run (its own test binary, one test: the other
//! PostgreSQL tests must not run while the server is down). A guard starts the server again
//! even if the test panics.
#![cfg(feature = "postgres")]

mod pg_common;

use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::testkit::{unique, Counter};
use idem::Error;
use pg_common::*;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cluster_version() -> Option<String> {
    let dir = std::fs::read_dir("/etc/postgresql").ok()?;
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .max()
}

fn pg_ctl(action: &str) -> bool {
    let Some(v) = cluster_version() else {
        return false;
    };
    let mut cmd = Command::new("pg_ctlcluster");
    cmd.args(["--skip-systemctl-redirect", &v, "main", action]);
    if action == "stop" {
        cmd.args(["-m", "fast"]);
    }
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

/// Starts the server when dropped, whatever happened.
struct StartOnDrop;
impl Drop for StartOnDrop {
    fn drop(&mut self) {
        if !pg_ctl("status") {
            let started = pg_ctl("start");
            eprintln!("restart guard: server started again: {started}");
        }
    }
}

#[test]
fn server_restart_during_load_fails_cleanly_and_recovers() {
    let Some(url) = url() else { return };
    if cluster_version().is_none() {
        // Only where the test can control the server (the CI machine and the dev machines).
        assert_ne!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref(),
            Ok("1"),
            "no local cluster to restart"
        );
        eprintln!("skipped: no local PostgreSQL cluster to stop and start");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let table = unique_table("restart");
    let store = rt.block_on(async {
        PostgresStore::open_with(
            &url,
            PostgresOptions::new()
                .table(&table)
                .max_connections(8)
                .acquire_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap()
    });
    let idem = store.idem();
    let name = unique("restart");
    const TASKS: usize = 8;
    const KEYS: usize = 60; // per task
    let counters: Arc<Vec<Counter>> =
        Arc::new((0..TASKS * KEYS).map(|_| Counter::default()).collect());
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));

    let guard = StartOnDrop;
    let load: Vec<_> = (0..TASKS)
        .map(|t| {
            let (idem, name, counters, failures, done) = (
                idem.clone(),
                name.clone(),
                counters.clone(),
                failures.clone(),
                done.clone(),
            );
            rt.spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                for i in 0..KEYS {
                    let k = t * KEYS + i;
                    loop {
                        assert!(Instant::now() < deadline, "key {k} never finished");
                        let c = counters[k].clone();
                        let out = idem
                            .call(name.clone())
                            .key(&k)
                            .lease(Duration::from_secs(15))
                            .run(async move {
                                c.hit();
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok::<_, Error>(k)
                            })
                            .await;
                        match out {
                            Ok(v) => {
                                assert_eq!(v.into_inner(), k);
                                done.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            // Down: a clean store error. In progress: our own claim whose
                            // answer was lost; it lapses after the lease.
                            Err(Error::Store(_)) | Err(Error::InProgress { .. }) => {
                                failures.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(e) => panic!("key {k}: unexpected {e}"),
                        }
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(700));
    let before = done.load(Ordering::SeqCst);
    assert!(pg_ctl("stop"), "stop the server");
    let stopped = Instant::now();
    // While it is down, a call fails cleanly, at once (within the acquire timeout), without
    // running its body.
    let probe = Counter::default();
    for p in 0..3 {
        let (c, t) = (probe.clone(), Instant::now());
        let out = rt.block_on(
            idem.call(name.clone())
                .key(&("probe", p))
                .run(async move { Ok::<_, Error>(c.hit()) }),
        );
        assert!(matches!(out, Err(Error::Store(_))), "while down: {out:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    assert_eq!(probe.get(), 0);
    std::thread::sleep(Duration::from_millis(1000));
    let during = done.load(Ordering::SeqCst);
    assert!(pg_ctl("start"), "start the server");
    let downtime = stopped.elapsed();
    drop(guard);

    rt.block_on(async {
        for l in load {
            l.await.unwrap();
        }
    });
    let failures = failures.load(Ordering::SeqCst);
    eprintln!(
        "down for {downtime:?}: {before} calls done before the stop, {} during, {failures} \
         clean failures of the load (besides the probes), all {} done after",
        during - before,
        TASKS * KEYS
    );
    assert!(before > 0, "load ran before the stop");
    for (k, c) in counters.iter().enumerate() {
        assert_eq!(c.get(), 1, "key {k} ran {} times", c.get());
    }
    // Everything replays after recovery.
    rt.block_on(async {
        for k in 0..TASKS * KEYS {
            let out = idem
                .call(name.clone())
                .key(&k)
                .run(async { Ok::<_, Error>(usize::MAX) })
                .await
                .unwrap();
            assert!(out.is_replayed(), "key {k}");
        }
        drop_table(&admin(&url).await, &table).await;
    });
}
