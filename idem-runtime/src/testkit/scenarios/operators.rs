//! The operators' side of a store: purge, get, forced release, and values kept as given.

use super::*;

/// `purge_expired` removes expired records and leaves live ones.
pub async fn purge_removes_only_expired_records(idem: Idem) {
    let name = unique("purge");
    let c = Counter::default();
    for i in 0..5 {
        let c = c.clone();
        idem.call(name.clone())
            .key(&("short", i))
            .ttl(Duration::from_millis(100))
            .run(async move { Ok::<_, Failure>(c.hit()) })
            .await
            .unwrap();
    }
    for i in 0..3 {
        charge(&idem, &name, &format!("long-{i}"), &c)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    idem.purge_expired(2).await.unwrap();
    let store = idem.store();
    for i in 0..5 {
        let key = digest(&name, &("short", i));
        assert_eq!(
            store.force_release(&key).await.unwrap(),
            None,
            "expired record {i} left"
        );
    }
    for i in 0..3 {
        let key = digest(&name, &format!("long-{i}"));
        assert!(
            store.get(&key).await.unwrap().is_some(),
            "live record {i} purged"
        );
    }
    assert_eq!(c.get(), 8);
}

/// A purge that runs while calls take over expired keys deletes none of the claims those
/// calls now hold: every call runs, completes and stores its result. (A purge that deleted
/// a row between its takeover and its completion would fail that completion.)
pub async fn purge_spares_claims_taken_over_meanwhile(idem: Idem) {
    const N: usize = 200;
    let name = unique("purgerace");
    for i in 0..N {
        idem.call(name.clone())
            .key(&i)
            .ttl(Duration::from_millis(50))
            .run(async move { Ok::<_, Failure>(i) })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let purge = {
        let idem = idem.clone();
        tokio::spawn(async move {
            for _ in 0..N / 5 {
                idem.purge_expired(5).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let callers: Vec<_> = (0..4)
        .map(|t| {
            let (idem, name) = (idem.clone(), name.clone());
            tokio::spawn(async move {
                for i in (t..N).step_by(4) {
                    let out = idem
                        .call(name.clone())
                        .key(&i)
                        .run(async move {
                            tokio::task::yield_now().await;
                            Ok::<_, Failure>(N + i)
                        })
                        .await
                        .unwrap();
                    assert_eq!(out, Outcome::Fresh(N + i), "key {i}");
                }
            })
        })
        .collect();
    for c in callers {
        c.await.unwrap();
    }
    purge.await.unwrap();
    for i in 0..N {
        let out = idem
            .call(name.clone())
            .key(&i)
            .run(async move { Ok::<_, Failure>(0) })
            .await
            .unwrap();
        assert_eq!(out, Outcome::Replayed(N + i), "key {i}");
    }
}

/// `get` returns the live record as stored: name, fingerprint, status, value, times.
pub async fn get_returns_the_live_record(idem: Idem) {
    let name = unique("get");
    let c = Counter::default();
    let out = charge(&idem, &name, "k", &c).await.unwrap().into_inner();
    let r = idem
        .store()
        .get(&digest(&name, "k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.name, name);
    assert_eq!(r.status, Status::Completed);
    assert_eq!(r.fingerprint, fingerprint("k"));
    assert!(r.remaining() <= Duration::from_secs(24 * 3600));
    assert!(r.remaining() > Duration::from_secs(23 * 3600));
    // Through the handle, which decrypts what it encrypted.
    let text = idem.describe_value(&r);
    assert!(text.contains(&out.memo), "{text}");
    assert_eq!(
        idem.store().get(&digest(&name, "absent")).await.unwrap(),
        None
    );
}

/// An operator's forced release frees a live claim at once.
pub async fn force_release_frees_a_live_claim(idem: Idem) {
    let name = unique("force");
    let pending = idem
        .call(name.clone())
        .key("k")
        .lease(Duration::from_secs(60))
        .run(std::future::pending::<Result<u8, Failure>>());
    assert!(tokio::time::timeout(Duration::from_millis(50), pending)
        .await
        .is_err());
    let released = idem
        .store()
        .force_release(&digest(&name, "k"))
        .await
        .unwrap();
    assert_eq!(released.map(|r| r.status), Some(Status::InProgress));
    let retry = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Failure>(1u8) })
        .await
        .unwrap();
    assert_eq!(retry, Outcome::Fresh(1));
}

/// Stored values are binary-safe: every byte value round-trips through the store.
pub async fn values_are_binary_safe(idem: Idem) {
    let name = unique("binary");
    let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    let c = Counter::default();
    let call = || {
        let (bytes, c) = (bytes.clone(), c.clone());
        idem.call(name.clone()).key("k").run(async move {
            c.hit();
            Ok::<_, Failure>((bytes, "\0\u{1F600}\"\\".to_string()))
        })
    };
    let a = call().await.unwrap();
    let b = call().await.unwrap();
    assert!(b.is_replayed());
    assert_eq!(a.into_inner(), b.into_inner());
    assert_eq!(c.get(), 1);
}

/// A stored value copied under another key, or into another namespace, by someone who can
/// write the store: on a handle that encrypts, the copy does not open (`CodecErrorKind::Decrypt`,
/// bound to its key digest and namespace) and no body runs; on a plain handle it replays as
/// written (nothing binds a plain value to its key, which is what encryption adds).
pub async fn copied_values_do_not_decrypt_under_another_key(idem: Idem) {
    #[cfg(feature = "encryption")]
    let encrypts = idem.codec().keyring.is_some();
    #[cfg(not(feature = "encryption"))]
    let encrypts = false;
    let name = unique("copied");
    let c = Counter::default();
    let original = charge(&idem, &name, "a", &c).await.unwrap().into_inner();
    let store = idem.store();
    let a = store
        .get(&digest(&name, "a"))
        .await
        .unwrap()
        .expect("a's record");
    let other = unique("copied-elsewhere");
    for (ns, key) in [(name.as_str(), "b"), (other.as_str(), "a")] {
        let to = digest(ns, key);
        let ClaimOutcome::Claimed { token, .. } = store
            .claim(Claim {
                name: ns,
                key: &to,
                fingerprint: &fingerprint(key),
                lease: Duration::from_secs(30),
                ttl: Duration::ZERO,
            })
            .await
            .unwrap()
        else {
            panic!("{ns}/{key} is a new key")
        };
        let copied = Complete {
            key: &to,
            token,
            value: a.value.as_deref().expect("a completed record has a value"),
            ttl: Duration::from_secs(60),
            tombstone: std::time::Duration::ZERO,
        };
        assert!(store.complete(copied).await.unwrap());
        match charge(&idem, ns, key, &c).await {
            Err(Failure::Idem(Error::Codec(e))) if encrypts => {
                assert_eq!(e.kind, crate::CodecErrorKind::Decrypt, "{ns}/{key}: {e}")
            }
            Ok(Outcome::Replayed(receipt)) if !encrypts => assert_eq!(receipt, original),
            other => panic!("{ns}/{key} (encrypted: {encrypts}): {other:?}"),
        }
    }
    assert_eq!(c.get(), 1, "no body ran on a copied value");
}
