//! The relay: delivers committed outbox messages to a [`Publisher`], at least once, in order
//! per ordering key.
//!
//! Each round is one transaction: lock the *head* (oldest pending message) of up to `batch`
//! ordering keys whose head is due, skipping rows another relay holds
//! (`FOR UPDATE SKIP LOCKED`); publish each; mark it delivered, or count the failure (back off,
//! or dead-letter it after `max_attempts`); commit. A key's next message is not a head while
//! the previous one is pending, so one relay at a time works on a key and a key's messages go
//! out one after the other. A relay that dies mid-round leaves its rows pending (its
//! transaction never commits), and the next round of any relay publishes them again: the
//! consumer deduplicates on the message id.
//!
//! Relays sleep until an enqueue's NOTIFY (sent on commit; PostgreSQL only), a retry falls
//! due, or the poll interval passes (the fallback for a lost notification or a lost listener
//! connection; on MySQL, which has no notifications, the way new messages are found).
//!
//! The loop is the same on every database; each database's statements are its dialect's
//! (`dialect.rs`).

use super::dialect::{Dialect, OutboxDatabase};
use super::Outbox;
use crate::error::{BoxError, Error};
use crate::store::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// The shortest sleep of a relay whose round took nothing while a message is due: that message
/// is locked by another relay, mid-publish. Without it the idle relay would ask again at once,
/// round after round, for as long as the other one publishes.
const LOCKED_PAUSE: Duration = Duration::from_millis(25);

/// A message the relay hands to a [`Publisher`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// The message id, stable across retries of the call that enqueued it and across
    /// redeliveries: send it along for the consumer to deduplicate on.
    pub id: String,
    /// The topic given at enqueue.
    pub topic: String,
    /// The ordering key given at enqueue (`""` by default).
    pub ordering_key: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The headers given at enqueue.
    pub headers: BTreeMap<String, String>,
    /// 1 on the first delivery attempt, then 2, 3, … (after failures, or a relay that died
    /// mid-delivery is not counted).
    pub attempt: u32,
}

impl Delivery {
    /// From a locked row: id, topic, ordering key, payload, headers (JSON text), attempts.
    pub(super) fn from_row(
        id: String,
        topic: String,
        ordering_key: String,
        payload: Vec<u8>,
        headers: &str,
        attempts: i32,
    ) -> Delivery {
        Delivery {
            id,
            topic,
            ordering_key,
            payload,
            // Written by enqueue from a map of strings; anything else is left out.
            headers: serde_json::from_str(headers).unwrap_or_default(),
            attempt: attempts.max(0) as u32 + 1,
        }
    }
}

/// Where a relay sends messages. `Ok` means the other system has the message (a JetStream
/// ack, a 2xx answer): only then is it marked delivered. An `Err` is retried with back-off.
/// Object-safe: relays take an `Arc<dyn Publisher>`.
pub trait Publisher: Send + Sync + 'static {
    /// Sends one message.
    fn publish<'a>(&'a self, message: &'a Delivery) -> BoxFuture<'a, Result<(), BoxError>>;
}

impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    fn publish<'a>(&'a self, message: &'a Delivery) -> BoxFuture<'a, Result<(), BoxError>> {
        (**self).publish(message)
    }
}

/// How a relay works. The defaults suit most deployments.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    batch: i64,
    poll: Duration,
    max_attempts: u32,
    backoff: Duration,
    max_backoff: Duration,
    publish_timeout: Duration,
    retention: Duration,
    purge_every: Duration,
    metrics_every: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            batch: 64,
            poll: Duration::from_secs(5),
            max_attempts: 10,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(60),
            publish_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            purge_every: Duration::from_secs(60),
            metrics_every: Duration::from_secs(10),
        }
    }
}

impl RelayOptions {
    /// At most this many ordering keys per round (default 64).
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = i64::from(n.max(1));
        self
    }
    /// The longest sleep without a notification (default 5 s): on PostgreSQL the fallback when
    /// a NOTIFY is lost (the listener reconnecting); on MySQL, which has no notifications, how
    /// soon an idle relay sees a new message (a relay that delivered something looks again at
    /// once).
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }
    /// After this many failed attempts a message is dead-lettered (default 10; at least 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }
    /// The wait after a first failure (default 200 ms), doubled after each further one up to
    /// `max` (default 60 s).
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }
    /// A publish that takes longer fails (default 30 s): the round's row locks are held
    /// meanwhile.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }
    /// Delivered messages are deleted after this long (default 24 h), checked every
    /// `every` (default 60 s). Dead letters are kept.
    pub fn retention(mut self, keep: Duration, every: Duration) -> Self {
        self.retention = keep;
        self.purge_every = every;
        self
    }

    /// With the feature `metrics`: how often the relay reads [`Outbox::stats`] and sets the
    /// outbox gauges (`idem_outbox_pending`, `idem_outbox_dead`,
    /// `idem_outbox_oldest_pending_seconds`; see [`Outbox::report_metrics`]) — after a round,
    /// at most once per `every` (default 10 s; the count reads the whole table). Without the
    /// feature the relay never reads them.
    pub fn metrics_every(mut self, every: Duration) -> Self {
        self.metrics_every = every;
        self
    }

    fn backoff_after(&self, attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(20);
        self.backoff
            .saturating_mul(1u32 << shift)
            .min(self.max_backoff)
    }
}

/// What a relay did since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Messages the publisher accepted.
    pub delivered: u64,
    /// Failed attempts (each retried later, or dead-lettered).
    pub failed: u64,
    /// Messages moved to the dead-letter state.
    pub dead: u64,
    /// Delivered messages purged after the retention.
    pub purged: u64,
    /// Rounds run (each a look for due messages, whether it found any).
    pub rounds: u64,
}

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    purged: AtomicU64,
    rounds: AtomicU64,
}

/// A running relay. [`Relay::stop`] ends it after the round in flight; dropping it aborts it
/// at once (what a crash does: the round's messages stay pending and are delivered again).
#[derive(Debug)]
pub struct Relay {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Relay {
    /// Starts a relay of `outbox` to `publisher` on the current Tokio runtime. Start one per
    /// process, or several: they share the work.
    pub fn start<Db: OutboxDatabase>(
        outbox: &Outbox<Db>,
        publisher: impl Publisher,
        options: RelayOptions,
    ) -> Relay {
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let worker = Worker {
            outbox: outbox.clone(),
            publisher: Arc::new(publisher),
            options,
            counters: counters.clone(),
        };
        Relay {
            stop,
            task: Some(tokio::spawn(worker.run(stopped))),
            counters,
        }
    }

    /// Stops the relay after the round in flight, and waits for it.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Aborts the relay now, mid-round if need be, as a crash would.
    pub fn abort(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    /// What the relay did so far.
    pub fn stats(&self) -> RelayStats {
        let c = &self.counters;
        RelayStats {
            delivered: c.delivered.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            dead: c.dead.load(Ordering::Relaxed),
            purged: c.purged.load(Ordering::Relaxed),
            rounds: c.rounds.load(Ordering::Relaxed),
        }
    }

    /// One round, without a running relay: publishes the due head of up to `batch` keys and
    /// returns how many messages it handled (delivered, failed or dead-lettered). For tests,
    /// tools and a relay driven by your own scheduler.
    pub async fn deliver_once<Db: OutboxDatabase>(
        outbox: &Outbox<Db>,
        publisher: &dyn Publisher,
        options: &RelayOptions,
    ) -> Result<usize, Error> {
        round(outbox, publisher, options, &Counters::default()).await
    }
}

struct Worker<Db: OutboxDatabase> {
    outbox: Outbox<Db>,
    publisher: Arc<dyn Publisher>,
    options: RelayOptions,
    counters: Arc<Counters>,
}

impl<Db: OutboxDatabase> Worker<Db> {
    async fn run(self, mut stopped: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        // Aborted with the relay, however it ends (a stop, or an abort mid-round).
        let _listener = self
            .outbox
            .dialect()
            .listen(self.outbox.pool().clone(), wake.clone())
            .map(|task| AbortOnDrop(tokio::spawn(task)));
        let mut last_purge: Option<Instant> = None;
        let mut last_report: Option<Instant> = None;
        let mut failures = 0u32;
        while !*stopped.borrow() {
            if last_purge.is_none_or(|t| t.elapsed() >= self.options.purge_every) {
                match self.outbox.purge_delivered(self.options.retention).await {
                    Ok(n) => {
                        self.counters.purged.fetch_add(n, Ordering::Relaxed);
                        last_purge = Some(Instant::now());
                    }
                    Err(e) => tracing::warn!(error = %e, "idem outbox: purge failed"),
                }
            }
            self.counters.rounds.fetch_add(1, Ordering::Relaxed);
            let done = round(
                &self.outbox,
                &*self.publisher,
                &self.options,
                &self.counters,
            )
            .await;
            if cfg!(feature = "metrics")
                && last_report.is_none_or(|t| t.elapsed() >= self.options.metrics_every)
            {
                match self.outbox.report_metrics().await {
                    Ok(_) => last_report = Some(Instant::now()),
                    Err(e) => tracing::debug!(error = %e, "idem outbox: stats for metrics failed"),
                }
            }
            let sleep = match done {
                Ok(0) => {
                    failures = 0;
                    self.outbox
                        .dialect()
                        .next_due(self.outbox.pool())
                        .await
                        .unwrap_or(None)
                        .map_or(self.options.poll, |d| {
                            d.max(LOCKED_PAUSE).min(self.options.poll)
                        })
                }
                Ok(_) => {
                    failures = 0;
                    continue;
                }
                Err(e) => {
                    // The database is unreachable or refusing: back off as for a publisher.
                    failures += 1;
                    tracing::warn!(error = %e, "idem outbox: relay round failed");
                    self.options.backoff_after(failures).min(self.options.poll)
                }
            };
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = stopped.changed() => {}
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One round: in one transaction, lock the due heads, publish each, record what happened,
/// commit.
async fn round<Db: OutboxDatabase>(
    outbox: &Outbox<Db>,
    publisher: &dyn Publisher,
    options: &RelayOptions,
    counters: &Counters,
) -> Result<usize, Error> {
    let dialect = outbox.dialect();
    let db = |e| Db::__Dialect::error("outbox.relay", e);
    let mut conn = outbox.pool().acquire().await.map_err(db)?;
    dialect.before_round(&mut conn).await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db)?;
    let heads = dialect.heads(&mut tx, options.batch).await?;
    let n = heads.len();
    for message in heads {
        let sent = match tokio::time::timeout(options.publish_timeout, publisher.publish(&message))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(format!("publish timed out after {:?}", options.publish_timeout).into()),
        };
        match sent {
            Ok(()) => {
                dialect.delivered(&mut tx, &message.id).await?;
                counters.delivered.fetch_add(1, Ordering::Relaxed);
                crate::observe::outbox_handled(outbox.table(), "delivered");
            }
            Err(e) => {
                let dead = message.attempt >= options.max_attempts;
                let wait = options.backoff_after(message.attempt);
                tracing::warn!(id = %message.id, topic = %message.topic, attempt = message.attempt,
                    dead, error = %e, "idem outbox: publish failed");
                dialect
                    .failed(&mut tx, &message.id, e.to_string(), dead, wait)
                    .await?;
                counters.failed.fetch_add(1, Ordering::Relaxed);
                if dead {
                    counters.dead.fetch_add(1, Ordering::Relaxed);
                }
                crate::observe::outbox_handled(
                    outbox.table(),
                    if dead { "dead" } else { "failed" },
                );
            }
        }
    }
    tx.commit().await.map_err(db)?;
    Ok(n)
}
