//! `Idem`: a store plus its defaults, cheap to clone, shared by every call.

use crate::cache::ResultCache;
use crate::codec::Codec;
use crate::error::Error;
use crate::key::Digest;
use crate::observe;
use crate::policy::Defaults;
use crate::store::memory::MemoryStore;
use crate::store::{Record, Store};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A handle on an idempotency store. Clone it freely: clones share one store.
///
/// Two handles opened on the same database (the same SQLite file, PostgreSQL database or Redis)
/// see the same keys; that is how processes and machines share one idempotency space.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    store: Arc<dyn Store>,
    defaults: Defaults,
    /// What a result goes through on its way to the store and back.
    codec: Codec,
    /// Completed results kept in this process ([`Idem::with_cache`]).
    cache: Option<Arc<ResultCache>>,
    /// The digests of keys this handle replayed, under its secret.
    digest_memo: crate::key::DigestMemo,
    /// Keys and fingerprints digested with HMAC-SHA256 under this secret.
    #[cfg(feature = "keyed-digests")]
    digest_secret: Option<Arc<crate::key::DigestSecret>>,
}

static INSTALLED: RwLock<Option<Idem>> = RwLock::new(None);

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.inner.store.backend())
            .field("defaults", &self.inner.defaults)
            .field("codec", &self.inner.codec)
            .field("cache", &self.inner.cache)
            .finish()
    }
}

impl Idem {
    /// A process-local store: keys live as long as the process.
    pub fn memory() -> Idem {
        Idem::from_store(MemoryStore::new())
    }

    /// A handle that turns idempotency off, for tests of application code: it keeps nothing,
    /// so every call runs its body, every time, and returns its result as fresh (steps
    /// included). `Idem::disabled().install()` in a test, or `store = …` given one. Never in
    /// production: a retry would run the body again.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = idem::Idem::disabled();
    /// for _ in 0..2 {
    ///     let out = idem.call("charges").key("order-1").run(async { Ok::<_, idem::Error>(1) });
    ///     assert!(!out.await?.is_replayed()); // the body ran both times
    /// }
    /// # Ok(()) }
    /// ```
    pub fn disabled() -> Idem {
        Idem::from_store(crate::store::DisabledStore::default())
    }

    /// The embedded durable store: `"sqlite::memory:"` or `"sqlite://file.db"` (a missing file
    /// is created, and so is the schema).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn sqlite(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::sqlite::SqliteStore::connect(url).await?,
        ))
    }

    /// A PostgreSQL store (the schema is created or upgraded on open).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::postgres::PostgresStore::connect(url).await?,
        ))
    }

    /// A MySQL 8 / MariaDB 10.6+ store (`mysql://user:password@host:port/database`); the schema
    /// is created or upgraded on open.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn mysql(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::mysql::MysqlOptions::from_url(url)?
                .connect()
                .await?,
        ))
    }

    /// An Amazon DynamoDB store (feature `dynamodb`) on `table`, created when missing
    /// (on-demand billing, TTL on the `ttl` attribute). Region, credentials and endpoint come
    /// from the AWS environment (`AWS_REGION`, the credential chain, `AWS_ENDPOINT_URL_DYNAMODB`);
    /// see [`DynamoDbOptions`](crate::store::dynamodb::DynamoDbOptions) to set them, and
    /// [`DynamoDbStore::from_client`](crate::store::dynamodb::DynamoDbStore::from_client) for the
    /// application's own client.
    #[cfg(feature = "dynamodb")]
    #[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
    pub async fn dynamodb(table: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::dynamodb::DynamoDbOptions::new()
                .table(table)
                .connect()
                .await?,
        ))
    }

    /// A Redis store.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::redis::RedisStore::connect(url).await?,
        ))
    }

    /// A handle on a Redis Cluster (feature `redis`), found from any of its `nodes`
    /// (`redis://host:port/`; more than one helps when one is down): each step runs on the
    /// primary that owns its key's slot. An empty list is [`Error::Config`]; a node without
    /// cluster mode, or a cluster that does not serve every slot, is [`Error::Store`] at open.
    /// See [`RedisOptions::cluster`](crate::store::redis::RedisOptions::cluster) for the options.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis_cluster(nodes: &[&str]) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::redis::RedisOptions::cluster(nodes)?
                .connect()
                .await?,
        ))
    }

    /// A handle on any [`Store`], with the default policy (ttl 24 h, lease 30 s, no wait).
    pub fn from_store(store: impl Store) -> Idem {
        Idem::with_defaults(store, Defaults::default())
    }

    /// A handle on any [`Store`] with its own defaults for calls that set none.
    pub fn with_defaults(store: impl Store, defaults: Defaults) -> Idem {
        let store = Arc::new(store);
        let codec = Codec::new(store.max_value_len());
        Idem {
            inner: Arc::new(Inner {
                store,
                defaults,
                codec,
                cache: None,
                digest_memo: Default::default(),
                #[cfg(feature = "keyed-digests")]
                digest_secret: None,
            }),
        }
    }

    /// This handle with one setting changed: a new handle on the same store (handles made
    /// from this one before keep their settings, so configure at start-up).
    fn reconfigured(self, change: impl FnOnce(&mut Inner)) -> Idem {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        change(&mut inner);
        // A new memo: digests remembered under the old configuration (its secret) stay there.
        inner.digest_memo = Default::default();
        Idem {
            inner: Arc::new(inner),
        }
    }

    /// Encrypts the results this handle stores with the newest key of `keyring`
    /// (XChaCha20-Poly1305, bound to the key's digest and namespace) and decrypts stored ones
    /// with whichever key of the ring sealed them; plain records written before still read. A
    /// stored value that does not decrypt is [`Error::Codec`] (kinds
    /// [`CodecErrorKind::UnknownKey`](crate::CodecErrorKind::UnknownKey) and
    /// [`CodecErrorKind::Decrypt`](crate::CodecErrorKind::Decrypt)); the body does not run.
    /// Feature `encryption`.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// let ring = idem::Keyring::new("2026-12", [0x42; 32])?; // from a secret store in practice
    /// let idem = idem::Idem::memory().with_encryption(ring);
    /// # Ok::<_, idem::Error>(())
    /// ```
    #[cfg(feature = "encryption")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
    pub fn with_encryption(self, keyring: crate::codec::Keyring) -> Idem {
        self.reconfigured(|inner| inner.codec.keyring = Some(Arc::new(keyring)))
    }

    /// Compresses with zstd the results whose encoding is longer than `above` bytes (tagged in
    /// the stored value, so records written with and without it all read). Feature
    /// `compression`.
    #[cfg(feature = "compression")]
    #[cfg_attr(docsrs, doc(cfg(feature = "compression")))]
    pub fn with_compression(self, above: usize) -> Idem {
        self.reconfigured(|inner| inner.codec.compress_above = Some(above))
    }

    /// Keeps a tombstone for every key this handle's calls complete, for `tombstone` after
    /// their `ttl` (calls that set none of their own: [`crate::Call::tombstone`],
    /// `#[idempotent(tombstone = …)]`): a late repeat gets [`Error::Expired`] instead of
    /// running the body again. Steps take no default tombstone (only one written on them).
    pub fn with_tombstone(self, tombstone: Duration) -> Idem {
        self.reconfigured(|inner| {
            inner.defaults.tombstone = (!tombstone.is_zero()).then_some(tombstone)
        })
    }

    /// Refuses results larger than `max` bytes as stored (after compression and encryption):
    /// such a call fails with [`Error::Codec`] of kind
    /// [`CodecErrorKind::TooLarge`](crate::CodecErrorKind::TooLarge) and its key is released,
    /// nothing written. The default is [`crate::DEFAULT_MAX_VALUE_LEN`], or the store's own
    /// limit ([`Store::max_value_len`]) when lower; a `max` above the store's limit is
    /// lowered to it.
    pub fn with_max_value_len(self, max: usize) -> Idem {
        self.reconfigured(|inner| {
            inner.codec.max_len = inner
                .store
                .max_value_len()
                .map_or(max, |store_max| store_max.min(max));
        })
    }

    /// Keeps completed results in this process (feature `cache`), bounded by `options`: a
    /// replay whose key and fingerprint are cached costs no round trip to the store. An entry
    /// never outlives its record's TTL nor `options`' maximum age; [`Idem::force_release`] on
    /// this handle evicts.
    ///
    /// A release by another instance (or the CLI) evicts too where the store publishes
    /// releases ([`Store::releases`]: PostgreSQL, unless opened with `notify(false)`, and a
    /// single Redis server): the handle's first call starts following them (one more
    /// connection), and until that feed listens, or while its connection is lost, the cache
    /// serves nothing. On the other stores (memory, SQLite, MySQL, Redis Cluster, DynamoDB) such
    /// a release is seen here only once the entry's maximum age has passed.
    #[cfg(feature = "cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
    pub fn with_cache(self, options: crate::cache::CacheOptions) -> Idem {
        self.reconfigured(|inner| inner.cache = Some(Arc::new(ResultCache::new(options))))
    }

    /// Digests keys and fingerprints with HMAC-SHA256 under `secret` instead of SHA-256
    /// (feature `keyed-digests`), so that someone who reads the store cannot confirm a guessed
    /// key by hashing it. Every instance on a store must use the same secret; a handle with
    /// another secret (or none) does not find the keys, and runs their bodies again. The CLI
    /// finds such records by `--digest` (the hex of `current_key()`).
    #[cfg(feature = "keyed-digests")]
    #[cfg_attr(docsrs, doc(cfg(feature = "keyed-digests")))]
    pub fn with_digest_secret(self, secret: crate::key::DigestSecret) -> Idem {
        self.reconfigured(|inner| inner.digest_secret = Some(Arc::new(secret)))
    }

    /// The secret keys and fingerprints are digested under, if any.
    #[cfg(feature = "keyed-digests")]
    pub(crate) fn digest_secret(&self) -> Option<&crate::key::DigestSecret> {
        self.inner.digest_secret.as_deref()
    }

    /// The memo of the digests of keys this handle replayed.
    pub(crate) fn digest_memo(&self) -> &crate::key::DigestMemo {
        &self.inner.digest_memo
    }

    /// How this handle stores results.
    pub(crate) fn codec(&self) -> &Codec {
        &self.inner.codec
    }

    /// Starts following the store's releases for this handle's cache, if it has one and has
    /// not yet (see [`Idem::with_cache`]). Cheap once done.
    pub(crate) fn follow_releases(&self) {
        if let Some(cache) = &self.inner.cache {
            cache.follow(self.store());
        }
    }

    /// Whether this handle's cache hears of other instances' releases: starts following the
    /// store's releases if it has not yet, and waits up to `within` for its feed to listen
    /// (feature `cache`; call it on a Tokio runtime). `false` when the handle has no cache, its
    /// store publishes no releases (the cache's maximum age then bounds how long a result
    /// released elsewhere may replay), or the feed did not listen in time (meanwhile the cache
    /// serves nothing).
    #[cfg(feature = "cache")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
    pub async fn cache_follows_releases(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            self.follow_releases();
            match self.inner.cache.as_ref().and_then(|c| c.following()) {
                None => return false,
                Some(true) => return true,
                Some(false) if tokio::time::Instant::now() >= deadline => return false,
                Some(false) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// This handle's local cache, if it has one.
    pub(crate) fn cache(&self) -> Option<&ResultCache> {
        self.inner.cache.as_deref()
    }

    /// A record's stored value as text for an operator, decrypted with this handle's keyring
    /// (see [`crate::describe_value`]); a value that does not open says why.
    pub fn describe_value(&self, record: &Record) -> String {
        let Some(stored) = record.value.as_deref() else {
            return "no value".into();
        };
        match self
            .codec()
            .open("value", &record.name, &record.key, stored)
        {
            Ok(plain) => crate::codec::describe_plain(&plain),
            Err(e) => e.to_string(),
        }
    }

    /// An operator's release ([`Store::force_release`]) that also evicts the key from this
    /// handle's cache. Returns the record as it was, or `None` when the key had no live record.
    pub async fn force_release(&self, key: &Digest) -> Result<Option<Record>, Error> {
        let released = self.store().force_release(key).await;
        if let Some(cache) = self.cache() {
            cache.evict(key);
        }
        released
    }

    /// Makes this handle the process-wide default, used by `#[idempotent]` functions without
    /// `store = …`.
    ///
    /// Installing again **replaces** the installed handle (and logs a `WARN` event saying so):
    /// calls that start afterwards use the new store, so keys claimed in the old one are not
    /// seen by them. Use [`Idem::try_install`] where a second installation is a mistake.
    pub fn install(self) {
        let replaced = INSTALLED
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .replace(self);
        if let Some(old) = replaced {
            tracing::warn!(
                idem.store = %old.store().backend(),
                "idem: Idem::install replaced the installed handle; calls without `store = …` \
                 now use the new one"
            );
        }
    }

    /// Makes this handle the process-wide default unless one is installed already, in which
    /// case it returns [`Error::Config`] and leaves the installed handle in place.
    ///
    /// The check and the installation are one step under one lock: of several threads racing
    /// to install, exactly one succeeds.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// use idem::Idem;
    /// Idem::memory().try_install().expect("nothing installed yet");
    /// let again = Idem::memory().try_install().unwrap_err();
    /// assert!(again.is_config());
    /// ```
    pub fn try_install(self) -> Result<(), Error> {
        let mut slot = INSTALLED.write().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(installed) => Err(Error::config(format!(
                "an idem handle ({} store) is already installed: `Idem::try_install` does not \
                 replace it (`Idem::install` does)",
                installed.store().backend()
            ))),
            None => {
                *slot = Some(self);
                Ok(())
            }
        }
    }

    /// The installed default handle, if any.
    pub fn installed() -> Option<Idem> {
        INSTALLED.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The store behind this handle.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The defaults of this handle.
    pub fn defaults(&self) -> &Defaults {
        &self.inner.defaults
    }

    /// Deletes every record that is no longer live, in batches of `batch` (each batch one
    /// bounded operation, so concurrent calls are never blocked for long). Returns how many.
    /// A record that ended (expired, released) in the current millisecond stays until the
    /// next, for its token ([`crate::protocol::may_forget`]).
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        crate::admin::purge_expired(self.store(), batch, |_| {}).await
    }

    /// Spawns a background task that purges expired records every `every` until the returned
    /// [`Reaper`] is dropped. Needs a Tokio runtime.
    pub fn spawn_reaper(&self, every: Duration) -> Reaper {
        let idem = self.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match idem.purge_expired(1000).await {
                    Ok(n) => {
                        if n > 0 {
                            tracing::debug!(purged = n, "idem: reaper purged records");
                        }
                        observe::reaper_tick(n);
                    }
                    Err(e) => {
                        tracing::warn!(idem.store = %idem.store().backend(), error = %e, "idem: reaper failed")
                    }
                }
            }
        });
        Reaper(task)
    }
}

/// The background purge started by [`Idem::spawn_reaper`]; stops when dropped.
#[derive(Debug)]
pub struct Reaper(tokio::task::JoinHandle<()>);

impl Drop for Reaper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    /// Counts the WARN events emitted while it is the thread's default subscriber.
    #[derive(Default)]
    struct CountWarnings(AtomicUsize);

    impl tracing::Subscriber for CountWarnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn same(a: &Idem, b: &Idem) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    // One test, because the installed handle is process-wide: the steps run in this order.
    #[test]
    fn try_install_refuses_a_second_handle_and_install_replaces_with_a_warning() {
        assert!(Idem::installed().is_none(), "no other unit test installs");

        // Eight threads race to install on an empty slot: exactly one wins, and the handle
        // installed is the winner's.
        let barrier = Arc::new(Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let idem = Idem::memory();
                    let mine = idem.clone();
                    barrier.wait();
                    (mine, idem.try_install())
                })
            })
            .collect();
        let results: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
        assert_eq!(winners.len(), 1, "exactly one try_install succeeds");
        let installed = Idem::installed().expect("the winner is installed");
        assert!(same(&installed, &winners[0].0));
        for (_, r) in results.iter().filter(|(_, r)| r.is_err()) {
            let e = r.as_ref().unwrap_err();
            assert!(e.is_config(), "{e:?}");
            assert!(e.to_string().contains("already installed"), "{e}");
        }

        // A refused try_install leaves the installed handle in place and logs nothing.
        let warnings = Arc::new(CountWarnings::default());
        let refused =
            tracing::subscriber::with_default(warnings.clone(), || Idem::memory().try_install());
        assert!(refused.unwrap_err().is_config());
        assert!(same(&Idem::installed().unwrap(), &installed));
        assert_eq!(warnings.0.load(Ordering::SeqCst), 0);

        // install replaces it, with one WARN event.
        let replacement = Idem::memory();
        tracing::subscriber::with_default(warnings.clone(), || replacement.clone().install());
        assert!(same(&Idem::installed().unwrap(), &replacement));
        assert_eq!(warnings.0.load(Ordering::SeqCst), 1);
    }
}
