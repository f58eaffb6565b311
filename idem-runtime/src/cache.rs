//! A handle's local cache of completed results ([`crate::Idem::with_cache`]): a replay that
//! finds its key here costs no round trip to the store.
//!
//! An entry is the decoded (decrypted, decompressed) value of a completed record with the
//! fingerprint it was stored under. It is used only when the call's fingerprint matches (a
//! mismatch goes to the store, which decides), and never after the record's TTL nor after the
//! cache's maximum age. Entries are added when this handle completes a call or replays one from
//! the store, and removed by [`crate::Idem::force_release`] on this handle. Another instance's
//! forced release is not seen here: the maximum age bounds how long a released result may still
//! replay from this cache.
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
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

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
            }
        }

        /// The cached value of `key` if it was stored under `fingerprint` and has not expired.
        pub(crate) fn get(&self, key: &Digest, fingerprint: &Digest) -> Option<Arc<[u8]>> {
            let entry = self.entries.get(key)?;
            if entry.expires <= Instant::now() {
                self.entries.remove_if(key, |e| e.expires == entry.expires);
                return None;
            }
            (entry.fingerprint == *fingerprint).then_some(entry.value)
        }

        /// Caches the decoded value of a completed record that is live until `since + remaining`
        /// (`since`: an instant no later than the store's clock read the record).
        pub(crate) fn put(
            &self,
            key: Digest,
            fingerprint: Digest,
            value: &[u8],
            since: Instant,
            remaining: Duration,
        ) {
            let expires = since + remaining.min(self.max_age);
            if expires <= Instant::now() {
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
        }

        /// Forgets `key` (an operator released it).
        pub(crate) fn evict(&self, key: &Digest) {
            self.entries.remove(key);
        }

        #[cfg(test)]
        fn len(&self) -> usize {
            self.entries.len()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn d(n: u8) -> Digest {
            let mut b = [n; 32];
            b[0] = n.wrapping_mul(37);
            Digest(b)
        }

        #[test]
        fn fingerprint_age_and_eviction() {
            let cache = ResultCache::new(CacheOptions::new().max_age(Duration::from_secs(60)));
            let now = Instant::now();
            cache.put(d(1), d(9), b"v", now, Duration::from_secs(3600));
            assert_eq!(&*cache.get(&d(1), &d(9)).unwrap(), b"v");
            assert!(cache.get(&d(1), &d(8)).is_none(), "another fingerprint");
            assert!(cache.get(&d(2), &d(9)).is_none());
            cache.evict(&d(1));
            assert!(cache.get(&d(1), &d(9)).is_none());
            // Already past its TTL: not cached; past it later: gone at the next get.
            let past = now - Duration::from_secs(10);
            cache.put(d(3), d(9), b"v", past, Duration::from_secs(5));
            assert!(cache.get(&d(3), &d(9)).is_none());
            cache.put(
                d(4),
                d(9),
                b"v",
                past,
                Duration::from_secs(10) + Duration::from_millis(30),
            );
            assert!(cache.get(&d(4), &d(9)).is_some());
            std::thread::sleep(Duration::from_millis(40));
            assert!(cache.get(&d(4), &d(9)).is_none());
            // The maximum age caps a long TTL.
            let young = ResultCache::new(CacheOptions::new().max_age(Duration::from_millis(20)));
            young.put(d(5), d(9), b"v", Instant::now(), Duration::from_secs(3600));
            std::thread::sleep(Duration::from_millis(30));
            assert!(young.get(&d(5), &d(9)).is_none());
        }

        #[test]
        fn bounded_by_entries_and_by_bytes() {
            let far = Duration::from_secs(3600);
            let by_count =
                ResultCache::new(CacheOptions::new().max_entries(100).max_bytes(1 << 20));
            for i in 0..=255u8 {
                by_count.put(d(i), d(0), b"small", Instant::now(), far);
            }
            assert!(by_count.len() <= 100, "{}", by_count.len());
            assert!(by_count.len() >= 50, "{}", by_count.len());
            let by_bytes =
                ResultCache::new(CacheOptions::new().max_entries(10_000).max_bytes(10_000));
            let big = vec![b'x'; 1000];
            for i in 0..=255u8 {
                by_bytes.put(d(i), d(0), &big, Instant::now(), far);
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
        pub(crate) fn put(&self, _: Digest, _: Digest, _: &[u8], _: Instant, _: Duration) {
            match self.0 {}
        }
        pub(crate) fn evict(&self, _: &Digest) {
            match self.0 {}
        }
    }
}
