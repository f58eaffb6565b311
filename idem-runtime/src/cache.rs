//! A handle's local cache of completed results ([`crate::Idem::with_cache`]): a replay that
//! finds its key here costs no round trip to the store.
//!
//! An entry is the decoded (decrypted, decompressed) value of a completed record with the
//! fingerprint it was stored under. It is used only when the call's fingerprint matches (a
//! mismatch goes to the store, which decides), and never after the record's TTL nor after the
//! cache's maximum age. Entries are added when this handle completes a call or replays one from
//! the store, and removed by [`crate::Idem::force_release`] on this handle.
//!
//! Another instance's (or the CLI's) forced release reaches this cache where the store publishes
//! releases ([`crate::Store::releases`]: PostgreSQL, a single Redis server): the first call
//! starts a task that follows the store's feed and evicts each released key. While that feed is
//! not listening (not yet, or its connection is lost) the cache serves nothing, and it is emptied
//! whenever the feed listens again, since a release may have been missed in between. On the
//! other stores (memory, SQLite, MySQL, Redis Cluster, DynamoDB) the maximum age bounds how long
//! a released result may still replay from this cache.
//!
//! An entry is added only if no key was evicted (and the cache not emptied) since the call read
//! the record it caches (`epoch`): a release announced while the call was between its read and
//! its put cannot leave the released result behind.
//!
//! quick_cache holds the entries: sharded, bounded by weight, with few dependencies. Its one
//! bound is weight, so both of ours become one: an entry weighs at least
//! `max_bytes / max_entries`, so that no more than `max_entries` fit in `max_bytes`.
//!
//! Without the feature `cache`, [`ResultCache`] is a type with no values: the engine's calls to
//! it compile away and a handle never has one.

#[cfg(feature = "cache")]
pub(crate) use imp::ResultCache;
#[cfg(not(feature = "cache"))]
pub(crate) use none::ResultCache;
#[cfg(feature = "cache")]
use std::time::Duration;

/// The bounds of a handle's local cache of completed results (feature `cache`).
///
/// ```
/// # extern crate idem_runtime as idem;
/// use std::time::Duration;
/// let idem = idem::Idem::memory().with_cache(
///     idem::CacheOptions::new()
///         .max_entries(50_000)
///         .max_bytes(32 << 20)
///         .max_age(Duration::from_secs(30)),
/// );
/// ```
#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    max_entries: usize,
    max_bytes: usize,
    max_age: Duration,
}

#[cfg(feature = "cache")]
impl Default for CacheOptions {
    /// 10 000 entries, 64 MiB, one minute.
    fn default() -> Self {
        CacheOptions {
            max_entries: 10_000,
            max_bytes: 64 << 20,
            max_age: Duration::from_secs(60),
        }
    }
}

#[cfg(feature = "cache")]
impl CacheOptions {
    /// The defaults: 10 000 entries, 64 MiB of values, a maximum age of one minute.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most this many results (at least 1).
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n.max(1);
        self
    }

    /// At most this many bytes of results (their decoded JSON).
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n.max(1);
        self
    }

    /// How long an entry may be replayed at most, however long its record lives: the bound on
    /// how stale a result can be after another instance force-released its key.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }
}

#[cfg(feature = "cache")]
mod imp {
    use super::CacheOptions;
    use crate::key::Digest;
    use crate::store::{ReleaseFeed, ReleaseNote, Store};
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
    use std::sync::{Arc, Mutex, Weak};
    use std::time::{Duration, Instant};

    /// `follow`: not asked the store yet (or the follower stopped with its runtime).
    const UNSTARTED: u8 = 0;
    /// The store publishes no releases: entries are served, bounded by their maximum age.
    const NO_FEED: u8 = 1;
    /// Following the store's releases, and its feed listens: entries are served.
    const LIVE: u8 = 2;
    /// Following, but the feed does not listen (yet): nothing is served.
    const DOWN: u8 = 3;

    #[derive(Clone)]
    struct Entry {
        fingerprint: Digest,
        value: Arc<[u8]>,
        expires: Instant,
    }

    /// Weighs an entry by its bytes, and at least the per-entry share of the byte bound.
    #[derive(Clone)]
    struct Weigh {
        floor: u64,
    }

    impl quick_cache::Weighter<Digest, Entry> for Weigh {
        fn weight(&self, _: &Digest, entry: &Entry) -> u64 {
            (entry.value.len() as u64).max(self.floor)
        }
    }

    /// Keys are SHA-256 digests, already uniform: their first eight bytes are the hash.
    #[derive(Clone, Default)]
    struct DigestHash;

    impl BuildHasher for DigestHash {
        type Hasher = FirstWord;
        fn build_hasher(&self) -> FirstWord {
            FirstWord(0)
        }
    }

    #[derive(Default)]
    struct FirstWord(u64);

    impl Hasher for FirstWord {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            // `Digest` hashes as its array: a length prefix, then the 32 bytes.
            if let Some(word) = bytes.get(..8) {
                self.0 ^= u64::from_le_bytes(word.try_into().unwrap_or_default());
            }
        }
        fn write_usize(&mut self, _: usize) {}
    }

    /// The cache itself, shared by a handle's clones.
    pub(crate) struct ResultCache {
        entries: quick_cache::sync::Cache<Digest, Entry, Weigh, DigestHash>,
        max_age: Duration,
        /// Bumped by every eviction and emptying; see [`ResultCache::epoch`].
        epoch: AtomicU64,
        /// Whether entries may be served: one of `UNSTARTED`, `NO_FEED`, `LIVE`, `DOWN`.
        follow: AtomicU8,
        /// The task following the store's releases, aborted with the cache.
        follower: Mutex<Option<tokio::task::AbortHandle>>,
    }

    impl Drop for ResultCache {
        fn drop(&mut self) {
            if let Some(task) = self
                .follower
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take()
            {
                task.abort();
            }
        }
    }

    impl std::fmt::Debug for ResultCache {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ResultCache")
                .field("entries", &self.entries.len())
                .field("bytes", &self.entries.weight())
                .field("max_age", &self.max_age)
                .finish()
        }
    }

    impl ResultCache {
        pub(crate) fn new(options: CacheOptions) -> ResultCache {
            let floor = (options.max_bytes / options.max_entries).max(1) as u64;
            ResultCache {
                entries: quick_cache::sync::Cache::with(
                    options.max_entries,
                    options.max_bytes as u64,
                    Weigh { floor },
                    DigestHash,
                    Default::default(),
                ),
                max_age: options.max_age,
                epoch: AtomicU64::new(0),
                follow: AtomicU8::new(UNSTARTED),
                follower: Mutex::new(None),
            }
        }

        /// Starts following `store`'s releases, once, on the current Tokio runtime (and again
        /// if the follower stopped with its runtime). Cheap when already done.
        pub(crate) fn follow(self: &Arc<Self>, store: &dyn Store) {
            if self.follow.load(Ordering::Acquire) != UNSTARTED {
                return;
            }
            let mut follower = self.follower.lock().unwrap_or_else(|p| p.into_inner());
            if self.follow.load(Ordering::Acquire) != UNSTARTED {
                return;
            }
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return;
            };
            match store.releases() {
                None => self.follow.store(NO_FEED, Ordering::Release),
                Some(feed) => {
                    self.follow.store(DOWN, Ordering::Release);
                    let task = rt.spawn(follow(Arc::downgrade(self), feed));
                    if let Some(old) = follower.replace(task.abort_handle()) {
                        old.abort();
                    }
                }
            }
        }

        /// `Some(true)` while the cache follows its store's releases and the feed listens,
        /// `Some(false)` while it follows but the feed does not listen (or not started yet),
        /// `None` when the store publishes none.
        pub(crate) fn following(&self) -> Option<bool> {
            match self.follow.load(Ordering::Acquire) {
                NO_FEED => None,
                state => Some(state == LIVE),
            }
        }

        /// The count of evictions so far: read it before the store read whose result is to be
        /// cached, and give it to [`ResultCache::put`].
        pub(crate) fn epoch(&self) -> u64 {
            self.epoch.load(Ordering::SeqCst)
        }

        /// Forgets every entry (releases may have been missed).
        fn clear(&self) {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.entries.clear();
        }

        /// The cached value of `key` if it was stored under `fingerprint` and has not expired.
        pub(crate) fn get(&self, key: &Digest, fingerprint: &Digest) -> Option<Arc<[u8]>> {
            if !matches!(self.follow.load(Ordering::Acquire), NO_FEED | LIVE) {
                return None;
            }
            let entry = self.entries.get(key)?;
            if entry.expires <= Instant::now() {
                self.entries.remove_if(key, |e| e.expires == entry.expires);
                return None;
            }
            (entry.fingerprint == *fingerprint).then_some(entry.value)
        }

        /// Caches the decoded value of a completed record that is live until `since + remaining`
        /// (`since`: an instant no later than the store's clock read the record), unless an
        /// eviction happened since `epoch` was read (before that read).
        pub(crate) fn put(
            &self,
            key: Digest,
            fingerprint: Digest,
            value: &[u8],
            since: Instant,
            remaining: Duration,
            epoch: u64,
        ) {
            let expires = since + remaining.min(self.max_age);
            if expires <= Instant::now() || self.epoch() != epoch {
                return;
            }
            self.entries.insert(
                key,
                Entry {
                    fingerprint,
                    value: value.into(),
                    expires,
                },
            );
            // An eviction between the check and the insert may have missed this entry.
            if self.epoch() != epoch {
                self.entries.remove(&key);
            }
        }

        /// Forgets `key` (an operator released it).
        pub(crate) fn evict(&self, key: &Digest) {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.entries.remove(key);
        }

        #[cfg(test)]
        fn len(&self) -> usize {
            self.entries.len()
        }
    }

    /// Follows a store's releases for `cache` until the cache is gone.
    async fn follow(cache: Weak<ResultCache>, mut feed: ReleaseFeed) {
        /// When the task ends (its runtime shut down, say), the next call starts another.
        struct Stopped(Weak<ResultCache>);
        impl Drop for Stopped {
            fn drop(&mut self) {
                if let Some(cache) = self.0.upgrade() {
                    cache.follow.store(UNSTARTED, Ordering::Release);
                }
            }
        }
        let _stopped = Stopped(cache.clone());
        while let Some(note) = feed.next().await {
            let Some(cache) = cache.upgrade() else { return };
            match note {
                ReleaseNote::Released(key) => {
                    tracing::debug!(key = %key, "idem: cache evicts a key released elsewhere");
                    cache.evict(&key);
                }
                ReleaseNote::Listening => {
                    cache.clear();
                    cache.follow.store(LIVE, Ordering::Release);
                }
                ReleaseNote::Lost => {
                    cache.follow.store(DOWN, Ordering::Release);
                    cache.clear();
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A cache on a store that publishes no releases: entries served at once.
        fn no_feed(options: CacheOptions) -> ResultCache {
            let cache = ResultCache::new(options);
            cache.follow.store(NO_FEED, Ordering::Release);
            cache
        }

        fn d(n: u8) -> Digest {
            let mut b = [n; 32];
            b[0] = n.wrapping_mul(37);
            Digest(b)
        }

        #[test]
        fn fingerprint_age_and_eviction() {
            let cache = no_feed(CacheOptions::new().max_age(Duration::from_secs(60)));
            let now = Instant::now();
            cache.put(
                d(1),
                d(9),
                b"v",
                now,
                Duration::from_secs(3600),
                cache.epoch(),
            );
            assert_eq!(&*cache.get(&d(1), &d(9)).unwrap(), b"v");
            assert!(cache.get(&d(1), &d(8)).is_none(), "another fingerprint");
            assert!(cache.get(&d(2), &d(9)).is_none());
            cache.evict(&d(1));
            assert!(cache.get(&d(1), &d(9)).is_none());
            // Already past its TTL: not cached; past it later: gone at the next get.
            let past = now - Duration::from_secs(10);
            cache.put(
                d(3),
                d(9),
                b"v",
                past,
                Duration::from_secs(5),
                cache.epoch(),
            );
            assert!(cache.get(&d(3), &d(9)).is_none());
            cache.put(
                d(4),
                d(9),
                b"v",
                past,
                Duration::from_secs(10) + Duration::from_millis(30),
                cache.epoch(),
            );
            assert!(cache.get(&d(4), &d(9)).is_some());
            std::thread::sleep(Duration::from_millis(40));
            assert!(cache.get(&d(4), &d(9)).is_none());
            // The maximum age caps a long TTL.
            let young = no_feed(CacheOptions::new().max_age(Duration::from_millis(20)));
            young.put(
                d(5),
                d(9),
                b"v",
                Instant::now(),
                Duration::from_secs(3600),
                0,
            );
            std::thread::sleep(Duration::from_millis(30));
            assert!(young.get(&d(5), &d(9)).is_none());
        }

        #[test]
        fn a_put_after_an_eviction_is_refused_and_an_unfollowed_cache_serves_nothing() {
            let cache = no_feed(CacheOptions::new());
            let far = Duration::from_secs(3600);
            let before = cache.epoch();
            cache.evict(&d(7)); // a release announced while a call read its record
            cache.put(d(1), d(9), b"v", Instant::now(), far, before);
            assert!(
                cache.get(&d(1), &d(9)).is_none(),
                "read before the eviction"
            );
            cache.put(d(1), d(9), b"v", Instant::now(), far, cache.epoch());
            assert!(cache.get(&d(1), &d(9)).is_some());
            // Following a feed that does not listen: nothing is served.
            cache.follow.store(DOWN, Ordering::Release);
            assert!(cache.get(&d(1), &d(9)).is_none());
            cache.follow.store(LIVE, Ordering::Release);
            assert!(cache.get(&d(1), &d(9)).is_some());
            cache.clear();
            assert!(cache.get(&d(1), &d(9)).is_none());
        }

        #[test]
        fn bounded_by_entries_and_by_bytes() {
            let far = Duration::from_secs(3600);
            let by_count = no_feed(CacheOptions::new().max_entries(100).max_bytes(1 << 20));
            for i in 0..=255u8 {
                by_count.put(d(i), d(0), b"small", Instant::now(), far, 0);
            }
            assert!(by_count.len() <= 100, "{}", by_count.len());
            assert!(by_count.len() >= 50, "{}", by_count.len());
            let by_bytes = no_feed(CacheOptions::new().max_entries(10_000).max_bytes(10_000));
            let big = vec![b'x'; 1000];
            for i in 0..=255u8 {
                by_bytes.put(d(i), d(0), &big, Instant::now(), far, 0);
            }
            assert!(by_bytes.len() <= 10, "{}", by_bytes.len());
            assert!(by_bytes.entries.weight() <= 10_000);
        }
    }
}

#[cfg(not(feature = "cache"))]
mod none {
    use crate::key::Digest;
    use std::convert::Infallible;
    use std::time::{Duration, Instant};

    /// No cache: a type with no values.
    #[derive(Debug)]
    pub(crate) struct ResultCache(Infallible);

    impl ResultCache {
        pub(crate) fn get(&self, _: &Digest, _: &Digest) -> Option<Vec<u8>> {
            match self.0 {}
        }
        pub(crate) fn put(&self, _: Digest, _: Digest, _: &[u8], _: Instant, _: Duration, _: u64) {
            match self.0 {}
        }
        pub(crate) fn epoch(&self) -> u64 {
            match self.0 {}
        }
        pub(crate) fn follow(self: &std::sync::Arc<Self>, _: &dyn crate::store::Store) {
            match self.0 {}
        }
        pub(crate) fn evict(&self, _: &Digest) {
            match self.0 {}
        }
    }
}
