//! What frees a key and what fences an attempt: errors, panics, dropped futures, lapsed
//! leases, codec changes, TTL.

use super::*;

/// An `Err` from the body releases the key: the next call runs the body again.
pub async fn err_releases_the_key(idem: Idem) {
    let c = Counter::default();
    let name = unique("err");
    let call = |fail: bool| {
        let c = c.clone();
        idem.call(name.clone()).key("k").run(async move {
            let n = c.hit();
            if fail {
                Err(Failure::Body(TestError::Declined(format!("attempt {n}"))))
            } else {
                Ok(n)
            }
        })
    };
    assert!(matches!(call(true).await, Err(Failure::Body(_))));
    assert_eq!(call(false).await.unwrap(), Outcome::Fresh(2));
    assert_eq!(call(false).await.unwrap(), Outcome::Replayed(2));
    assert_eq!(c.get(), 2);
}

/// A panicking body releases the key and the panic reaches the caller.
pub async fn panic_releases_the_key(idem: Idem) {
    let name = unique("panic");
    let joined = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .run(async {
                    if true {
                        panic!("body panicked on purpose");
                    }
                    Ok::<u8, Failure>(0)
                })
                .await
        })
        .await
    };
    let err = joined.expect_err("the panic must reach the caller");
    assert!(err.is_panic());
    let retry = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Failure>(5u8) })
        .await
        .unwrap();
    assert_eq!(retry, Outcome::Fresh(5));
}

/// A future dropped mid-call stops renewing; its claim lapses after the lease.
pub async fn dropped_future_lapses_after_lease(idem: Idem) {
    let name = unique("dropped");
    let lease = Duration::from_millis(400);
    let call = idem
        .call(name.clone())
        .key("k")
        .lease(lease)
        .run(std::future::pending::<Result<u8, Failure>>());
    assert!(tokio::time::timeout(Duration::from_millis(100), call)
        .await
        .is_err());
    let soon = idem
        .call(name.clone())
        .key("k")
        .lease(lease)
        .run(async { Ok::<_, Failure>(1u8) })
        .await;
    assert!(
        matches!(soon, Err(Failure::Idem(Error::InProgress { .. }))),
        "{soon:?}"
    );
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    let later = idem
        .call(name)
        .key("k")
        .lease(lease)
        .run(async { Ok::<_, Failure>(2u8) })
        .await
        .unwrap();
    assert_eq!(later, Outcome::Fresh(2));
}

/// An attempt that outlived its lease (its thread blocked, so no renewal) and was taken
/// over cannot complete: `LeaseLost`; the new attempt's value is the one replayed.
///
/// Ordered by signals, not by sleeps racing each other: the takeover starts once the stalled
/// attempt holds the key and its lease has lapsed (half a lease later), and the stalled body
/// returns only after the takeover finished. The stalled completion then has a third of the
/// lease (its floor in `Held::bound`) to be refused by the token: 500 ms for one statement,
/// so a loaded machine gets `LeaseLost`, not the bound's timeout.
pub async fn lease_lost_completion_is_fenced(idem: Idem) {
    let name = unique("fenced");
    let lease = Duration::from_millis(1500);
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let (taken_tx, taken_rx) = std::sync::mpsc::channel::<()>();
    let stalled = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .lease(lease)
                .run(async move {
                    let _ = claimed_tx.send(());
                    // Blocks this future (so its heartbeat cannot renew) but hands the
                    // worker's other tasks to another thread, as a stalled process would
                    // leave the rest of the world running.
                    tokio::task::block_in_place(|| {
                        let _ = taken_rx.recv_timeout(Duration::from_secs(20));
                    });
                    Ok::<_, Failure>(1u8)
                })
                .await
        })
    };
    claimed_rx
        .await
        .expect("the stalled attempt claims the key");
    tokio::time::sleep(lease + lease / 2).await;
    let took_over = idem
        .call(name.clone())
        .key("k")
        .lease(lease)
        .run(async { Ok::<_, Failure>(2u8) })
        .await
        .unwrap();
    assert_eq!(took_over, Outcome::Fresh(2));
    taken_tx.send(()).unwrap();
    match stalled.await.unwrap() {
        Err(Failure::Idem(Error::LeaseLost { token, .. })) => assert!(token > 0),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let replay = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Failure>(3u8) })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::Replayed(2));
}

/// The store's own steps: a lapsed claim is taken over with a greater token, and every
/// step with the old token is refused.
pub async fn store_steps_are_fenced(idem: Idem) {
    let store = idem.store();
    let name = unique("steps");
    let key = digest(&name, "k");
    let fp = fingerprint("k");
    let claim = Claim {
        name: &name,
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_millis(200),
        ttl: Duration::ZERO,
    };
    let ClaimOutcome::Claimed { token: t1, .. } = store.claim(claim).await.unwrap() else {
        panic!("first claim must succeed")
    };
    match store.claim(claim).await.unwrap() {
        ClaimOutcome::Existing(r) => {
            assert_eq!(
                (r.status, r.token, r.fingerprint),
                (Status::InProgress, t1, fp)
            );
            assert_eq!(r.name, name);
        }
        other => panic!("expected the live claim, got {other:?}"),
    }
    assert!(store
        .renew(&key, t1, Duration::from_millis(200))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ClaimOutcome::Claimed { token: t2, .. } = store.claim(claim).await.unwrap() else {
        panic!("a lapsed claim must be taken over")
    };
    assert!(t2 > t1, "tokens must grow: {t1} then {t2}");
    holds_nothing(store, &key, t1, "taken over").await;
    let fresh = Complete {
        key: &key,
        token: t2,
        value: b"fresh",
        ttl: Duration::from_secs(60),
        tombstone: std::time::Duration::ZERO,
    };
    assert!(store.complete(fresh).await.unwrap());
    assert!(!store.complete(fresh).await.unwrap(), "complete twice");
    assert!(
        !store.release(&key, t2).await.unwrap(),
        "a completed record is not released"
    );
    assert!(!store.renew(&key, t2, Duration::from_secs(1)).await.unwrap());
    let r = store.get(&key).await.unwrap().expect("completed record");
    assert_eq!((r.status, r.token), (Status::Completed, t2));
    assert_eq!(r.value.as_deref(), Some(&b"fresh"[..]));
}

/// The attempt with `token` holds nothing on `key` (`why`: what happened to it): it can neither
/// complete, renew nor release the record there.
async fn holds_nothing(store: &dyn crate::Store, key: &crate::key::Digest, token: u64, why: &str) {
    let stale = Complete {
        key,
        token,
        value: b"stale",
        ttl: Duration::from_secs(60),
        tombstone: std::time::Duration::ZERO,
    };
    assert!(
        !store.complete(stale).await.unwrap(),
        "token {token} ({why}) completed"
    );
    assert!(
        !store
            .renew(key, token, Duration::from_secs(60))
            .await
            .unwrap(),
        "token {token} ({why}) renewed"
    );
    assert!(
        !store.release(key, token).await.unwrap(),
        "token {token} ({why}) released"
    );
}

/// A released claim's token is never handed out again, even to a claim in the same
/// millisecond (the release ends the record and keeps its token rather than deleting it), and
/// the released token holds nothing after: it can neither complete, renew nor release its
/// successor's claim. A forced release ends a live record the same way, and finds nothing to
/// release on a key without a live record.
pub async fn released_tokens_are_never_reused(idem: Idem) {
    let store = idem.store();
    let name = unique("reuse");
    let key = digest(&name, "k");
    let fp = fingerprint("k");
    let claim = Claim {
        name: &name,
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_secs(60),
        ttl: Duration::ZERO,
    };
    let claimed = || async {
        match store.claim(claim).await.unwrap() {
            ClaimOutcome::Claimed { token, .. } => token,
            other => panic!("the key was released: the claim must win, got {other:?}"),
        }
    };
    assert_eq!(
        store.force_release(&key).await.unwrap(),
        None,
        "a key never claimed"
    );
    // Claim, release, claim again at once: many rounds, so that some land in one millisecond.
    let mut previous = claimed().await;
    for _ in 0..50 {
        assert!(store.release(&key, previous).await.unwrap());
        let token = claimed().await;
        assert!(
            token > previous,
            "tokens must grow: {previous} then {token}"
        );
        holds_nothing(
            store,
            &key,
            previous,
            &format!("released, then claimed as {token}"),
        )
        .await;
        previous = token;
    }
    let r = store
        .get(&key)
        .await
        .unwrap()
        .expect("the last claim is live");
    assert_eq!((r.status, r.token), (Status::InProgress, previous));

    // Released and not claimed again: the ended record holds nothing either (a holder whose
    // release answer was lost, retrying, or completing after all).
    assert!(store.release(&key, previous).await.unwrap());
    holds_nothing(store, &key, previous, "released").await;
    assert_eq!(store.get(&key).await.unwrap(), None);
    let token = claimed().await;
    assert!(
        token > previous,
        "tokens must grow: {previous} then {token}"
    );
    holds_nothing(
        store,
        &key,
        previous,
        &format!("released, then claimed as {token}"),
    )
    .await;
    let previous = token;

    // A forced release ends the live claim; there is nothing left to release after it.
    let forced = store
        .force_release(&key)
        .await
        .unwrap()
        .expect("a live claim");
    assert_eq!(
        (forced.status, forced.token),
        (Status::InProgress, previous)
    );
    assert_eq!(
        store.force_release(&key).await.unwrap(),
        None,
        "released twice"
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
    let token = claimed().await;
    assert!(
        token > previous,
        "tokens must grow: {previous} then {token}"
    );
    holds_nothing(
        store,
        &key,
        previous,
        &format!("released, then claimed as {token}"),
    )
    .await;

    // The same for a completed record: its holder's token holds nothing after.
    let done = Complete {
        key: &key,
        token,
        value: b"done",
        ttl: Duration::from_secs(60),
        tombstone: std::time::Duration::ZERO,
    };
    assert!(store.complete(done).await.unwrap());
    let forced = store
        .force_release(&key)
        .await
        .unwrap()
        .expect("a live result");
    assert_eq!((forced.status, forced.token), (Status::Completed, token));
    assert_eq!(forced.value.as_deref(), Some(&b"done"[..]));
    assert_eq!(
        store.force_release(&key).await.unwrap(),
        None,
        "released twice"
    );
    let next = claimed().await;
    assert!(next > token, "tokens must grow: {token} then {next}");
    holds_nothing(
        store,
        &key,
        token,
        &format!("released, then claimed as {next}"),
    )
    .await;
    assert!(store.release(&key, next).await.unwrap());
    assert_eq!(
        store.force_release(&key).await.unwrap(),
        None,
        "ended by its release"
    );
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// A body slower than its lease (lease 1 s, body 3 s) keeps its claim by renewal: no
/// duplicate runs it a second time.
pub async fn renewal_keeps_a_slow_body_exclusive(idem: Idem) {
    let c = Counter::default();
    let name = unique("slow");
    let run = |c: Counter| {
        idem.call(name.clone())
            .key("k")
            .lease(Duration::from_secs(1))
            .run(async move {
                c.hit();
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, Failure>(1u8)
            })
    };
    let slow = tokio::spawn(run(c.clone()));
    let started = std::time::Instant::now();
    // Duplicates well past the first lease (1 s) and short of the body's end (3 s).
    while started.elapsed() < Duration::from_millis(2300) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let dup = run(c.clone()).await;
        assert!(
            matches!(dup, Err(Failure::Idem(Error::InProgress { .. }))),
            "{dup:?}"
        );
    }
    assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
    assert_eq!(c.get(), 1);
}

/// A stored value that no longer decodes into the return type is `Error::Codec`, and the
/// body does not run.
pub async fn type_change_is_a_codec_error(idem: Idem) {
    let name = unique("codec");
    let c = Counter::default();
    charge(&idem, &name, "k", &c).await.unwrap();
    let c2 = c.clone();
    let changed = idem
        .call(name)
        .key("k")
        .run(async move {
            c2.hit();
            Ok::<u64, Failure>(0)
        })
        .await;
    match changed {
        Err(Failure::Idem(Error::Codec(e))) => {
            assert_eq!(e.kind, crate::CodecErrorKind::TypeChanged)
        }
        other => panic!("expected a codec error, got {other:?}"),
    }
    assert_eq!(c.get(), 1);
}

/// Once `ttl` has passed, the key is free again.
pub async fn ttl_expiry_frees_the_key(idem: Idem) {
    let name = unique("ttl");
    let c = Counter::default();
    let call = || {
        let c = c.clone();
        idem.call(name.clone())
            .key("k")
            .ttl(Duration::from_millis(400))
            .run(async move { Ok::<_, Failure>(c.hit()) })
    };
    assert_eq!(call().await.unwrap(), Outcome::Fresh(1));
    assert_eq!(call().await.unwrap(), Outcome::Replayed(1));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(call().await.unwrap(), Outcome::Fresh(2));
}
