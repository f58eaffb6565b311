//! Abandoned attempts at the store level (the `Store` trait itself, on the handle's store): a
//! lapsed claim is taken over as abandoned, a released one is not; park, abandon and resolve
//! act only where the protocol says; purges keep what must be kept.

use super::*;
use crate::key::Digest;
use crate::store::{Record, Resolve, Resolved, Store, Takeover};

/// A lease short enough to lapse within a test, yet long enough for the steps a scenario takes
/// right after its claim (DynamoDB Local on a loaded machine takes tens of milliseconds a
/// request), and the wait that outlasts it (two and a half leases).
const SHORT_LEASE: Duration = Duration::from_millis(500);
const LAPSE: Duration = Duration::from_millis(1250);
/// A lease that does not lapse within a scenario.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// What a result of the keys below would be kept for: the claims keep their records as long.
const TTL: Duration = Duration::from_secs(60);

/// One key of a scenario, and its claims.
struct Key {
    name: String,
    key: Digest,
    fp: Digest,
}

impl Key {
    fn new(what: &str) -> Key {
        let name = unique(what);
        Key {
            key: digest(&name, "k"),
            fp: fingerprint("k"),
            name,
        }
    }

    fn claim(&self, lease: Duration, ttl: Duration) -> Claim<'_> {
        Claim {
            name: &self.name,
            key: &self.key,
            fingerprint: &self.fp,
            lease,
            ttl,
        }
    }

    /// A claim that must win: its token and takeover.
    async fn claimed(
        &self,
        store: &dyn Store,
        lease: Duration,
        ttl: Duration,
    ) -> (u64, Option<Takeover>) {
        match store.claim(self.claim(lease, ttl)).await.unwrap() {
            ClaimOutcome::Claimed { token, takeover } => (token, takeover),
            other => panic!("{}: the claim must win, got {other:?}", self.name),
        }
    }

    async fn live(&self, store: &dyn Store) -> Record {
        store
            .get(&self.key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: a live record", self.name))
    }

    fn done<'a>(&'a self, token: u64, value: &'a [u8]) -> Complete<'a> {
        Complete {
            key: &self.key,
            token,
            value,
            ttl: TTL,
            tombstone: std::time::Duration::ZERO,
        }
    }
}

/// The attempt with `token` can do nothing on `key`: complete, renew, release, park, abandon.
async fn fenced_out(store: &dyn Store, k: &Key, token: u64, why: &str) {
    assert!(
        !store.complete(k.done(token, b"stale")).await.unwrap(),
        "{why}: completed"
    );
    assert!(
        !store.renew(&k.key, token, TTL).await.unwrap(),
        "{why}: renewed"
    );
    assert!(
        !store.release(&k.key, token).await.unwrap(),
        "{why}: released"
    );
    assert!(!store.park(&k.key, token).await.unwrap(), "{why}: parked");
    assert!(
        !store.abandon(&k.key, token).await.unwrap(),
        "{why}: abandoned"
    );
}

/// A claim whose lease lapsed without a result or a release is abandoned: the next claim takes
/// it over with a greater token, attempt 2, and the abandoned attempt's start; the old attempt
/// is fenced out (its completion refused). Abandoned again, the next takeover is attempt 3.
pub async fn lapsed_claim_is_taken_over_as_abandoned(idem: Idem) {
    let store = idem.store();
    let k = Key::new("abandoned");
    let (t1, takeover) = k.claimed(store, SHORT_LEASE, TTL).await;
    assert_eq!(takeover, None, "a new key");
    let first = k.live(store).await;
    assert_eq!((first.attempt, first.status), (1, Status::InProgress));
    assert!(first.keep_until >= first.created_at + TTL.as_millis() as i64);
    tokio::time::sleep(LAPSE).await;
    assert_eq!(store.get(&k.key).await.unwrap(), None, "lapsed: not live");

    let (t2, takeover) = k.claimed(store, SHORT_LEASE, TTL).await;
    assert!(t2 > t1, "tokens must grow: {t1} then {t2}");
    assert_eq!(
        takeover,
        Some(Takeover {
            attempt: 2,
            abandoned_at: first.created_at
        })
    );
    let second = k.live(store).await;
    assert_eq!((second.attempt, second.token), (2, t2));
    fenced_out(store, &k, t1, "the abandoned attempt").await;

    tokio::time::sleep(LAPSE).await;
    let (t3, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(t3 > t2);
    assert_eq!(
        takeover,
        Some(Takeover {
            attempt: 3,
            abandoned_at: second.created_at
        })
    );
    assert!(
        !store.complete(k.done(t2, b"late")).await.unwrap(),
        "fenced"
    );
    assert!(store.complete(k.done(t3, b"third")).await.unwrap());
    let done = k.live(store).await;
    assert_eq!(
        (done.status, done.token, done.attempt),
        (Status::Completed, t3, 3)
    );
    assert_eq!(done.value.as_deref(), Some(&b"third"[..]));
}

/// A released key (released by its attempt, force-released, or expired after its result) is
/// free, not abandoned: its next claim is attempt 1 without a takeover.
pub async fn released_key_is_not_abandoned(idem: Idem) {
    let store = idem.store();
    let k = Key::new("released");
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(store.release(&k.key, t1).await.unwrap());
    let (t2, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(t2 > t1);
    assert_eq!(takeover, None, "released");
    assert_eq!(k.live(store).await.attempt, 1);

    let forced = store.force_release(&k.key).await.unwrap().expect("live");
    assert_eq!(forced.token, t2);
    let (t3, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert_eq!(takeover, None, "force-released");

    let short = Complete {
        ttl: Duration::from_millis(100),
        tombstone: std::time::Duration::ZERO,
        ..k.done(t3, b"brief")
    };
    assert!(store.complete(short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert_eq!(takeover, None, "expired after its result");
    assert_eq!(k.live(store).await.attempt, 1);
}

/// Only the token that holds the key parks it. A parked key is live whatever its lease was:
/// `get` shows it, every claim (any arguments) finds it, and no token holds it any more.
pub async fn parked_key_is_live_and_held_by_nobody(idem: Idem) {
    let store = idem.store();
    let k = Key::new("parked");
    let (t1, _) = k.claimed(store, SHORT_LEASE, TTL).await;
    assert!(!store.park(&k.key, t1 + 1).await.unwrap(), "another token");
    assert!(store.park(&k.key, t1).await.unwrap());
    tokio::time::sleep(LAPSE).await;
    let r = k.live(store).await;
    assert_eq!((r.status, r.token), (Status::Parked, t1));
    assert_eq!((r.expires_at, r.keep_until), (i64::MAX, i64::MAX));
    match store.claim(k.claim(SHORT_LEASE, TTL)).await.unwrap() {
        ClaimOutcome::Existing(found) => assert_eq!(found.status, Status::Parked),
        other => panic!("a parked key is live: {other:?}"),
    }
    let other_fp = fingerprint("other");
    let other = Claim {
        fingerprint: &other_fp,
        ..k.claim(SHORT_LEASE, TTL)
    };
    assert!(matches!(
        store.claim(other).await.unwrap(),
        ClaimOutcome::Existing(found) if found.status == Status::Parked
    ));
    fenced_out(store, &k, t1, "parked").await;
    assert_eq!(k.live(store).await.status, Status::Parked, "unchanged");
    // A parked key never goes by itself: leave none behind on a shared server.
    store.force_release(&k.key).await.unwrap();
}

/// `abandon` (an undecided reconcile) ends the lease of the holder only, and leaves the record
/// abandoned: the next claim takes it over as attempt + 1.
pub async fn abandon_makes_the_next_claim_a_takeover(idem: Idem) {
    let store = idem.store();
    let k = Key::new("abandon");
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    let first = k.live(store).await;
    assert!(
        !store.abandon(&k.key, t1 + 1).await.unwrap(),
        "another token"
    );
    assert!(store.abandon(&k.key, t1).await.unwrap());
    assert_eq!(store.get(&k.key).await.unwrap(), None, "not live");
    assert!(!store.abandon(&k.key, t1).await.unwrap(), "twice");
    let (t2, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(t2 > t1);
    assert_eq!(
        takeover,
        Some(Takeover {
            attempt: 2,
            abandoned_at: first.created_at
        })
    );
    fenced_out(store, &k, t1, "abandoned, then taken over").await;
}

/// `resolve` acts on a parked key only: applied, the key is completed with the value (the
/// parked token kept); not applied, it is released and the next claim is a fresh attempt 1.
/// On a free, running or completed key it changes nothing and says what it found.
pub async fn resolve_acts_only_on_parked_keys(idem: Idem) {
    let store = idem.store();
    let applied = |value| Resolve::Applied { value, ttl: TTL };
    let k = Key::new("resolve");
    assert_eq!(
        store.resolve(&k.key, applied(b"v")).await.unwrap(),
        Resolved::NotParked(None),
        "a free key"
    );
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    match store.resolve(&k.key, Resolve::NotApplied).await.unwrap() {
        Resolved::NotParked(Some(r)) => assert_eq!((r.status, r.token), (Status::InProgress, t1)),
        other => panic!("a running key: {other:?}"),
    }
    assert_eq!(k.live(store).await.status, Status::InProgress, "unchanged");
    assert!(store.complete(k.done(t1, b"body")).await.unwrap());
    match store.resolve(&k.key, applied(b"v")).await.unwrap() {
        Resolved::NotParked(Some(r)) => assert_eq!(r.status, Status::Completed),
        other => panic!("a completed key: {other:?}"),
    }
    assert_eq!(k.live(store).await.value.as_deref(), Some(&b"body"[..]));

    // Applied: completed with the operator's value, the parked token kept.
    let k = Key::new("resolve-applied");
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(store.park(&k.key, t1).await.unwrap());
    match store.resolve(&k.key, applied(b"operator")).await.unwrap() {
        Resolved::Done(r) => assert_eq!((r.status, r.token), (Status::Parked, t1)),
        other => panic!("a parked key: {other:?}"),
    }
    let r = k.live(store).await;
    assert_eq!((r.status, r.token), (Status::Completed, t1));
    assert_eq!(r.value.as_deref(), Some(&b"operator"[..]));
    assert!(r.remaining() > TTL / 2 && r.remaining() <= TTL);
    assert!(matches!(
        store.resolve(&k.key, Resolve::NotApplied).await.unwrap(),
        Resolved::NotParked(Some(r)) if r.status == Status::Completed
    ));

    // Not applied: released; the next claim runs as a first attempt.
    let k = Key::new("resolve-not-applied");
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(store.park(&k.key, t1).await.unwrap());
    assert!(matches!(
        store.resolve(&k.key, Resolve::NotApplied).await.unwrap(),
        Resolved::Done(r) if r.status == Status::Parked
    ));
    assert_eq!(store.get(&k.key).await.unwrap(), None, "free");
    let (t2, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(t2 > t1);
    assert_eq!(takeover, None, "released, not abandoned");
    assert_eq!(k.live(store).await.attempt, 1);
}

/// An operator may force-release a parked key: it is free, and the next claim is a fresh
/// attempt.
pub async fn force_release_frees_a_parked_key(idem: Idem) {
    let store = idem.store();
    let k = Key::new("force-parked");
    let (t1, _) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(store.park(&k.key, t1).await.unwrap());
    let forced = store.force_release(&k.key).await.unwrap().expect("parked");
    assert_eq!((forced.status, forced.token), (Status::Parked, t1));
    assert_eq!(store.get(&k.key).await.unwrap(), None);
    let (t2, takeover) = k.claimed(store, LONG_LEASE, TTL).await;
    assert!(t2 > t1);
    assert_eq!(takeover, None);
}

/// A purge never removes a parked record, and keeps an abandoned one until its `keep_until`
/// (its claim's TTL): the next claim still takes it over. A claim that asked for nothing past
/// its lease is as good as free once that passed.
pub async fn purge_keeps_parked_and_abandoned_records(idem: Idem) {
    let store = idem.store();
    let abandoned = Key::new("purge-abandoned");
    let parked = Key::new("purge-parked");
    let brief = Key::new("purge-brief");
    // Abandoned and parked by their holders, which leaves no timing to the test but the brief
    // claim's lapse.
    let (ta, _) = abandoned.claimed(store, LONG_LEASE, TTL).await;
    let started = abandoned.live(store).await.created_at;
    assert!(store.abandon(&abandoned.key, ta).await.unwrap());
    let (tp, _) = parked.claimed(store, LONG_LEASE, TTL).await;
    assert!(store.park(&parked.key, tp).await.unwrap());
    let (tb, _) = brief.claimed(store, SHORT_LEASE, Duration::ZERO).await;
    tokio::time::sleep(LAPSE).await;
    idem.purge_expired(1000).await.unwrap();
    assert_eq!(parked.live(store).await.status, Status::Parked);
    let (t, takeover) = abandoned.claimed(store, SHORT_LEASE, TTL).await;
    assert!(t > ta);
    assert_eq!(
        takeover,
        Some(Takeover {
            attempt: 2,
            abandoned_at: started
        }),
        "kept until its keep_until"
    );
    let (t, takeover) = brief.claimed(store, SHORT_LEASE, TTL).await;
    assert!(t > tb);
    assert_eq!(takeover, None, "kept no longer than its lease");
    store.force_release(&parked.key).await.unwrap();
}
