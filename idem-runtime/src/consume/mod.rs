//! A queue consumer that survives redelivery, on any broker (feature `consume`; the adapters:
//! [`nats`] (`consume-nats`), [`rabbitmq`] (`consume-rabbitmq`), [`mqtt`] (`consume-mqtt`)).
//!
//! Brokers deliver at least once: a consumer that dies before its ack, an ack lost with its
//! connection, a handler slower than the broker's ack deadline all bring a message back. A
//! [`Consumer`] runs each delivery's handler as an idempotent call keyed on the message (its id
//! by default), and settles the delivery from the call's outcome:
//!
//! | the call | the delivery |
//! |---|---|
//! | fresh: the handler ran and its result is stored | acked (after the store has the result) |
//! | replayed: a finished delivery of the same message | acked; the handler does not run |
//! | [`Error::InProgress`]: the same message is being handled elsewhere | negative ack with a delay: it comes back and then replays |
//! | [`Error::Mismatch`]: the key was used before with another payload | dead-lettered with the reason |
//! | the handler's `Err` (the key is released) | negative ack: the redelivery runs it again |
//! | the store failed | negative ack with a delay |
//!
//! With [`Consumer::run_in_transaction`] (feature `postgres`) the handler's writes and the
//! idempotency record commit in one PostgreSQL transaction, and the delivery is acked after the
//! commit: a consumer killed at any point leaves either both or neither.
//!
//! ```no_run
//! # #[cfg(feature = "consume-rabbitmq")]
//! # async fn demo() -> Result<(), idem_runtime::Error> {
//! # use idem_runtime as idem;
//! use idem::consume::{rabbitmq::Queue, Consumer};
//! let orders = Queue::new("amqp://127.0.0.1:5672/%2f", "orders", "orders.dead");
//! let consumer = Consumer::new(&idem::Idem::memory(), "orders.v1").concurrency(16);
//! let stats = consumer.stats();
//! consumer
//!     .run(orders, tokio::signal::ctrl_c(), |msg| async move {
//!         // charge the order in msg.payload …
//!         Ok::<_, idem::Error>(())
//!     })
//!     .await?;
//! println!("{} processed, {} replayed", stats.processed(), stats.replayed());
//! # Ok(()) }
//! ```
//!
//! A broker of one's own plugs in through [`Source`] and [`Delivery`]. docs/queues.md has the
//! patterns for Kafka and SQS.

#[cfg(feature = "consume-mqtt")]
#[cfg_attr(docsrs, doc(cfg(feature = "consume-mqtt")))]
pub mod mqtt;
#[cfg(feature = "consume-nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "consume-nats")))]
pub mod nats;
#[cfg(feature = "consume-rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "consume-rabbitmq")))]
pub mod rabbitmq;

use crate::call::{Call, Outcome};
use crate::error::Error;
use crate::handle::Idem;
use crate::store::BoxFuture;
pub use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The header (NATS, RabbitMQ) or user property (MQTT) that carries the reason of a
/// dead-lettered message.
pub const DEAD_LETTER_REASON: &str = "idem-dead-letter-reason";

/// One message as the handler sees it, whatever the broker.
#[derive(Debug, Clone, Default)]
pub struct Message {
    /// The message's id as the producer set it: `Nats-Msg-Id` (else the stream and its
    /// sequence number), AMQP's `message_id` property, MQTT 5's `message-id` user property.
    pub id: Option<String>,
    /// The subject (NATS), routing key (RabbitMQ) or topic (MQTT).
    pub subject: String,
    /// The body.
    pub payload: Bytes,
    /// Headers (NATS), string-valued headers (RabbitMQ), user properties (MQTT 5).
    pub headers: Vec<(String, String)>,
    /// The broker says it delivered this message before.
    pub redelivered: bool,
}

impl Message {
    /// The first header (or user property) named `name`, compared without case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One delivery, settled once by the consumer: what an adapter implements for its broker.
pub trait Delivery: Send + 'static {
    /// The message.
    fn message(&self) -> &Message;

    /// Done with it: the broker forgets it.
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;

    /// Not now: the broker delivers it again after about `delay` (to this consumer or another).
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), Error>>;

    /// Never: the message goes to the dead-letter destination with `reason`, and only once it
    /// is there is it acked (if it cannot be put there, it is not acked, so it is not lost).
    fn dead_letter(self: Box<Self>, reason: String) -> BoxFuture<'static, Result<(), Error>>;
}

/// Where deliveries come from: an adapter's subscription.
pub trait Source: Send + 'static {
    /// Subscribes, with at most `prefetch` messages delivered and not yet settled.
    fn start(&mut self, prefetch: u16) -> BoxFuture<'_, Result<(), Error>>;

    /// The next delivery; `Err` for a broker failure the source recovers from (it reconnects
    /// on the next call), `None` when the subscription ended for good.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Box<dyn Delivery>, Error>>>;
}

/// A boxed source is a source: a consumer can take one chosen at run time.
impl<S: Source + ?Sized> Source for Box<S> {
    fn start(&mut self, prefetch: u16) -> BoxFuture<'_, Result<(), Error>> {
        (**self).start(prefetch)
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<Box<dyn Delivery>, Error>>> {
        (**self).next()
    }
}

/// What a consumer did, counted as it runs ([`Consumer::stats`]).
#[derive(Debug, Default)]
pub struct Stats {
    processed: AtomicU64,
    replayed: AtomicU64,
    in_progress: AtomicU64,
    dead_lettered: AtomicU64,
    failed: AtomicU64,
    broker_errors: AtomicU64,
}

impl Stats {
    /// Deliveries whose handler ran and whose result was stored (acked).
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Deliveries answered from a stored result: acked without running the handler.
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Deliveries of a message being handled elsewhere: negatively acked with a delay.
    pub fn in_progress(&self) -> u64 {
        self.in_progress.load(Ordering::Relaxed)
    }

    /// Messages sent to the dead-letter destination (a key reused with another payload, a
    /// message without a key, a stored result that no longer decodes).
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Deliveries whose handler or store failed: negatively acked, to run again.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Broker failures: a lost connection, an ack or nack the broker did not take (the
    /// message comes back and replays).
    pub fn broker_errors(&self) -> u64 {
        self.broker_errors.load(Ordering::Relaxed)
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The key or fingerprint of a message.
type Extract = Arc<dyn Fn(&Message) -> Option<String> + Send + Sync>;

/// What one call came to, for the delivery.
enum Handled {
    Fresh,
    Replayed,
    InProgress(Duration),
    DeadLetter(String),
    Failed(String),
}

/// The handler wrapped once: an idempotent call given its message.
type Process = Arc<dyn Fn(Call, Message) -> BoxFuture<'static, Handled> + Send + Sync>;

/// An idempotency failure or the handler's own error, kept apart through the call.
enum Failure<E> {
    Idem(Error),
    Handler(E),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

fn handled<T, E: fmt::Display>(result: Result<Outcome<T>, Failure<E>>) -> Handled {
    match result {
        Ok(Outcome::Fresh(_)) => Handled::Fresh,
        Ok(Outcome::Replayed(_)) => Handled::Replayed,
        Err(Failure::Handler(e)) => Handled::Failed(e.to_string()),
        Err(Failure::Idem(e)) => match e {
            Error::InProgress { retry_after, .. } => Handled::InProgress(retry_after),
            // The same key with another payload, or a stored result this code no longer
            // reads: every redelivery would fail alike, so the message is set aside.
            Error::Mismatch { .. } | Error::Codec(_) | Error::Key(_) => {
                Handled::DeadLetter(e.to_string())
            }
            e => Handled::Failed(e.to_string()),
        },
    }
}

/// A queue consumer: see the [module docs](self).
#[must_use = "a Consumer does nothing until `run`"]
pub struct Consumer {
    idem: Idem,
    name: Cow<'static, str>,
    key: Extract,
    fingerprint: Extract,
    concurrency: usize,
    prefetch: u16,
    retry_delay: Duration,
    failure_delay: Duration,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    stats: Arc<Stats>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .field("prefetch", &self.prefetch)
            .field("retry_delay", &self.retry_delay)
            .field("failure_delay", &self.failure_delay)
            .finish_non_exhaustive()
    }
}

/// The default fingerprint: the payload's SHA-256, so that a message id reused for another
/// payload is refused ([`Error::Mismatch`]) rather than replayed.
fn payload_digest(msg: &Message) -> Option<String> {
    let digest = Sha256::digest(&msg.payload);
    Some(digest.iter().map(|b| format!("{b:02x}")).collect())
}

impl Consumer {
    /// A consumer whose calls are in namespace `name` on `idem`'s store. Defaults: the key is
    /// the message id, the fingerprint the payload's digest, 8 handlers at once, a prefetch of
    /// 32, a duplicate in flight retried after 250 ms (or the running attempt's lease left, if
    /// shorter), a failed one after 1 s.
    pub fn new(idem: &Idem, name: impl Into<Cow<'static, str>>) -> Consumer {
        Consumer {
            idem: idem.clone(),
            name: name.into(),
            key: Arc::new(|m: &Message| m.id.clone()),
            fingerprint: Arc::new(payload_digest),
            concurrency: 8,
            prefetch: 32,
            retry_delay: Duration::from_millis(250),
            failure_delay: Duration::from_secs(1),
            ttl: None,
            lease: None,
            stats: Arc::default(),
        }
    }

    /// The key of a message, from its contents (`|m| Some(parse(&m.payload)?.order_id)`): a
    /// message without one (`None`) is dead-lettered.
    pub fn key(mut self, key: impl Fn(&Message) -> Option<String> + Send + Sync + 'static) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// What must match when a key comes again (default: the payload's SHA-256); a message
    /// whose fingerprint differs is dead-lettered as a mismatch. `None` fingerprints the key.
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&Message) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Arc::new(fingerprint);
        self
    }

    /// How many handlers run at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How many messages the broker may deliver before they are settled (RabbitMQ's QoS,
    /// JetStream's batch, MQTT 5's receive maximum). At least `concurrency`, so that no handler
    /// waits on the network.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// How long a duplicate of a message in flight waits before it comes back (the running
    /// attempt's lease left, when that is shorter).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.retry_delay = delay;
        self
    }

    /// How long a message whose handler or store failed waits before it comes back.
    pub fn failure_delay(mut self, delay: Duration) -> Self {
        self.failure_delay = delay;
        self
    }

    /// How long a handled message's result is kept: longer than the broker can redeliver it
    /// (default: the handle's TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The lease of each call (default: the handle's): a consumer that dies mid-message holds
    /// the key this long, and a redelivery within it is answered "in progress".
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The consumer's counters, live while it runs and after.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Consumes `source` until `shutdown` completes (or the source ends): each message runs
    /// `handler` at most once per key, its `Ok` value stored as the call's result. On shutdown
    /// no new delivery is taken; the handlers in flight finish and their deliveries are
    /// settled, then `run` returns. Fails only if the source cannot start.
    pub async fn run<S, T, E, F, Fut>(
        self,
        source: S,
        shutdown: impl Future + Send,
        handler: F,
    ) -> Result<(), Error>
    where
        S: Source,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let process: Process = Arc::new(move |call: Call, msg: Message| {
            let body = handler(msg);
            Box::pin(async move {
                handled(
                    call.run(async move { body.await.map_err(Failure::Handler) })
                        .await,
                )
            })
        });
        self.consume(source, shutdown, process).await
    }

    /// Like [`Consumer::run`], with each message handled **inside a PostgreSQL transaction**
    /// begun on `pool`: the handler's writes on the connection it is lent and the idempotency
    /// record commit together, and the delivery is acked after the commit. The handle's store
    /// must be PostgreSQL. A duplicate in flight waits for the first transaction here (see
    /// [`Call::in_transaction`]) and then replays.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn run_in_transaction<S, T, E, F>(
        self,
        source: S,
        shutdown: impl Future + Send,
        pool: sqlx::PgPool,
        handler: F,
    ) -> Result<(), Error>
    where
        S: Source,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: fmt::Display + Send + 'static,
        F: for<'c> Fn(&'c mut sqlx::PgConnection, Message) -> BoxFuture<'c, Result<T, E>>
            + Send
            + Sync
            + 'static,
    {
        let handler = Arc::new(handler);
        let process: Process = Arc::new(move |call: Call, msg: Message| {
            let (pool, handler) = (pool.clone(), handler.clone());
            Box::pin(async move {
                let mut tx = match pool.begin().await {
                    Ok(tx) => tx,
                    Err(e) => return Handled::Failed(format!("begin: {e}")),
                };
                let result = call
                    .in_transaction(&mut tx, async move |conn| {
                        handler(conn, msg).await.map_err(Failure::Handler)
                    })
                    .await;
                let outcome = handled(result);
                if matches!(outcome, Handled::Fresh | Handled::Replayed) {
                    if let Err(e) = tx.commit().await {
                        return Handled::Failed(format!("commit: {e}"));
                    }
                }
                outcome
            })
        });
        self.consume(source, shutdown, process).await
    }

    async fn consume<S: Source>(
        self,
        mut source: S,
        shutdown: impl Future + Send,
        process: Process,
    ) -> Result<(), Error> {
        source.start(self.prefetch).await?;
        let this = Arc::new(self);
        let slots = Arc::new(Semaphore::new(this.concurrency));
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let slot = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let next = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                next = source.next() => next,
            };
            match next {
                None => break,
                Some(Err(e)) => {
                    Stats::bump(&this.stats.broker_errors);
                    tracing::warn!(error = %e, "consumer: broker failure; resuming");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Some(Ok(delivery)) => {
                    let (this, process) = (this.clone(), process.clone());
                    tasks.spawn(async move {
                        this.handle(delivery, &process).await;
                        drop(slot);
                    });
                }
            }
            while tasks.try_join_next().is_some() {}
        }
        // Shutdown: no new delivery; the handlers in flight finish and settle theirs.
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    /// One delivery: the call, then the ack, nack or dead letter its outcome asks for.
    async fn handle(&self, delivery: Box<dyn Delivery>, process: &Process) {
        let msg = delivery.message().clone();
        let stats = &self.stats;
        let Some(key) = (self.key)(&msg) else {
            let settled = delivery
                .dead_letter("the message has no key (no message id)".into())
                .await;
            return self.settled(settled, &stats.dead_lettered);
        };
        let mut call = self.idem.call(self.name.clone()).key(&key);
        if let Some(fingerprint) = (self.fingerprint)(&msg) {
            call = call.fingerprint(&fingerprint);
        }
        if let Some(ttl) = self.ttl {
            call = call.ttl(ttl);
        }
        if let Some(lease) = self.lease {
            call = call.lease(lease);
        }
        match process(call, msg).await {
            Handled::Fresh => self.settled(delivery.ack().await, &stats.processed),
            Handled::Replayed => self.settled(delivery.ack().await, &stats.replayed),
            Handled::InProgress(after) => {
                let delay = after.min(self.retry_delay);
                self.settled(delivery.nack(delay).await, &stats.in_progress)
            }
            Handled::DeadLetter(reason) => {
                tracing::warn!(key = %key, %reason, "consumer: dead-lettering a message");
                self.settled(delivery.dead_letter(reason).await, &stats.dead_lettered)
            }
            Handled::Failed(reason) => {
                tracing::warn!(key = %key, %reason, "consumer: the handler failed; the message comes back");
                self.settled(delivery.nack(self.failure_delay).await, &stats.failed)
            }
        }
    }

    fn settled(&self, result: Result<(), Error>, counter: &AtomicU64) {
        match result {
            Ok(()) => Stats::bump(counter),
            Err(e) => {
                // The broker redelivers what it did not hear settled; the redelivery replays.
                Stats::bump(&self.stats.broker_errors);
                tracing::warn!(error = %e, "consumer: could not settle a delivery");
            }
        }
    }
}

/// A broker failure as an [`Error`] of kind `Unreachable` (the broker is the store of messages).
#[cfg_attr(
    not(any(
        feature = "consume-nats",
        feature = "consume-rabbitmq",
        feature = "consume-mqtt"
    )),
    allow(dead_code)
)]
pub(crate) fn broker_error(
    broker: &'static str,
    op: &'static str,
    e: impl Into<crate::error::BoxError>,
) -> Error {
    Error::store_kind(broker, op, crate::error::StoreErrorKind::Unreachable, e)
}
