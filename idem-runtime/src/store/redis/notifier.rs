//! Waiting without polling: one pub/sub connection per store, shared by every waiter.
//!
//! A completion or release publishes on the channel named like the record's key when a waiter
//! marked the record; [`Notifier::subscribe`] keeps that channel subscribed while someone waits
//! on it, and each message wakes that channel's waiters.
//!
//! On a cluster the channel is a *shard* channel (`SSUBSCRIBE`/`SPUBLISH`, Redis 7.0+): it
//! hashes to the slot of the record's key, so a completion is sent only to the shard that owns
//! the key, not broadcast over the cluster bus to every node as `PUBLISH` would be.

use super::RedisOptions;
use crate::key::Digest;
use ::redis::aio::PubSubSink;
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Client, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// The waiters of one channel.
struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// Where completions are published: one server's channels, or a cluster's shard channels.
pub(super) enum Source {
    /// One server: `SUBSCRIBE` on a pub/sub connection of its own.
    Server(Client),
    /// A cluster (its nodes' URLs): `SSUBSCRIBE` on a RESP3 cluster connection, which sends
    /// each channel to the shard that owns its slot and subscribes again after a failover.
    Cluster(Vec<String>),
}

/// The subscribing half of a pub/sub connection.
enum Sink {
    Server(PubSubSink),
    Cluster(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Sink::Server(sink) => sink.subscribe(channel).await,
            Sink::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Sink::Server(sink) => sink.unsubscribe(channel).await,
            Sink::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// The subscribing half of the pub/sub connection and what it is subscribed to.
#[derive(Default)]
struct Subscriptions {
    sink: Option<Sink>,
    channels: HashSet<String>,
    /// Bumped on every new connection, so a dispatcher that ends only resets its own.
    generation: u64,
}

/// One pub/sub connection per store, shared by every waiter: a channel is subscribed while a
/// waiter listens on it (and for [`LINGER`] after, so a wait loop does not subscribe anew on
/// every turn), and each message wakes that channel's waiters.
pub(super) struct Notifier {
    source: Source,
    options: RedisOptions,
    waiters: Mutex<HashMap<String, Waiters>>,
    /// Subscribe and unsubscribe are serialised by this lock, so the "is anyone still
    /// waiting?" check and the command it decides are never interleaved.
    subs: tokio::sync::Mutex<Subscriptions>,
    dispatcher: Mutex<Option<tokio::task::AbortHandle>>,
}

/// How long a channel stays subscribed after its last waiter left.
const LINGER: Duration = Duration::from_secs(1);

/// A registered waiter; unregisters (and unsubscribes when it was the last) on drop.
pub(super) struct Waiter<'a> {
    notifier: &'a Arc<Notifier>,
    channel: String,
    pub(super) notify: Arc<Notify>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let last = {
            let mut w = lock(&self.notifier.waiters);
            match w.get_mut(&self.channel) {
                Some(entry) if entry.count > 1 => {
                    entry.count -= 1;
                    false
                }
                Some(_) => {
                    w.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let notifier = Arc::downgrade(self.notifier);
                let channel = std::mem::take(&mut self.channel);
                rt.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    if let Some(n) = notifier.upgrade() {
                        n.unsubscribe(&channel).await;
                    }
                });
            }
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

impl Notifier {
    pub(super) fn new(source: Source, options: RedisOptions) -> Self {
        Notifier {
            source,
            options,
            waiters: Mutex::new(HashMap::new()),
            subs: tokio::sync::Mutex::new(Subscriptions::default()),
            dispatcher: Mutex::new(None),
        }
    }

    pub(super) fn register<'a>(self: &'a Arc<Self>, channel: &str) -> Waiter<'a> {
        let mut w = lock(&self.waiters);
        let entry = w.entry(channel.to_string()).or_insert_with(|| Waiters {
            notify: Arc::new(Notify::new()),
            count: 0,
        });
        entry.count += 1;
        Waiter {
            notifier: self,
            channel: channel.to_string(),
            notify: entry.notify.clone(),
        }
    }

    /// Makes sure `channel` is subscribed, connecting the pub/sub connection first if there is
    /// none or it died (one reconnection per call).
    pub(super) async fn subscribe(self: &Arc<Self>, channel: &str) -> Result<(), RedisError> {
        let mut subs = self.subs.lock().await;
        if subs.sink.is_some() && subs.channels.contains(channel) {
            return Ok(());
        }
        for fresh in [false, true] {
            if subs.sink.is_none() || fresh {
                self.connect(&mut subs).await?;
            }
            let sink = subs.sink.as_mut().expect("connected above");
            let res = tokio::time::timeout(self.options.response_timeout, sink.subscribe(channel))
                .await
                .unwrap_or_else(|_| Err(timed_out("SUBSCRIBE")));
            match res {
                Ok(()) => {
                    subs.channels.insert(channel.to_string());
                    return Ok(());
                }
                Err(e) if !fresh => {
                    tracing::debug!(error = %e, "idem: redis pub/sub connection lost; reconnecting")
                }
                Err(e) => {
                    subs.sink = None;
                    return Err(e);
                }
            }
        }
        unreachable!("the second round returns")
    }

    async fn unsubscribe(&self, channel: &str) {
        let mut subs = self.subs.lock().await;
        if lock(&self.waiters).contains_key(channel) || !subs.channels.remove(channel) {
            return; // someone is waiting again, or the connection it was on is gone
        }
        if let Some(sink) = subs.sink.as_mut() {
            let r = tokio::time::timeout(self.options.response_timeout, sink.unsubscribe(channel));
            if !matches!(r.await, Ok(Ok(()))) {
                subs.sink = None;
                subs.channels.clear();
            }
        }
    }

    async fn connect(self: &Arc<Self>, subs: &mut Subscriptions) -> Result<(), RedisError> {
        subs.sink = None;
        subs.channels.clear();
        subs.generation += 1;
        let sink = match &self.source {
            Source::Server(client) => self.connect_server(client, subs.generation).await?,
            Source::Cluster(nodes) => self.connect_cluster(nodes).await?,
        };
        subs.sink = Some(sink);
        Ok(())
    }

    async fn connect_server(
        self: &Arc<Self>,
        client: &Client,
        generation: u64,
    ) -> Result<Sink, RedisError> {
        let pubsub =
            tokio::time::timeout(self.options.connection_timeout, client.get_async_pubsub())
                .await
                .map_err(|_| timed_out("the pub/sub connection"))??;
        let (sink, mut stream) = pubsub.split();
        let weak: Weak<Notifier> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(n) = weak.upgrade() else { return };
                n.wake(msg.get_channel_name());
            }
            // The connection ended: forget it, and wake everyone so they look at their
            // records and subscribe again on a new connection.
            let Some(n) = weak.upgrade() else { return };
            {
                let mut subs = n.subs.lock().await;
                if subs.generation == generation {
                    subs.sink = None;
                    subs.channels.clear();
                }
            }
            n.wake_all();
        });
        if let Some(old) = lock(&self.dispatcher).replace(task.abort_handle()) {
            old.abort();
        }
        Ok(Sink::Server(sink))
    }

    /// A cluster connection of its own for the shard channels. redis-rs hands every push to the
    /// sender below as it reads it: a message wakes its channel's waiters, and a lost node
    /// (after which the client subscribes again by itself) wakes everyone to look.
    async fn connect_cluster(self: &Arc<Self>, nodes: &[String]) -> Result<Sink, RedisError> {
        let weak: Weak<Notifier> = Arc::downgrade(self);
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(self.options.connection_timeout)
            .response_timeout(self.options.response_timeout)
            .push_sender(move |push: PushInfo| {
                let Some(n) = weak.upgrade() else {
                    return Err(());
                };
                match (push.kind, push.data.first()) {
                    (PushKind::SMessage, Some(Value::BulkString(channel))) => {
                        n.wake(&String::from_utf8_lossy(channel))
                    }
                    (PushKind::Disconnection, _) => n.wake_all(),
                    _ => {}
                }
                Ok(())
            })
            .build()?;
        let conn = tokio::time::timeout(
            self.options.connection_timeout + self.options.response_timeout,
            client.get_async_connection(),
        )
        .await
        .map_err(|_| timed_out("the sharded pub/sub connection"))??;
        Ok(Sink::Cluster(conn))
    }

    /// Wakes the waiters of `channel`.
    fn wake(&self, channel: &str) {
        if let Some(w) = lock(&self.waiters).get(channel) {
            w.notify.notify_waiters();
        }
    }

    /// Wakes every waiter, to look at its record again.
    fn wake_all(&self) {
        for w in lock(&self.waiters).values() {
            w.notify.notify_waiters();
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.dispatcher).take() {
            task.abort();
        }
    }
}

/// The listener of [`Store::releases`](crate::store::Store::releases) on one server: `SUBSCRIBE`
/// to the releases channel on a pub/sub connection of its own, announcing each released key;
/// reconnects for ever (until the store and its feeds are gone, which aborts it).
pub(super) async fn announce_releases(
    client: Client,
    options: RedisOptions,
    channel: String,
    announce: crate::store::Announce,
) {
    loop {
        let connected =
            tokio::time::timeout(options.connection_timeout, client.get_async_pubsub()).await;
        let mut pubsub = match connected {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "idem: redis releases subscriber cannot connect");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(_) => continue,
        };
        let subscribed =
            tokio::time::timeout(options.response_timeout, pubsub.subscribe(&channel)).await;
        if !matches!(subscribed, Ok(Ok(()))) {
            tracing::debug!("idem: SUBSCRIBE for releases failed; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        announce.listening();
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            let payload: Vec<u8> = msg.get_payload_bytes().to_vec();
            match std::str::from_utf8(&payload)
                .ok()
                .and_then(Digest::from_hex)
            {
                Some(key) => announce.released(key),
                // Not ours to read: whatever it released, forget everything.
                None => announce.listening(),
            }
        }
        tracing::debug!("idem: redis releases subscriber lost; reconnecting");
        announce.lost();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
