//! Operators' releases, as a store publishes them to every instance ([`Store::releases`]).
//!
//! A store that can publish (PostgreSQL `NOTIFY`, Redis pub/sub) announces every
//! [`Store::force_release`] from the statement or script that ends the record, whoever runs it
//! (an instance, the CLI). A [`ReleaseFeed`] receives those announcements: what an instance
//! keeps about completed records (the handle's local cache) forgets a key as soon as it is
//! released anywhere, instead of replaying it until its entry's maximum age.
//!
//! The feed also says when it may have missed announcements: [`ReleaseNote::Lost`] while the
//! store's subscription is down, [`ReleaseNote::Listening`] once it receives again (anything
//! released in between is unknown, so whatever was kept from before must be dropped).
//!
//! [`Store::releases`]: super::Store::releases
//! [`Store::force_release`]: super::Store::force_release

use crate::key::Digest;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, watch};

/// What a [`ReleaseFeed`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseNote {
    /// An operator force-released this key, on any instance.
    Released(Digest),
    /// The store's subscription receives announcements (again, or for the first time since
    /// this feed was made): any key may have been released before this note.
    Listening,
    /// The store's subscription was lost: releases are not seen until the next
    /// [`ReleaseNote::Listening`].
    Lost,
}

/// A subscription to the keys force-released on a store, from any instance
/// ([`Store::releases`](super::Store::releases)). The store's listener runs while a feed exists.
pub struct ReleaseFeed {
    notes: broadcast::Receiver<ReleaseNote>,
    /// A note to give before reading `notes`: `Listening` when the listener was live already.
    first: Option<ReleaseNote>,
    /// Keeps the store's listener running.
    _hub: Arc<ReleaseHub>,
}

impl std::fmt::Debug for ReleaseFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseFeed").finish_non_exhaustive()
    }
}

impl ReleaseFeed {
    /// The next note; `None` once the store is gone. A feed that fell behind (more than a
    /// thousand notes unread) says [`ReleaseNote::Listening`]: it may have missed some.
    pub async fn next(&mut self) -> Option<ReleaseNote> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        match self.notes.recv().await {
            Ok(note) => Some(note),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(ReleaseNote::Listening),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
/// The listening half of a store's releases, for a backend's listener loop.
#[derive(Clone)]
pub(crate) struct Announce {
    notes: broadcast::Sender<ReleaseNote>,
    live: Arc<watch::Sender<bool>>,
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
impl Announce {
    /// The subscription receives (again): every feed drops what it kept from before.
    pub(crate) fn listening(&self) {
        self.live.send_replace(true);
        let _ = self.notes.send(ReleaseNote::Listening);
    }

    /// The subscription is down.
    pub(crate) fn lost(&self) {
        if self.live.send_replace(false) {
            let _ = self.notes.send(ReleaseNote::Lost);
        }
    }

    /// `key` was released.
    pub(crate) fn released(&self, key: Digest) {
        let _ = self.notes.send(ReleaseNote::Released(key));
    }
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
type Listen = dyn Fn(Announce) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
/// A store's listener for releases, started by the first feed on a Tokio runtime and stopped
/// when the store and every feed are gone.
pub(crate) struct ReleaseHub {
    announce: Announce,
    listen: Box<Listen>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
impl ReleaseHub {
    /// A hub whose listener is `listen` (a loop that subscribes, reconnects, and tells
    /// [`Announce`] what it receives; it never returns).
    pub(crate) fn new<F, Fut>(listen: F) -> ReleaseHub
    where
        F: Fn(Announce) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (notes, _) = broadcast::channel(1024);
        let (live, _) = watch::channel(false);
        ReleaseHub {
            announce: Announce {
                notes,
                live: Arc::new(live),
            },
            listen: Box::new(move |a| Box::pin(listen(a))),
            task: Mutex::new(None),
        }
    }

    /// A new feed, starting the listener if it is not running (first feed, or its runtime went
    /// away). Outside a Tokio runtime the listener cannot start: the feed says nothing until a
    /// feed is made on one.
    pub(crate) fn subscribe(self: &Arc<Self>) -> ReleaseFeed {
        let notes = self.announce.notes.subscribe();
        {
            let mut task = self.task.lock().unwrap_or_else(|p| p.into_inner());
            let running = task.as_ref().is_some_and(|t| !t.is_finished());
            if !running {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    self.announce.lost();
                    *task = Some(rt.spawn((self.listen)(self.announce.clone())));
                }
            }
        }
        let first = (*self.announce.live.borrow()).then_some(ReleaseNote::Listening);
        ReleaseFeed {
            notes,
            first,
            _hub: self.clone(),
        }
    }
}

impl Drop for ReleaseHub {
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
