//! The redelivery incident, reproduced on a real NATS JetStream server: a consumer with a short
//! `ack_wait` whose handler is slower than that under load, so the broker redelivers messages
//! whose first delivery is still being handled. Shared by `examples/redelivery` and
//! `tests/nats_redelivery.rs`.

use async_nats::jetstream::{self, consumer::pull, stream, AckKind};
use futures_util::StreamExt;
use idem::Idem;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Any error of the scenario.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the handler is written.
#[derive(Clone)]
pub enum Mode {
    /// Charges on every delivery: the bug.
    Unprotected,
    /// Charges inside `idem.call("charge").key(&msg_id)`: a redelivery of a message being
    /// handled is `InProgress` (not acked: it comes back later), one already handled replays.
    Idempotent(Idem),
}

/// The knobs of a run.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// How many charge messages are published.
    pub messages: usize,
    /// The consumer's `ack_wait`: a delivery not acked within it is redelivered.
    pub ack_wait: Duration,
    /// How long one call of the payment gateway takes.
    pub gateway_latency: Duration,
    /// How many calls the gateway takes at once (the rest queue: the load).
    pub gateway_concurrency: usize,
    /// Gives up after this long.
    pub deadline: Duration,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            messages: 15,
            ack_wait: Duration::from_secs(1),
            gateway_latency: Duration::from_millis(300),
            gateway_concurrency: 3,
            deadline: Duration::from_secs(15),
        }
    }
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    /// Messages published.
    pub messages: usize,
    /// Deliveries the consumer received (first deliveries and redeliveries).
    pub deliveries: usize,
    /// The highest delivery count the broker reported on a message (`info.delivered`).
    pub max_delivered: i64,
    /// Charges made, per message id: the side effect.
    pub charges: HashMap<String, usize>,
    /// Deliveries answered "in progress" (not acked, so redelivered later).
    pub in_progress: usize,
    /// Deliveries answered from the stored result (acked without charging).
    pub replayed: usize,
    /// How long the run took.
    pub elapsed: Duration,
}

impl Report {
    /// Total charges.
    pub fn total_charges(&self) -> usize {
        self.charges.values().sum()
    }

    /// Messages charged more than once.
    pub fn double_charged(&self) -> usize {
        self.charges.values().filter(|&&n| n > 1).count()
    }
}

/// The payment gateway: slow, with limited concurrency, counting charges per message.
struct Gateway {
    slots: Semaphore,
    latency: Duration,
    charges: Mutex<HashMap<String, usize>>,
}

impl Gateway {
    async fn charge(&self, msg_id: &str) -> u64 {
        let _slot = self.slots.acquire().await.expect("gateway open");
        tokio::time::sleep(self.latency).await;
        let mut charges = self.charges.lock().unwrap();
        let n = charges.entry(msg_id.to_owned()).or_default();
        *n += 1;
        charges.values().sum::<usize>() as u64
    }
}

/// Publishes `setup.messages` charges to a fresh stream, consumes them with `mode`'s handler
/// until every one is acked, deletes the stream, and reports.
pub async fn run(url: &str, mode: Mode, setup: Setup) -> Result<Report, BoxError> {
    let client = async_nats::connect(url).await?;
    let js = jetstream::new(client);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let name = format!("IDEM_REDELIVERY_{}_{nanos}", std::process::id());
    let subject = format!("idem.redelivery.{}.{nanos}", std::process::id());
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    let result = consume(&js, &stream, &subject, mode, setup).await;
    js.delete_stream(&name).await?;
    result
}

async fn consume(
    js: &jetstream::Context,
    stream: &stream::Stream,
    subject: &str,
    mode: Mode,
    setup: Setup,
) -> Result<Report, BoxError> {
    for i in 0..setup.messages {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("charge-{i}").as_str(),
        );
        let payload = format!(r#"{{"customer":"cus_{i}","amount":{}}}"#, 1000 + i);
        js.publish_with_headers(subject.to_owned(), headers, payload.into())
            .await?
            .await?;
    }
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("charges".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: setup.ack_wait,
            max_deliver: 50,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;

    let gateway = Arc::new(Gateway {
        slots: Semaphore::new(setup.gateway_concurrency),
        latency: setup.gateway_latency,
        charges: Mutex::new(HashMap::new()),
    });
    let in_flight = Arc::new(AtomicUsize::new(0));
    let in_progress = Arc::new(AtomicUsize::new(0));
    let replayed = Arc::new(AtomicUsize::new(0));
    let mut report = Report {
        messages: setup.messages,
        ..Default::default()
    };
    let started = Instant::now();
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            next = messages.next() => {
                let msg = next.ok_or("the consumer's message stream ended")??;
                report.deliveries += 1;
                let info = msg.info()?;
                report.max_delivered = report.max_delivered.max(info.delivered);
                let msg_id = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_else(|| format!("seq-{}", info.stream_sequence));
                in_flight.fetch_add(1, Ordering::SeqCst);
                let (mode, gateway, in_flight) = (mode.clone(), gateway.clone(), in_flight.clone());
                let (in_progress, replayed) = (in_progress.clone(), replayed.clone());
                tokio::spawn(async move {
                    let ack = match mode {
                        Mode::Unprotected => {
                            gateway.charge(&msg_id).await;
                            AckKind::Ack
                        }
                        Mode::Idempotent(idem) => {
                            let charged = idem
                                .call("charge")
                                .key(&msg_id)
                                .lease(Duration::from_secs(10))
                                .run(async { Ok::<_, idem::Error>(gateway.charge(&msg_id).await) })
                                .await;
                            match charged {
                                Ok(outcome) => {
                                    if outcome.is_replayed() {
                                        replayed.fetch_add(1, Ordering::SeqCst);
                                    }
                                    AckKind::Ack
                                }
                                // The first delivery is still being handled: do not ack this
                                // one; it comes back, and by then it replays.
                                Err(e) if e.is_in_progress() => {
                                    in_progress.fetch_add(1, Ordering::SeqCst);
                                    AckKind::Nak(Some(Duration::from_millis(250)))
                                }
                                Err(e) => {
                                    eprintln!("charge {msg_id} failed: {e}");
                                    AckKind::Nak(None)
                                }
                            }
                        }
                    };
                    let _ = msg.ack_with(ack).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                });
            }
            _ = check.tick() => {
                if started.elapsed() > setup.deadline {
                    return Err(format!("not every message was acked within {:?}", setup.deadline).into());
                }
                let charged = gateway.charges.lock().unwrap().len();
                if charged == setup.messages && in_flight.load(Ordering::SeqCst) == 0 {
                    let info = stream.get_consumer::<pull::Config>("charges").await?.get_info().await?;
                    if info.num_ack_pending == 0 && info.num_pending == 0 {
                        break;
                    }
                }
            }
        }
    }
    report.elapsed = started.elapsed();
    report.charges = gateway.charges.lock().unwrap().clone();
    report.in_progress = in_progress.load(Ordering::SeqCst);
    report.replayed = replayed.load(Ordering::SeqCst);
    Ok(report)
}
