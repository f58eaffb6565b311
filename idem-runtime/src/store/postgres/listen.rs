//! Waiting without polling: one `LISTEN` connection per store, fanning notifications out.
//!
//! `complete` and `release` send `pg_notify(channel, hex(key))` in their own statement when a
//! waiter has marked the row (the store's `changed` writes the mark after subscribing here); the
//! notification is delivered when that statement commits. The listener runs in a task started
//! by the first waiter, on a connection of its own (a one-connection pool with the store's
//! connect options, so it never takes a slot of the store's pool), and wakes the waiters of the
//! key's shard. Waiters re-read the record after every wake-up, so a spurious wake costs one
//! `get`, and a missed one (a change that landed before the waiter registered, or while the
//! listener was reconnecting) costs at most [`FALLBACK`]: the caller's timeout and final read
//! do the rest.

use crate::key::Digest;
use crate::store::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

const SHARDS: usize = 64;
/// Longest sleep of a waiter while the listener is up: covers a notification that was sent
/// between the waiter's last read and its registration.
pub(crate) const FALLBACK: Duration = Duration::from_millis(200);
/// Polling interval while the listener is not (yet) listening.
const POLL: Duration = Duration::from_millis(25);

pub(crate) struct Notifier {
    shards: Box<[Notify]>,
    ready: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    connect: PgConnectOptions,
    channel: String,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(t) = self
            .task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            t.abort();
        }
    }
}

impl Notifier {
    pub(crate) fn new(connect: PgConnectOptions, channel: String) -> Notifier {
        Notifier {
            shards: (0..SHARDS).map(|_| Notify::new()).collect(),
            ready: AtomicBool::new(false),
            task: Mutex::new(None),
            connect,
            channel,
        }
    }

    fn shard(&self, key: &Digest) -> &Notify {
        &self.shards[key.0[0] as usize % SHARDS]
    }

    fn wake_all(&self) {
        for s in self.shards.iter() {
            s.notify_waiters();
        }
    }

    /// Starts the listener task if it is not running (first use, or its runtime went away).
    fn ensure_running(self: &Arc<Self>) {
        let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.ready.store(false, Ordering::SeqCst);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(self.connect.clone());
        *task = Some(rt.spawn(listen(Arc::downgrade(self), pool, self.channel.clone())));
    }

    pub(crate) fn changed<'a>(
        self: &'a Arc<Self>,
        key: &'a Digest,
        timeout: Duration,
    ) -> BoxFuture<'a, ()> {
        self.ensure_running();
        let cap = if self.ready.load(Ordering::SeqCst) {
            FALLBACK
        } else {
            POLL
        };
        let notified = self.shard(key).notified();
        Box::pin(async move {
            let _ = tokio::time::timeout(timeout.min(cap), notified).await;
        })
    }
}

async fn listen(me: Weak<Notifier>, pool: PgPool, channel: String) {
    let set_ready = |ready: bool| {
        let Some(n) = me.upgrade() else { return false };
        n.ready.store(ready, Ordering::SeqCst);
        // Whatever changed while nobody listened: every waiter reads again.
        n.wake_all();
        true
    };
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "idem: postgres listener cannot connect; waiters poll");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        listener.ignore_pool_close_event(true);
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, "idem: LISTEN failed; waiters poll");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        if !set_ready(true) {
            return;
        }
        loop {
            match listener.try_recv().await {
                Ok(Some(note)) => {
                    let Some(n) = me.upgrade() else { return };
                    match Digest::from_hex(note.payload()) {
                        Some(key) => n.shard(&key).notify_waiters(),
                        None => n.wake_all(),
                    }
                }
                // The connection was lost and re-established: notifications in between are
                // gone, so wake everyone to read again.
                Ok(None) => {
                    if !set_ready(true) {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "idem: postgres listener lost; reconnecting");
                    if !set_ready(false) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

/// The listener of [`Store::releases`](crate::store::Store::releases): `LISTEN` on the releases
/// channel, on a connection of its own, announcing each released key; reconnects for ever
/// (until the store and its feeds are gone, which aborts it).
pub(crate) async fn announce_releases(
    connect: PgConnectOptions,
    channel: String,
    announce: crate::store::Announce,
) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(connect);
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "idem: postgres releases listener cannot connect");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        listener.ignore_pool_close_event(true);
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, "idem: LISTEN for releases failed");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        announce.listening();
        loop {
            match listener.try_recv().await {
                Ok(Some(note)) => match Digest::from_hex(note.payload()) {
                    Some(key) => announce.released(key),
                    // Not ours to read: whatever it released, forget everything.
                    None => announce.listening(),
                },
                // The connection was lost: listen again on a new one, and say so once it is up.
                Ok(None) => {
                    announce.lost();
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "idem: postgres releases listener lost; reconnecting");
                    announce.lost();
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
