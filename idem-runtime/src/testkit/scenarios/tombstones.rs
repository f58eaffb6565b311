//! Tombstones (`tombstone = …`): after `ttl` a key's digest and fingerprint stay, without the
//! value, and a late repeat gets `Error::Expired` instead of running the body again; once the
//! tombstone ends, the key is free.

use super::*;

/// A TTL that ends within a scenario, and a wait past it.
const SHORT_TTL: Duration = Duration::from_millis(400);
const PAST_TTL: Duration = Duration::from_millis(700);

fn counted(
    idem: &Idem,
    name: &str,
    key: &str,
    tombstone: Duration,
    c: &Counter,
) -> impl std::future::Future<Output = Result<Outcome<usize>, Failure>> {
    let c = c.clone();
    idem.call(name.to_string())
        .key(key)
        .ttl(SHORT_TTL)
        .tombstone(tombstone)
        .run(async move { Ok::<_, Failure>(c.hit()) })
}

fn expired(r: Result<Outcome<usize>, Failure>, what: &str) -> (i64, i64) {
    match r {
        Err(Failure::Idem(Error::Expired {
            expired_at, until, ..
        })) => (expired_at, until),
        other => panic!("{what}: expected Expired, got {other:?}"),
    }
}

/// A repeat within the TTL replays; after it the tombstone refuses the call (the body does not
/// run again), also after a purge; another fingerprint is still a mismatch.
pub async fn tombstone_refuses_a_late_repeat(idem: Idem) {
    let name = unique("tomb");
    let c = Counter::default();
    let long = Duration::from_secs(3600);
    assert_eq!(
        counted(&idem, &name, "k", long, &c).await.unwrap(),
        Outcome::Fresh(1)
    );
    assert_eq!(
        counted(&idem, &name, "k", long, &c).await.unwrap(),
        Outcome::Replayed(1)
    );
    tokio::time::sleep(PAST_TTL).await;
    let (expired_at, until) = expired(counted(&idem, &name, "k", long, &c).await, "late");
    assert!(
        until - expired_at >= 3_599_000 && until - expired_at <= 3_600_000,
        "the tombstone is kept for its duration after the TTL: {expired_at}..{until}"
    );
    // A purge keeps the tombstone (and may drop its value).
    idem.purge_expired(1000).await.unwrap();
    expired(
        counted(&idem, &name, "k", long, &c).await,
        "late, after a purge",
    );
    // The same key with other arguments is refused as a mismatch, as before the TTL.
    let other = idem
        .call(name.clone())
        .key("k")
        .fingerprint("other")
        .ttl(SHORT_TTL)
        .tombstone(long)
        .run(async { Ok::<_, Failure>(0usize) })
        .await;
    assert!(
        matches!(other, Err(Failure::Idem(Error::Mismatch { .. }))),
        "{other:?}"
    );
    // A late call that sets no tombstone of its own is refused too: the store keeps it.
    let plain = idem
        .call(name.clone())
        .key("k")
        .run(async { Ok::<_, Failure>(0usize) })
        .await;
    expired(plain, "a call without tombstone");
    assert_eq!(c.get(), 1, "the body ran once");
    // Another key of the same function is not affected.
    assert_eq!(
        counted(&idem, &name, "k2", long, &c).await.unwrap(),
        Outcome::Fresh(2)
    );
}

/// Once the tombstone ends, the key is free again: the next call runs the body.
pub async fn tombstone_ends_and_frees_the_key(idem: Idem) {
    let name = unique("tombend");
    let c = Counter::default();
    let short = Duration::from_millis(900);
    assert_eq!(
        counted(&idem, &name, "k", short, &c).await.unwrap(),
        Outcome::Fresh(1)
    );
    tokio::time::sleep(PAST_TTL).await;
    expired(
        counted(&idem, &name, "k", short, &c).await,
        "in the tombstone",
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    idem.purge_expired(1000).await.unwrap();
    assert_eq!(
        counted(&idem, &name, "k", short, &c).await.unwrap(),
        Outcome::Fresh(2),
        "the tombstone ended"
    );
}

/// The store level: a completion with a tombstone is replayed while live; after its TTL `get`
/// finds nothing live, and a claim finds the record without its value (not claimed, nothing
/// written); the handle's default tombstone applies to calls that set none.
pub async fn tombstone_keeps_no_value_and_blocks_claims(idem: Idem) {
    let name = unique("tombstore");
    let store = idem.store();
    let (key, fp) = (digest(&name, "k"), fingerprint("k"));
    let claim = Claim {
        name: &name,
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_secs(30),
        ttl: SHORT_TTL,
    };
    let ClaimOutcome::Claimed { token, .. } = store.claim(claim).await.unwrap() else {
        panic!("a fresh key is claimed")
    };
    let done = Complete {
        key: &key,
        token,
        value: b"result",
        ttl: SHORT_TTL,
        tombstone: Duration::from_secs(3600),
    };
    assert!(store.complete(done).await.unwrap());
    tokio::time::sleep(PAST_TTL).await;
    idem.purge_expired(1000).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None, "the result expired");
    for _ in 0..2 {
        match store.claim(claim).await.unwrap() {
            ClaimOutcome::Existing(r) => {
                assert_eq!(r.status, Status::Completed, "{r:?}");
                assert_eq!(r.token, token);
                assert_eq!(r.fingerprint, fp);
                assert_eq!(r.value, None, "a tombstone has no value: {r:?}");
                assert!(crate::protocol::tombstoned(
                    r.status,
                    r.expires_at,
                    r.keep_until,
                    r.now
                ));
            }
            other => panic!("a tombstone is not claimed: {other:?}"),
        }
    }
    // The handle's default.
    let with_default = idem.clone().with_tombstone(Duration::from_secs(3600));
    let name = unique("tombdefault");
    let c = Counter::default();
    let call = || {
        let c = c.clone();
        with_default
            .call(name.clone())
            .key("k")
            .ttl(SHORT_TTL)
            .run(async move { Ok::<_, Failure>(c.hit()) })
    };
    assert_eq!(call().await.unwrap(), Outcome::Fresh(1));
    tokio::time::sleep(PAST_TTL).await;
    expired(call().await, "the handle's default tombstone");
    assert_eq!(c.get(), 1);
}
