//! Resumable calls at the store level: arguments kept with a claim (fenced like every step),
//! and the query a resumer reads, which lists exactly the abandoned records that keep them.

use super::*;
use crate::key::Digest;
use crate::store::{Record, Store};

const SHORT_LEASE: Duration = Duration::from_millis(500);
const LAPSE: Duration = Duration::from_millis(1250);
const LONG_LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(60);

/// A claim of key `k` in namespace `name`, that must win: its token.
async fn claimed(store: &dyn Store, name: &str, k: &str, lease: Duration) -> (Digest, u64) {
    let key = digest(name, k);
    let fp = fingerprint(k);
    let claim = Claim {
        name,
        key: &key,
        fingerprint: &fp,
        lease,
        ttl: TTL,
    };
    match store.claim(claim).await.unwrap() {
        ClaimOutcome::Claimed { token, .. } => (key, token),
        other => panic!("{name}/{k}: the claim must win, got {other:?}"),
    }
}

async fn abandoned(store: &dyn Store, names: &[&str], limit: usize) -> Vec<Record> {
    store.abandoned_calls(names, limit).await.unwrap()
}

/// Only abandoned records that keep arguments are listed, of the names asked for, the longest
/// lapsed first, with their arguments; live, completed, released and parked ones, and
/// abandoned ones without arguments, are not.
pub async fn abandoned_calls_lists_only_abandoned_records_with_arguments(idem: Idem) {
    let store = idem.store();
    let name = unique("resume-list");
    let other = unique("resume-other");
    let (first, t1) = claimed(store, &name, "first", SHORT_LEASE).await;
    assert!(store.keep_args(&first, t1, b"args-1").await.unwrap());
    assert!(
        !store.keep_args(&first, t1 + 1, b"stale").await.unwrap(),
        "keep_args is fenced by the token"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (second, t2) = claimed(store, &name, "second", SHORT_LEASE).await;
    assert!(store.keep_args(&second, t2, b"args-2").await.unwrap());
    // Abandoned without arguments (not a resumable call).
    claimed(store, &name, "plain", SHORT_LEASE).await;
    // Completed, released and parked resumable calls.
    let (done, t) = claimed(store, &name, "done", LONG_LEASE).await;
    assert!(store.keep_args(&done, t, b"args").await.unwrap());
    let value = crate::codec::encode_ok(&1u8).unwrap();
    let complete = Complete {
        key: &done,
        token: t,
        value: &value,
        ttl: TTL,
        tombstone: Duration::ZERO,
    };
    assert!(store.complete(complete).await.unwrap());
    let (released, t) = claimed(store, &name, "released", SHORT_LEASE).await;
    assert!(store.keep_args(&released, t, b"args").await.unwrap());
    assert!(store.release(&released, t).await.unwrap());
    let (parked, t) = claimed(store, &name, "parked", SHORT_LEASE).await;
    assert!(store.keep_args(&parked, t, b"args").await.unwrap());
    assert!(store.park(&parked, t).await.unwrap());
    // Another name's abandoned call.
    let (theirs, t) = claimed(store, &other, "theirs", SHORT_LEASE).await;
    assert!(store.keep_args(&theirs, t, b"args").await.unwrap());

    assert!(
        abandoned(store, &[&name], 10).await.is_empty(),
        "nothing is listed while its lease runs"
    );
    tokio::time::sleep(LAPSE).await;
    let found = abandoned(store, &[&name], 10).await;
    let keys: Vec<Digest> = found.iter().map(|r| r.key).collect();
    assert_eq!(keys, vec![first, second], "{found:?}");
    assert_eq!(found[0].value.as_deref(), Some(&b"args-1"[..]));
    assert_eq!(found[0].status, Status::InProgress);
    assert_eq!(found[0].name, name);
    assert_eq!(abandoned(store, &[&name], 1).await.len(), 1);
    let both = abandoned(store, &[&name, &other], 10).await;
    assert_eq!(both.len(), 3, "{both:?}");
}

/// A takeover's claim keeps the arguments (a resumer that dies right after taking a call over
/// leaves it abandoned with them, for another), and the attempt that took over may keep them
/// anew.
pub async fn a_takeover_keeps_arguments_again(idem: Idem) {
    let store = idem.store();
    let name = unique("resume-takeover");
    let (key, token) = claimed(store, &name, "k", SHORT_LEASE).await;
    assert!(store.keep_args(&key, token, b"v1").await.unwrap());
    tokio::time::sleep(LAPSE).await;
    assert_eq!(abandoned(store, &[&name], 10).await.len(), 1);

    let (again, token) = claimed(store, &name, "k", SHORT_LEASE).await;
    assert_eq!(again, key);
    assert!(
        abandoned(store, &[&name], 10).await.is_empty(),
        "live again"
    );
    let live = store.get(&key).await.unwrap().expect("live");
    assert_eq!(
        live.value.as_deref(),
        Some(&b"v1"[..]),
        "kept by the takeover"
    );
    assert!(store.keep_args(&key, token, b"v2").await.unwrap());
    tokio::time::sleep(LAPSE).await;
    let found = abandoned(store, &[&name], 10).await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].value.as_deref(), Some(&b"v2"[..]));
    assert_eq!(found[0].attempt, 2);
}
