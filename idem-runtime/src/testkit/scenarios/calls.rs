//! One call and its repeats: run once, replay, in progress, wait, mismatch, and what makes
//! two keys two.

use super::*;

/// The first call for a key runs the body once and returns its value fresh.
pub async fn first_call_runs_body_once(idem: Idem) {
    let c = Counter::default();
    let name = unique("first");
    let out = charge(&idem, &name, "k", &c).await.unwrap();
    assert!(!out.is_replayed());
    assert_eq!(out.into_inner().id, 1);
    assert_eq!(c.get(), 1);
}

/// A repeat after the first finished replays the stored value; the body does not run.
pub async fn repeat_after_finish_replays(idem: Idem) {
    let c = Counter::default();
    let name = unique("replay");
    let first = charge(&idem, &name, "k", &c).await.unwrap();
    for _ in 0..3 {
        let again = charge(&idem, &name, "k", &c).await.unwrap();
        assert!(again.is_replayed());
        assert_eq!(again.into_inner(), first.clone().into_inner());
    }
    assert_eq!(c.get(), 1);
    let other = charge(&idem, &name, "other", &c).await.unwrap();
    assert!(!other.is_replayed());
    assert_eq!(c.get(), 2);
}

/// A repeat while an attempt is in flight gets `InProgress` at once.
pub async fn repeat_in_flight_is_in_progress(idem: Idem) {
    let name = unique("inflight");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = idem.clone();
        let name = name.clone();
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .run(async move {
                    started_tx.send(()).unwrap();
                    go_rx.await.unwrap();
                    Ok::<_, Failure>(7u32)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let dup = idem
        .call(name.clone())
        .key("k")
        .run(async { Ok::<_, Failure>(8u32) })
        .await;
    match dup {
        Err(Failure::Idem(Error::InProgress {
            retry_after, key, ..
        })) => {
            assert!(
                retry_after <= crate::protocol::MAX_RETRY_AFTER,
                "{retry_after:?}"
            );
            assert_eq!(key, digest(&name, "k").to_hex());
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    go_tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Fresh(7));
    let after = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Failure>(9u32) })
        .await
        .unwrap();
    assert_eq!(after, Outcome::Replayed(7));
}

/// With `wait`, a duplicate waits for the attempt in flight and replays its value.
pub async fn wait_replays_the_finished_value(idem: Idem) {
    let c = Counter::default();
    let name = unique("wait");
    let slow = {
        let (idem, name, c) = (idem.clone(), name.clone(), c.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .run(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, Failure>(c.hit())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c2 = c.clone();
    let waited = idem
        .call(name)
        .key("k")
        .wait(Duration::from_secs(10))
        .run(async move { Ok::<_, Failure>(c2.hit() + 100) })
        .await
        .unwrap();
    assert_eq!(waited, Outcome::Replayed(1));
    assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
    assert_eq!(c.get(), 1);
}

/// A duplicate whose `wait` runs out gets `InProgress`.
pub async fn wait_gives_up_with_in_progress(idem: Idem) {
    let name = unique("waitout");
    let slow = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .run(async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok::<_, Failure>(1u8)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let dup = idem
        .call(name)
        .key("k")
        .wait(Duration::from_millis(200))
        .run(async { Ok::<_, Failure>(2u8) })
        .await;
    assert!(
        matches!(dup, Err(Failure::Idem(Error::InProgress { .. }))),
        "{dup:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < Duration::from_millis(1400));
    assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
}

/// The same key with another fingerprint is refused, finished or in flight.
pub async fn mismatch_is_refused(idem: Idem) {
    let c = Counter::default();
    let name = unique("mismatch");
    let call = |amount: u32| {
        let c = c.clone();
        idem.call(name.clone())
            .key("order-1")
            .fingerprint(&("order-1", amount))
            .run(async move {
                c.hit();
                Ok::<_, Failure>(amount)
            })
    };
    assert_eq!(call(100).await.unwrap(), Outcome::Fresh(100));
    assert!(matches!(
        call(200).await,
        Err(Failure::Idem(Error::Mismatch { .. }))
    ));
    assert_eq!(call(100).await.unwrap(), Outcome::Replayed(100));
    assert_eq!(c.get(), 1);

    // In flight: a different payload is a mismatch, not "in progress".
    let name2 = unique("mismatch-inflight");
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (idem, name2) = (idem.clone(), name2.clone());
        tokio::spawn(async move {
            idem.call(name2)
                .key("k")
                .fingerprint(&1)
                .run(async move {
                    go_rx.await.unwrap();
                    Ok::<_, Failure>(1)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dup = idem
        .call(name2)
        .key("k")
        .fingerprint(&2)
        .run(async { Ok::<_, Failure>(2) })
        .await;
    assert!(
        matches!(dup, Err(Failure::Idem(Error::Mismatch { .. }))),
        "{dup:?}"
    );
    go_tx.send(()).unwrap();
    first.await.unwrap().unwrap();
}

/// 64 concurrent calls with one key run the body exactly once; every caller gets its value.
pub async fn concurrent_duplicates_run_once(idem: Idem) {
    stampede(&idem, 64, Duration::from_millis(50)).await;
}

/// Keys are digests: an empty key, a 100 KB key and a key with NUL bytes are keys like any
/// other, and distinct from each other.
pub async fn odd_keys_are_just_keys(idem: Idem) {
    let name = unique("oddkeys");
    let c = Counter::default();
    let big = "x".repeat(100 * 1024);
    let keys = ["", big.as_str(), "a\0b", "a\0c", "\0"];
    for k in keys {
        assert!(!charge(&idem, &name, k, &c).await.unwrap().is_replayed());
    }
    for k in keys {
        assert!(charge(&idem, &name, k, &c).await.unwrap().is_replayed());
    }
    assert_eq!(c.get(), keys.len());
}

/// With the keep policy an `Err` is stored and replayed like an `Ok`.
pub async fn kept_errors_replay(idem: Idem) {
    let name = unique("keep");
    let c = Counter::default();
    let call = || {
        let c = c.clone();
        idem.call(name.clone())
            .key("k")
            .run_with(KeepErrors, async move {
                c.hit();
                Err::<u8, _>(TestError::Declined("card declined".into()))
            })
    };
    assert_eq!(
        call().await,
        Err(TestError::Declined("card declined".into()))
    );
    assert_eq!(
        call().await,
        Err(TestError::Declined("card declined".into()))
    );
    assert_eq!(c.get(), 1);
}

/// The same key in two scopes, or in two namespaces, is two keys.
pub async fn scope_and_name_separate_keys(idem: Idem) {
    let name = unique("scoped");
    let c = Counter::default();
    for tenant in ["alice", "bob", "alice", "bob"] {
        let c = c.clone();
        idem.call(name.clone())
            .scope(tenant)
            .key("k")
            .run(async move { Ok::<_, Failure>(c.hit()) })
            .await
            .unwrap();
    }
    assert_eq!(c.get(), 2);
    let other = unique("scoped-other");
    charge(&idem, &other, "k", &c).await.unwrap();
    assert_eq!(c.get(), 3);
}

/// `current_key()` is the same on every attempt of one logical call.
pub async fn current_key_is_stable_across_retries(idem: Idem) {
    let name = unique("curkey");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for fail in [true, false] {
        let seen = seen.clone();
        let _ = idem
            .call(name.clone())
            .key("k")
            .run(async move {
                seen.lock().unwrap().push(crate::current_key());
                if fail {
                    Err(Failure::Body(TestError::Declined("first".into())))
                } else {
                    Ok(())
                }
            })
            .await;
    }
    let seen = seen.lock().unwrap();
    let expected = Some(digest(&name, "k").to_hex());
    assert_eq!(*seen, vec![expected.clone(), expected]);
    assert_eq!(crate::current_key(), None);
}
