//! The server restarted mid-load (`SHUTDOWN NOSAVE`, then started again on the same port).
//!
//! Its own test binary with a single test. It runs on a private redis-server (started like the
//! shared one: no RDB, no AOF) rather than on the shared 6379, which other test runs use at the
//! same time; the server's guard stops it even if the test panics.
//!
//! What is checked, honestly: while the server is down every call ends promptly with
//! `Error::Store`; after the restart calls succeed again; within one life of the server no key
//! runs twice and all successful calls of a key agree. Across the restart a key can run again —
//! Redis without persistence forgot it — and the test counts those instead of hiding them.

mod redis_support;
use idem::{Error, Idem, Outcome};
use redis_support::TempRedis;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// 0: first life; 1: shutting down / down; 2: restarting and second life.
static PHASE: AtomicU8 = AtomicU8::new(0);

fn phase() -> u8 {
    PHASE.load(Ordering::SeqCst)
}

#[derive(Default)]
struct Log {
    /// Execution id → (key, phase at body start).
    executions: HashMap<usize, (u32, u8)>,
    /// (key, phase at call end, execution id) of every successful call.
    oks: Vec<(u32, u8, usize)>,
    /// Store errors by the phase the call started in.
    store_errors: [usize; 3],
    /// Calls whose body ran and then failed (completion lost with the server).
    failed_after_run: usize,
    /// The slowest call.
    slowest: Duration,
}

async fn server_restarted_mid_load() {
    let mut server = TempRedis::start(&[]);
    let store = idem::store::redis::RedisOptions::from_url(&server.url())
        .unwrap()
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .retries(1)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let log = Arc::new(Mutex::new(Log::default()));
    let next_key = Arc::new(AtomicU32::new(0));
    let next_exec = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let call = {
        let (idem, log, next_exec) = (idem.clone(), log.clone(), next_exec.clone());
        move |k: u32| {
            let (idem, log, next_exec) = (idem.clone(), log.clone(), next_exec.clone());
            async move {
                let started = (Instant::now(), phase());
                let ran = Arc::new(AtomicBool::new(false));
                let (ran2, log2) = (ran.clone(), log.clone());
                let out = idem
                    .call("restart")
                    .key(&k)
                    .lease(Duration::from_secs(2))
                    .run(async move {
                        ran2.store(true, Ordering::SeqCst);
                        let id = next_exec.fetch_add(1, Ordering::SeqCst);
                        log2.lock().unwrap().executions.insert(id, (k, phase()));
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        Ok::<_, Error>(id)
                    })
                    .await;
                let mut l = log.lock().unwrap();
                l.slowest = l.slowest.max(started.0.elapsed());
                match out {
                    Ok(Outcome::Fresh(id) | Outcome::Replayed(id)) => {
                        l.oks.push((k, phase(), id));
                        true
                    }
                    Err(e) => {
                        match e {
                            Error::Store(_) => l.store_errors[started.1 as usize] += 1,
                            // The claim was made on the first server and the completion reached
                            // the second, which had never heard of it; or a stranded claim.
                            Error::LeaseLost { .. } | Error::InProgress { .. } => {}
                            other => panic!("key {k}: unexpected {other:?}"),
                        }
                        if ran.load(Ordering::SeqCst) {
                            l.failed_after_run += 1;
                        }
                        false
                    }
                }
            }
        }
    };

    let mut workers = Vec::new();
    for _ in 0..8 {
        let (call, next_key, stop) = (call.clone(), next_key.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let k = next_key.fetch_add(1, Ordering::SeqCst);
                // Retry a key until it succeeds (as a client would), then repeat it once.
                while !call(k).await {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                call(k).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    PHASE.store(1, Ordering::SeqCst);
    tokio::task::block_in_place(|| server.shutdown());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    PHASE.store(2, Ordering::SeqCst);
    tokio::task::block_in_place(|| server.restart());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }

    let l = log.lock().unwrap();
    // Down: calls failed cleanly and promptly; nobody hung.
    assert!(
        l.store_errors[1] > 0,
        "no call saw the server down: {:?}",
        l.store_errors
    );
    assert!(
        l.slowest < Duration::from_secs(5),
        "a call took {:?}",
        l.slowest
    );
    // Recovery: plenty of successes in the second life.
    let second_life_oks = l.oks.iter().filter(|(_, p, _)| *p == 2).count();
    assert!(
        second_life_oks > 20,
        "only {second_life_oks} successes after the restart"
    );
    assert!(l.oks.iter().filter(|(_, p, _)| *p == 0).count() > 20);

    // Within one life, a key ran at most once.
    let mut runs: HashMap<(u32, bool), usize> = HashMap::new();
    for (k, p) in l.executions.values() {
        *runs.entry((*k, *p == 2)).or_default() += 1;
    }
    for ((k, second), n) in &runs {
        assert_eq!(*n, 1, "key {k} ran {n} times in life {}", 1 + *second as u8);
    }
    // Within one life, the successful calls of a key agree, on an execution of that life.
    let mut agreed: HashMap<(u32, bool), usize> = HashMap::new();
    for (k, p, id) in &l.oks {
        let life2 = *p == 2;
        let exec_life2 = l.executions[id].1 == 2;
        assert_eq!(life2, exec_life2, "key {k}: a value from the other life");
        let first = *agreed.entry((*k, life2)).or_insert(*id);
        assert_eq!(first, *id, "key {k}: two values in one life");
    }
    let ran_again = runs
        .keys()
        .filter(|(k, second)| *second && runs.contains_key(&(*k, false)))
        .count();
    let succeeded_twice = agreed
        .keys()
        .filter(|(k, second)| *second && agreed.contains_key(&(*k, false)))
        .count();
    eprintln!(
        "keys: {}; store errors by phase {:?}; {} calls failed after their body ran; \
         {ran_again} keys ran again after the restart (Redis without persistence forgot them), \
         {succeeded_twice} of them had also succeeded before it; slowest call {:?}",
        next_key.load(Ordering::SeqCst),
        l.store_errors,
        l.failed_after_run,
        l.slowest
    );
}

idem_integration::server_tests! {
    REDIS_SERVER => [
        server_restarted_mid_load,
    ],
}
