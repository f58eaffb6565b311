//! Messages per second through `idem::consume::Consumer` against the bare consumer on the same
//! source, on each broker whose URL is set (`IDEM_TEST_NATS_URL`, `IDEM_TEST_RABBITMQ_URL`,
//! `IDEM_TEST_MQTT_URL`), with the memory store and, with `IDEM_TEST_POSTGRES_URL`, the
//! PostgreSQL store. Paired: each round runs bare, memory and PostgreSQL one after the other on
//! fresh queues of `N` messages published beforehand (not timed); the figure is the median of
//! the rounds, the ratio idem / bare of the same round's medians.
//!
//! *Bare* takes the same adapter's deliveries with the same concurrency (8) and prefetch (32)
//! and acks each at once; the consumer keys each on its id, claims, runs a no-op handler,
//! stores the result and acks.
//!
//! `cargo bench -p idem-benches --bench consume`

use idem::consume::{mqtt, nats, rabbitmq, Consumer, Delivery, Source};
use idem::Idem;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

const N: usize = 2_000;
const ROUNDS: usize = 3;
const CONCURRENCY: usize = 8;
const PREFETCH: u16 = 32;

fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000_000;
    format!("b{}x{nanos}", std::process::id())
}

/// A broker: fills a fresh queue with `N` messages and returns the source that reads it.
trait Broker {
    async fn filled(&self) -> Box<dyn Source>;
}

struct Rabbit(String);

impl Broker for Rabbit {
    async fn filled(&self) -> Box<dyn Source> {
        let run = unique();
        let conn = rabbitmq::connect(&self.0).await.unwrap();
        let publisher = rabbitmq::Publisher::new(&conn).await.unwrap();
        let (queue, dead) = (
            format!("idem.bench.{run}"),
            format!("idem.bench.{run}.dead"),
        );
        rabbitmq::declare_quorum_queue(publisher.channel(), &queue)
            .await
            .unwrap();
        for i in 0..N {
            publisher
                .publish(&queue, &format!("m-{i}"), b"{\"amount\":1000}")
                .await
                .unwrap();
        }
        Box::new(rabbitmq::Queue::new(self.0.clone(), queue, dead))
    }
}

struct Nats(String);

impl Broker for Nats {
    async fn filled(&self) -> Box<dyn Source> {
        use nats::async_nats::jetstream::{self, consumer::pull, stream};
        let run = unique();
        let js = jetstream::new(nats::async_nats::connect(&self.0).await.unwrap());
        let subject = format!("idem.bench.{run}");
        let stream = js
            .create_stream(stream::Config {
                name: format!("IDEM_BENCH_{run}"),
                subjects: vec![subject.clone()],
                storage: stream::StorageType::Memory,
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut acks = Vec::with_capacity(N);
        for i in 0..N {
            let mut headers = nats::async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("m-{i}").as_str());
            acks.push(
                js.publish_with_headers(subject.clone(), headers, "{\"amount\":1000}".into())
                    .await
                    .unwrap(),
            );
        }
        for ack in acks {
            ack.await.unwrap();
        }
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some("bench".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .unwrap();
        Box::new(nats::JetStream::new(
            js,
            consumer,
            format!("{subject}.dead"),
        ))
    }
}

struct Mqtt(String, u16);

impl Broker for Mqtt {
    async fn filled(&self) -> Box<dyn Source> {
        use mqtt::rumqttc::v5::mqttbytes::v5::Packet;
        use mqtt::rumqttc::v5::mqttbytes::QoS;
        use mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
        let run = unique();
        let topic = format!("idem/bench/{run}");
        let mut options = MqttOptions::new(format!("{run}-c"), self.0.clone(), self.1);
        options.set_session_expiry_interval(Some(600));
        options.set_clean_start(false);
        // The consumer's session subscribes, then goes offline: the messages wait in it.
        let (client, mut events) = AsyncClient::new(options.clone(), 16);
        client
            .subscribe(topic.clone(), QoS::AtLeastOnce)
            .await
            .unwrap();
        loop {
            if let Ok(Event::Incoming(Packet::SubAck(_))) = events.poll().await {
                break;
            }
        }
        client.disconnect().await.unwrap();
        while events.poll().await.is_ok() {}
        let (publisher, mut events) = AsyncClient::new(
            MqttOptions::new(format!("{run}-p"), self.0.clone(), self.1),
            64,
        );
        let acked = Arc::new(AtomicUsize::new(0));
        let counter = acked.clone();
        let poller = tokio::spawn(async move {
            while let Ok(event) = events.poll().await {
                if let Event::Incoming(Packet::PubAck(_)) = event {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        for i in 0..N {
            mqtt::publish(
                &publisher,
                &topic,
                &format!("m-{i}"),
                &b"{\"amount\":1000}"[..],
            )
            .await
            .unwrap();
        }
        while acked.load(Ordering::SeqCst) < N {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        poller.abort();
        Box::new(mqtt::Subscription::new(
            options,
            topic.clone(),
            format!("{topic}/dead"),
        ))
    }
}

/// The bare consumer: every delivery acked at once, `CONCURRENCY` at a time.
async fn bare(mut source: Box<dyn Source>) -> Duration {
    source.start(PREFETCH).await.unwrap();
    let start = Instant::now();
    let slots = Arc::new(Semaphore::new(CONCURRENCY));
    let acked = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    while acked.load(Ordering::SeqCst) < N {
        let slot = slots.clone().acquire_owned().await.unwrap();
        let delivery: Box<dyn Delivery> =
            match tokio::time::timeout(Duration::from_millis(50), source.next()).await {
                Ok(Some(Ok(d))) => d,
                _ => continue,
            };
        let acked = acked.clone();
        tasks.spawn(async move {
            delivery.ack().await.unwrap();
            acked.fetch_add(1, Ordering::SeqCst);
            drop(slot);
        });
        while tasks.try_join_next().is_some() {}
    }
    start.elapsed()
}

/// The consumer on `idem`, with a no-op handler.
async fn through_idem(source: Box<dyn Source>, idem: &Idem) -> Duration {
    let consumer = Consumer::new(idem, unique())
        .concurrency(CONCURRENCY)
        .prefetch(PREFETCH);
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let start = Instant::now();
    let task =
        tokio::spawn(consumer.run(source, stopped, |_msg| async { Ok::<_, idem::Error>(()) }));
    while stats.processed() < N as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    elapsed
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn bench(name: &str, broker: &impl Broker, postgres: Option<&Idem>) {
    let memory = Idem::memory();
    let (mut b, mut m, mut p) = (Vec::new(), Vec::new(), Vec::new());
    let rate = |d: Duration| N as f64 / d.as_secs_f64();
    for _ in 0..ROUNDS {
        b.push(rate(bare(broker.filled().await).await));
        m.push(rate(through_idem(broker.filled().await, &memory).await));
        if let Some(pg) = postgres {
            p.push(rate(through_idem(broker.filled().await, pg).await));
        }
    }
    let bare = median(b);
    println!("| {name} | bare | {bare:.0} | 1.00 |");
    let memory = median(m);
    println!(
        "| {name} | memory store | {memory:.0} | {:.2} |",
        memory / bare
    );
    if !p.is_empty() {
        let pg = median(p);
        println!("| {name} | PostgreSQL store | {pg:.0} | {:.2} |", pg / bare);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else is read.
    let postgres = match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) => Some(Idem::postgres(&url).await.expect("the PostgreSQL store")),
        Err(_) => None,
    };
    println!("{N} messages a run, concurrency {CONCURRENCY}, prefetch {PREFETCH}, median of {ROUNDS} paired rounds");
    println!();
    println!("| broker | consumer | messages/s | / bare |");
    println!("|---|---|---|---|");
    if let Ok(url) = std::env::var("IDEM_TEST_RABBITMQ_URL") {
        bench("RabbitMQ (quorum queue)", &Rabbit(url), postgres.as_ref()).await;
    }
    if let Ok(url) = std::env::var("IDEM_TEST_NATS_URL") {
        bench("NATS JetStream", &Nats(url), postgres.as_ref()).await;
    }
    if let Ok(url) = std::env::var("IDEM_TEST_MQTT_URL") {
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let (host, port) = rest.rsplit_once(':').unwrap_or((rest, "1883"));
        let port = port.trim_end_matches('/').parse().unwrap();
        bench(
            "MQTT 5 (Mosquitto)",
            &Mqtt(host.to_owned(), port),
            postgres.as_ref(),
        )
        .await;
    }
}
