//! `Idem`: a store plus its defaults, cheap to clone, shared by every call.

use crate::call::Call;
use crate::error::Error;
use crate::observe;
use crate::policy::Defaults;
use crate::store::memory::MemoryStore;
use crate::store::Store;
use std::borrow::Cow;
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

struct Inner {
    store: Box<dyn Store>,
    defaults: Defaults,
}

static INSTALLED: RwLock<Option<Idem>> = RwLock::new(None);

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.inner.store.backend())
            .field("defaults", &self.inner.defaults)
            .finish()
    }
}

impl Idem {
    /// A process-local store: keys live as long as the process.
    pub fn memory() -> Idem {
        Idem::from_store(MemoryStore::new())
    }

    /// The embedded durable store: `"sqlite::memory:"` or `"sqlite://file.db"` (a missing file
    /// is created, and so is the schema).
    #[cfg(feature = "sqlite")]
    pub async fn sqlite(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::sqlite::SqliteStore::open(url).await?,
        ))
    }

    /// A PostgreSQL store (the schema is created or upgraded on open).
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::postgres::PostgresStore::open(url).await?,
        ))
    }

    /// A Redis store.
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<Idem, Error> {
        Ok(Idem::from_store(
            crate::store::redis::RedisStore::open(url).await?,
        ))
    }

    /// A handle on any [`Store`], with the default policy (ttl 24 h, lease 30 s, no wait).
    pub fn from_store(store: impl Store) -> Idem {
        Idem::with_defaults(store, Defaults::default())
    }

    /// A handle on any [`Store`] with its own defaults for calls that set none.
    pub fn with_defaults(store: impl Store, defaults: Defaults) -> Idem {
        Idem {
            inner: Arc::new(Inner {
                store: Box::new(store),
                defaults,
            }),
        }
    }

    /// Makes this handle the process-wide default, used by `#[idempotent]` functions without
    /// `store = …`. Installing again replaces the previous default.
    pub fn install(self) {
        *INSTALLED.write().unwrap_or_else(|p| p.into_inner()) = Some(self);
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

    /// Starts an idempotent call in namespace `name`: set its key (and optionally scope,
    /// fingerprint, ttl, lease, wait), then `run` its body.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem::Error> {
    /// let idem = idem::Idem::memory();
    /// let out = idem
    ///     .call("charges.v1")
    ///     .key("order-42")
    ///     .run(async { Ok::<_, idem::Error>(42u32) })
    ///     .await?;
    /// assert!(!out.is_replayed());
    /// # Ok(()) }
    /// ```
    pub fn call(&self, name: impl Into<Cow<'static, str>>) -> Call {
        Call::new(self, name)
    }

    /// Deletes every record that is no longer live, in batches of `batch` (each batch one
    /// bounded operation, so concurrent calls are never blocked for long). Returns how many.
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
                        tracing::warn!(idem.store = idem.store().backend(), error = %e, "idem: reaper failed")
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
