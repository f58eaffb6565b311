//! What happens to a result on its way to the store: the size limit, compression, encryption
//! at rest and the handle's local cache, on the memory and SQLite stores.
//!
//! The stores are real; [`Counted`] is the memory store with a count of its claims in front,
//! so that a test can see which replays reached the store.

use idem::key::Digest;
use idem::store::memory::MemoryStore;
use idem::store::{BoxFuture, Claim, ClaimOutcome, Complete, Record, Resolve, Resolved};
use idem::{Backend, CodecErrorKind, Error, Idem, Outcome, Store};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The memory store, counting claims, with an optional limit of its own on a value's size.
struct Counted {
    inner: MemoryStore,
    claims: Arc<AtomicUsize>,
    max_value_len: Option<usize>,
}

impl Counted {
    fn new(max_value_len: Option<usize>) -> (Counted, Arc<AtomicUsize>) {
        let claims = Arc::new(AtomicUsize::new(0));
        let store = Counted {
            inner: MemoryStore::new(),
            claims: claims.clone(),
            max_value_len,
        };
        (store, claims)
    }
}

impl Store for Counted {
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn claim<'a>(&'a self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(claim)
    }
    fn complete<'a>(&'a self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.complete(done)
    }
    fn release<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(key, token)
    }
    fn renew<'a>(
        &'a self,
        key: &'a Digest,
        token: u64,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, token, lease)
    }
    fn get<'a>(&'a self, key: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.inner.get(key)
    }
    fn purge_expired(&self, limit: usize) -> BoxFuture<'_, Result<u64, Error>> {
        self.inner.purge_expired(limit)
    }
    fn force_release<'a>(
        &'a self,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        self.inner.force_release(key)
    }
    fn max_value_len(&self) -> Option<usize> {
        self.max_value_len
    }
    fn park<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.park(key, token)
    }
    fn abandon<'a>(&'a self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.abandon(key, token)
    }
    fn resolve<'a>(
        &'a self,
        key: &'a Digest,
        resolution: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        self.inner.resolve(key, resolution)
    }
}

/// The digest of `key` in namespace `name`, as a call without scope computes it.
fn digest(name: &str, key: &str) -> Digest {
    let encoded = idem::key::canonical(key).unwrap();
    idem::key::key_digest(name, None, &encoded)
}

/// Runs `name`/`key` with a body that counts its runs and returns `value`.
async fn call(
    idem: &Idem,
    name: &str,
    key: &str,
    runs: &AtomicUsize,
    value: &str,
) -> Result<Outcome<String>, Error> {
    idem.call(name.to_owned())
        .key(key)
        .run(async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(value.to_owned())
        })
        .await
}

fn codec_kind<T: std::fmt::Debug>(r: Result<T, Error>) -> CodecErrorKind {
    match r {
        Err(Error::Codec(e)) => e.kind,
        other => panic!("expected a codec error, got {other:?}"),
    }
}

// ---- the size limit ------------------------------------------------------------------------

/// A result over the handle's limit fails with `TooLarge`, nothing is stored, and the key is
/// free: the next call runs the body again (and succeeds when it fits).
#[tokio::test]
async fn over_the_limit_is_refused_and_the_key_released() {
    let (store, _) = Counted::new(None);
    let idem = Idem::from_store(store).with_max_value_len(100);
    let runs = AtomicUsize::new(0);
    let big = "x".repeat(200);
    assert_eq!(
        codec_kind(call(&idem, "size", "k", &runs, &big).await),
        CodecErrorKind::TooLarge
    );
    assert_eq!(idem.store().get(&digest("size", "k")).await.unwrap(), None);
    let out = call(&idem, "size", "k", &runs, "fits").await.unwrap();
    assert_eq!(out, Outcome::Fresh("fits".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A store's own limit applies, and a handle's larger limit does not lift it.
#[tokio::test]
async fn a_store_declares_its_own_limit() {
    let (store, _) = Counted::new(Some(50));
    let idem = Idem::from_store(store).with_max_value_len(1 << 20);
    let runs = AtomicUsize::new(0);
    let over = "x".repeat(60);
    assert_eq!(
        codec_kind(call(&idem, "store-limit", "k", &runs, &over).await),
        CodecErrorKind::TooLarge
    );
    assert!(call(&idem, "store-limit", "k", &runs, "small")
        .await
        .is_ok());
}

// ---- compression ---------------------------------------------------------------------------

/// A large result is stored compressed (and so fits a limit it would not fit raw); a handle
/// without compression replays it, and one with compression replays plain records.
#[cfg(feature = "compression")]
#[tokio::test]
async fn compressed_and_plain_records_both_read() {
    let (store, _) = Counted::new(None);
    let plain = Idem::from_store(store);
    let packed = plain.clone().with_compression(256).with_max_value_len(2000);
    let runs = AtomicUsize::new(0);
    let receipt = "card ending 4242, address 1 Main St; ".repeat(200);
    assert!(call(&packed, "zstd", "big", &runs, &receipt).await.is_ok());
    let stored = plain
        .store()
        .get(&digest("zstd", "big"))
        .await
        .unwrap()
        .unwrap();
    let bytes = stored.value.as_deref().unwrap();
    assert!(bytes.len() < 2000, "{} bytes", bytes.len());
    assert_eq!(bytes[..2], [2, 1], "format 2, zstd");
    assert_eq!(
        call(&plain, "zstd", "big", &runs, "other").await.unwrap(),
        Outcome::Replayed(receipt.clone())
    );
    assert!(call(&plain, "zstd", "old", &runs, "short").await.is_ok());
    assert_eq!(
        call(&packed, "zstd", "old", &runs, "other").await.unwrap(),
        Outcome::Replayed("short".to_owned())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(idem::describe_value(bytes).starts_with("Ok(\"card ending"));
}

// ---- encryption ----------------------------------------------------------------------------

#[cfg(feature = "encryption")]
mod encryption {
    use super::*;
    use idem::Keyring;

    fn ring(keys: &[(&str, u8)]) -> Keyring {
        let mut ring: Option<Keyring> = None;
        for (id, byte) in keys {
            ring = Some(match ring {
                None => Keyring::new(id, [*byte; 32]).unwrap(),
                Some(r) => r.with_key(id, [*byte; 32]).unwrap(),
            });
        }
        ring.unwrap()
    }

    async fn sqlite() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("keys.db").display());
        (dir, url)
    }

    /// The value at rest holds no plaintext; the handle replays it; `describe_value` without
    /// the ring says "encrypted", through the handle it shows the value.
    #[tokio::test]
    async fn values_are_encrypted_at_rest() {
        let (_dir, url) = sqlite().await;
        let idem = Idem::sqlite(&url)
            .await
            .unwrap()
            .with_encryption(ring(&[("k1", 1)]));
        let runs = AtomicUsize::new(0);
        call(&idem, "enc", "k", &runs, "card 4242").await.unwrap();
        let r = idem
            .store()
            .get(&digest("enc", "k"))
            .await
            .unwrap()
            .unwrap();
        let bytes = r.value.as_deref().unwrap();
        assert!(!bytes.windows(4).any(|w| w == b"4242"), "plaintext at rest");
        assert_eq!(idem::describe_value(bytes), "encrypted (key id `k1`)");
        assert_eq!(idem.describe_value(&r), "Ok(\"card 4242\")");
        assert_eq!(
            call(&idem, "enc", "k", &runs, "other").await.unwrap(),
            Outcome::Replayed("card 4242".to_owned())
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// A record copied under another key (same store, same ring) does not decrypt: a typed
    /// error, and the body does not run.
    #[tokio::test]
    async fn a_value_moved_to_another_key_does_not_decrypt() {
        let idem = Idem::memory().with_encryption(ring(&[("k1", 1)]));
        let runs = AtomicUsize::new(0);
        call(&idem, "moved", "a", &runs, "for a").await.unwrap();
        let store = idem.store();
        let a = store.get(&digest("moved", "a")).await.unwrap().unwrap();
        // Copy a's value to b, as someone with write access to the store could.
        for (name, key) in [("moved", "b"), ("other-namespace", "a")] {
            let b = digest(name, key);
            let ClaimOutcome::Claimed { token, .. } = store
                .claim(Claim {
                    name,
                    key: &b,
                    fingerprint: &idem::key::fingerprint_digest(
                        &idem::key::canonical(key).unwrap(),
                    ),
                    lease: Duration::from_secs(30),
                    ttl: Duration::ZERO,
                })
                .await
                .unwrap()
            else {
                panic!("b is free")
            };
            let done = Complete {
                key: &b,
                token,
                value: a.value.as_deref().unwrap(),
                ttl: Duration::from_secs(60),
                tombstone: std::time::Duration::ZERO,
            };
            assert!(store.complete(done).await.unwrap());
            assert_eq!(
                codec_kind(call(&idem, name, key, &runs, "fresh").await),
                CodecErrorKind::Decrypt,
                "{name}/{key}"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "no body ran on a bad value");
    }

    /// Rotation: a ring [k1] writes; a ring [k1, k2] reads it and writes with k2; a ring [k2]
    /// reads k2's values and refuses k1's with `UnknownKey`; a key named k1 that is not k1
    /// gives `Decrypt`; a handle without a ring gives `UnknownKey`. No body runs on any.
    #[tokio::test]
    async fn rotation_with_two_keys() {
        let (_dir, url) = sqlite().await;
        let open = |keys: &'static [(&'static str, u8)]| {
            let url = url.clone();
            async move {
                let idem = Idem::sqlite(&url).await.unwrap();
                if keys.is_empty() {
                    idem
                } else {
                    idem.with_encryption(ring(keys))
                }
            }
        };
        let runs = AtomicUsize::new(0);
        let old = open(&[("k1", 1)]).await;
        call(&old, "rot", "before", &runs, "v1").await.unwrap();
        let both = open(&[("k1", 1), ("k2", 2)]).await;
        assert_eq!(
            call(&both, "rot", "before", &runs, "x").await.unwrap(),
            Outcome::Replayed("v1".to_owned())
        );
        call(&both, "rot", "after", &runs, "v2").await.unwrap();
        let r = both
            .store()
            .get(&digest("rot", "after"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            idem::describe_value(r.value.as_deref().unwrap()),
            "encrypted (key id `k2`)"
        );
        let new = open(&[("k2", 2)]).await;
        assert_eq!(
            call(&new, "rot", "after", &runs, "x").await.unwrap(),
            Outcome::Replayed("v2".to_owned())
        );
        assert_eq!(
            codec_kind(call(&new, "rot", "before", &runs, "x").await),
            CodecErrorKind::UnknownKey
        );
        let impostor = open(&[("k1", 9)]).await;
        assert_eq!(
            codec_kind(call(&impostor, "rot", "before", &runs, "x").await),
            CodecErrorKind::Decrypt
        );
        let none = open(&[]).await;
        assert_eq!(
            codec_kind(call(&none, "rot", "before", &runs, "x").await),
            CodecErrorKind::UnknownKey
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    /// Records written before encryption was turned on still replay.
    #[tokio::test]
    async fn plain_records_from_before_still_read() {
        let (_dir, url) = sqlite().await;
        let runs = AtomicUsize::new(0);
        let plain = Idem::sqlite(&url).await.unwrap();
        call(&plain, "upgrade", "k", &runs, "old").await.unwrap();
        let sealed = Idem::sqlite(&url)
            .await
            .unwrap()
            .with_encryption(ring(&[("k1", 1)]));
        assert_eq!(
            call(&sealed, "upgrade", "k", &runs, "x").await.unwrap(),
            Outcome::Replayed("old".to_owned())
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

// ---- the local cache -----------------------------------------------------------------------

#[cfg(feature = "cache")]
mod cache {
    use super::*;
    use idem::CacheOptions;

    /// Replays that hit the cache do not reach the store: one claim for the first call, none for
    /// the replays after it (a handle without the cache claims every time).
    #[tokio::test]
    async fn cached_replays_cost_no_round_trip() {
        let (store, claims) = Counted::new(None);
        let idem = Idem::from_store(store).with_cache(CacheOptions::new());
        let runs = AtomicUsize::new(0);
        call(&idem, "cache", "k", &runs, "v").await.unwrap();
        for _ in 0..10 {
            assert_eq!(
                call(&idem, "cache", "k", &runs, "x").await.unwrap(),
                Outcome::Replayed("v".to_owned())
            );
        }
        assert_eq!(claims.load(Ordering::SeqCst), 1);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // A handle that finds the result in the store caches it too: one claim, then none.
        let (store, claims) = Counted::new(None);
        let writer = Idem::from_store(store);
        call(&writer, "cache", "k", &runs, "w").await.unwrap();
        let reader = writer.clone().with_cache(CacheOptions::new());
        for _ in 0..5 {
            assert_eq!(
                call(&reader, "cache", "k", &runs, "x").await.unwrap(),
                Outcome::Replayed("w".to_owned())
            );
        }
        assert_eq!(
            claims.load(Ordering::SeqCst),
            2,
            "the write and the first read"
        );
    }

    /// Another fingerprint is not served from the cache: the store refuses it as a mismatch.
    #[tokio::test]
    async fn a_cached_key_with_another_fingerprint_goes_to_the_store() {
        let (store, claims) = Counted::new(None);
        let idem = Idem::from_store(store).with_cache(CacheOptions::new());
        let ok = idem
            .call("fp")
            .key("k")
            .fingerprint(&1)
            .run(async { Ok::<_, Error>(1u8) })
            .await;
        assert!(ok.is_ok());
        let other = idem
            .call("fp")
            .key("k")
            .fingerprint(&2)
            .run(async { Ok::<_, Error>(2u8) })
            .await;
        assert!(matches!(other, Err(Error::Mismatch { .. })), "{other:?}");
        assert_eq!(claims.load(Ordering::SeqCst), 2);
    }

    /// `force_release` on the handle evicts at once; a release that bypasses the handle (another
    /// instance, the CLI) is seen once the maximum age has passed.
    #[tokio::test]
    async fn force_release_evicts_and_max_age_bounds_staleness() {
        let (store, _) = Counted::new(None);
        let idem = Idem::from_store(store).with_cache(
            CacheOptions::new()
                .max_entries(100)
                .max_age(Duration::from_millis(300)),
        );
        let runs = AtomicUsize::new(0);
        call(&idem, "evict", "k", &runs, "v1").await.unwrap();
        let released = idem.force_release(&digest("evict", "k")).await.unwrap();
        assert!(released.is_some());
        assert_eq!(
            call(&idem, "evict", "k", &runs, "v2").await.unwrap(),
            Outcome::Fresh("v2".to_owned())
        );

        // Released behind the handle's back: the cached result replays until its maximum age.
        idem.store()
            .force_release(&digest("evict", "k"))
            .await
            .unwrap();
        assert_eq!(
            call(&idem, "evict", "k", &runs, "v3").await.unwrap(),
            Outcome::Replayed("v2".to_owned())
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            call(&idem, "evict", "k", &runs, "v3").await.unwrap(),
            Outcome::Fresh("v3".to_owned())
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// An entry never outlives its record's TTL, even under a longer maximum age.
    #[tokio::test]
    async fn a_cached_result_expires_with_its_record() {
        let idem =
            Idem::memory().with_cache(CacheOptions::new().max_age(Duration::from_secs(3600)));
        let runs = AtomicUsize::new(0);
        let once = || {
            idem.call("ttl")
                .key("k")
                .ttl(Duration::from_millis(300))
                .run(async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst)) })
        };
        assert_eq!(once().await.unwrap(), Outcome::Fresh(0));
        assert_eq!(once().await.unwrap(), Outcome::Replayed(0));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(once().await.unwrap(), Outcome::Fresh(1));
    }
}

// ---- keyed digests -------------------------------------------------------------------------

/// With a digest secret, calls run and replay as ever, the store holds HMAC digests (not the
/// SHA-256 a reader could recompute from a guessed key), and a handle with another secret
/// does not find the key.
#[cfg(feature = "keyed-digests")]
#[tokio::test]
async fn keyed_digests_hide_guessable_keys() {
    use idem::key::DigestSecret;
    let store = Idem::memory();
    let keyed = store
        .clone()
        .with_digest_secret(DigestSecret::new(&[0x5a; 32]).unwrap());
    let runs = AtomicUsize::new(0);
    call(&keyed, "orders", "1001", &runs, "v").await.unwrap();
    assert_eq!(
        call(&keyed, "orders", "1001", &runs, "x").await.unwrap(),
        Outcome::Replayed("v".to_owned())
    );
    assert_eq!(
        store.store().get(&digest("orders", "1001")).await.unwrap(),
        None,
        "the unkeyed digest of a guessed key finds nothing"
    );
    let hmac = DigestSecret::new(&[0x5a; 32]).unwrap().key_digest(
        "orders",
        None,
        &idem::key::canonical("1001").unwrap(),
    );
    assert!(store.store().get(&hmac).await.unwrap().is_some());
    let other = store.with_digest_secret(DigestSecret::new(&[0x5b; 32]).unwrap());
    assert_eq!(
        call(&other, "orders", "1001", &runs, "w").await.unwrap(),
        Outcome::Fresh("w".to_owned())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
