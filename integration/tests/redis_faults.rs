//! Faults: the store's connection killed mid-call (`CLIENT KILL TYPE normal` from a second
//! connection), on a private redis-server so that no other test's connections are hit.
//!
//! A killed connection gives `Error::Store` or, after the reconnect, success; a body never runs
//! twice except after a call that reported a failure once its body had run (the completion
//! could not be delivered), and then only once the lease lapsed.

mod redis_support;
use idem::{Error, Idem, Outcome};
use redis_support::{raw, TempRedis};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

async fn kill_normal_clients(probe: &mut redis::aio::MultiplexedConnection) -> usize {
    // SKIPME yes (the default) spares the probe itself; pub/sub connections are another type.
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async::<usize>(probe)
        .await
        .unwrap()
}

async fn connection_killed_mid_body_completes_after_reconnect() {
    let server = TempRedis::start(&[]);
    let idem = Idem::redis(&server.url()).await.unwrap();
    let probe = raw(&server.url()).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let call = || {
        let (runs, mut probe) = (runs.clone(), probe.clone());
        idem.call("killed-mid-body").key("k").run(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            assert!(kill_normal_clients(&mut probe).await >= 1);
            Ok::<_, Error>(42u32)
        })
    };
    // The completion goes out on a dead connection, fails, and is sent again on a new one.
    assert_eq!(call().await.unwrap(), Outcome::Fresh(42));
    assert_eq!(call().await.unwrap(), Outcome::Replayed(42));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn connection_killed_before_the_claim_is_retried() {
    let server = TempRedis::start(&[]);
    let idem = Idem::redis(&server.url()).await.unwrap();
    let mut probe = raw(&server.url()).await;
    for i in 0..5 {
        assert!(kill_normal_clients(&mut probe).await >= 1);
        let out = idem
            .call("killed-before-claim")
            .key(&i)
            .run(async move { Ok::<_, Error>(i) })
            .await
            .unwrap();
        assert_eq!(out, Outcome::Fresh(i));
    }
}

async fn without_retries_a_killed_connection_is_a_store_error() {
    let server = TempRedis::start(&[]);
    let store = idem::store::redis::RedisOptions::from_url(&server.url())
        .unwrap()
        .retries(0)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let mut probe = raw(&server.url()).await;
    // Warm the connection, then kill it under the store's feet.
    idem.call("no-retry")
        .key("warm")
        .run(async { Ok::<_, Error>(0u8) })
        .await
        .unwrap();
    assert!(kill_normal_clients(&mut probe).await >= 1);
    let out = idem
        .call("no-retry")
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await;
    match out {
        Err(Error::Store(e)) => assert_eq!((e.backend.name(), e.op), ("redis", "claim")),
        other => panic!("expected a store error, got {other:?}"),
    }
    // The manager reconnected in the background: the next call works.
    let again = idem
        .call("no-retry")
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    assert_eq!(again, Outcome::Fresh(1));
}

#[derive(Default)]
struct Log {
    /// Executions per key.
    runs: HashMap<u32, usize>,
    /// Calls per key that failed after their body had run.
    failed_after_run: HashMap<u32, usize>,
    /// Values returned per key by calls that succeeded.
    ok_values: HashMap<u32, Vec<usize>>,
}

/// Connections killed every few milliseconds while 16 calls at a time run over 200 keys.
async fn connections_killed_under_load_never_run_a_body_twice_unreported() {
    let server = TempRedis::start(&[]);
    let idem = Idem::redis(&server.url()).await.unwrap();
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (stop, killed, mut probe) = (stop.clone(), killed.clone(), raw(&server.url()).await);
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = kill_normal_clients(&mut probe).await;
                killed.fetch_add(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };

    let lease = Duration::from_millis(800);
    let call = move |idem: Idem, log: Arc<Mutex<Log>>, k: u32| async move {
        let ran = Arc::new(AtomicBool::new(false));
        let (ran2, log2) = (ran.clone(), log.clone());
        let out = idem
            .call("kill-load")
            .key(&k)
            .lease(lease)
            .run(async move {
                ran2.store(true, Ordering::SeqCst);
                let n = {
                    let mut l = log2.lock().unwrap();
                    let n = l.runs.entry(k).or_default();
                    *n += 1;
                    *n
                };
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, Error>(n)
            })
            .await;
        let mut l = log.lock().unwrap();
        match &out {
            Ok(Outcome::Fresh(v) | Outcome::Replayed(v)) => {
                l.ok_values.entry(k).or_default().push(*v)
            }
            Err(Error::Store(_)) | Err(Error::InProgress { .. }) => {
                if ran.load(Ordering::SeqCst) {
                    *l.failed_after_run.entry(k).or_default() += 1;
                }
            }
            Err(e) => panic!("key {k}: unexpected {e:?}"),
        }
        out.is_ok()
    };

    let sem = Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..200u32 {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let (idem, log) = (idem.clone(), log.clone());
        tasks.spawn(async move {
            let _permit = permit;
            // Twice: the second is normally a replay.
            call(idem.clone(), log.clone(), k).await;
            call(idem, log, k).await;
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    killer.await.unwrap();
    assert!(
        killed.load(Ordering::SeqCst) > 5,
        "the killer must have hit"
    );

    // Calm again: every key gets its value (after a lapsed lease where a claim was stranded).
    for k in 0..200u32 {
        let mut tries = 0;
        while !call(idem.clone(), log.clone(), k).await {
            tries += 1;
            assert!(tries < 50, "key {k} never recovered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let l = log.lock().unwrap();
    let mut failures = 0;
    for k in 0..200u32 {
        let runs = l.runs.get(&k).copied().unwrap_or(0);
        let failed = l.failed_after_run.get(&k).copied().unwrap_or(0);
        failures += failed;
        assert!(runs >= 1, "key {k} never ran");
        assert!(
            runs <= 1 + failed,
            "key {k} ran {runs} times with only {failed} unreported executions"
        );
        let oks = &l.ok_values[&k];
        assert!(
            oks.iter().all(|v| *v == oks[0]),
            "key {k}: successful calls disagree: {oks:?}"
        );
    }
    eprintln!(
        "killed {} connections; {failures} calls failed after their body ran",
        killed.load(Ordering::SeqCst)
    );
}

/// A server that stops answering (`CLIENT PAUSE … ALL`) gives `Error::Store` within the
/// response timeout, not a hang; the call works again once the server answers.
async fn a_hung_server_is_a_store_error_not_a_hang() {
    let server = TempRedis::start(&[]);
    let store = idem::store::redis::RedisOptions::from_url(&server.url())
        .unwrap()
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let mut probe = raw(&server.url()).await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2500)
        .arg("ALL")
        .query_async(&mut probe)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let out = idem
        .call("hung")
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await;
    let took = started.elapsed();
    match out {
        Err(Error::Store(e)) => assert_eq!(e.op, "claim"),
        other => panic!("expected a store error, got {other:?}"),
    }
    assert!(took < Duration::from_millis(2000), "took {took:?}");
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut probe)
        .await
        .unwrap();
    // The paused claim may still have run once the server woke up: then the key is held
    // until its lease lapses. Either way nothing ran, and a later call gets an answer.
    let again = idem
        .call("hung")
        .key("k2")
        .run(async { Ok::<_, Error>(2u8) })
        .await
        .unwrap();
    assert_eq!(again, Outcome::Fresh(2));
}

/// The shared pub/sub connection killed while a duplicate waits: the waiter is woken, listens
/// again on a new connection, and still replays the value.
async fn pubsub_connection_killed_during_a_wait() {
    let server = TempRedis::start(&[]);
    let idem = Idem::redis(&server.url()).await.unwrap();
    let mut probe = raw(&server.url()).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call("pubsub-kill")
                .key("k")
                .run(async move {
                    started_tx.send(()).unwrap();
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    Ok::<_, Error>(3u8)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let waiter = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call("pubsub-kill")
                .key("k")
                .wait(Duration::from_secs(10))
                .run(async { Ok::<_, Error>(4u8) })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed: usize = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut probe)
        .await
        .unwrap();
    assert_eq!(killed, 1, "one shared pub/sub connection");
    assert_eq!(waiter.await.unwrap().unwrap(), Outcome::Replayed(3));
    assert_eq!(holder.await.unwrap().unwrap(), Outcome::Fresh(3));
}

idem_integration::server_tests! {
    REDIS_SERVER => [
        connection_killed_mid_body_completes_after_reconnect,
        connection_killed_before_the_claim_is_retried,
        without_retries_a_killed_connection_is_a_store_error,
        connections_killed_under_load_never_run_a_body_twice_unreported,
        a_hung_server_is_a_store_error_not_a_hang,
        pubsub_connection_killed_during_a_wait,
    ],
}
