//! The outbox end to end on a real PostgreSQL and NATS JetStream: a relay killed mid-delivery
//! leaves its messages pending, another relay publishes them again (at least once), JetStream
//! drops the copies by `Nats-Msg-Id`, and a consumer whose handler is `#[idempotent]` on the
//! message id runs its effect once per message even when the broker redelivers.

mod pg_common;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem::outbox::nats::NatsPublisher;
use idem::outbox::{Delivery, Message, Outbox, Publisher, Relay, RelayOptions};
use idem::store::postgres::PostgresOptions;
use idem::{idempotent, BoxError, Error, Idem};
use pg_common::*;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// The NATS publisher, counting publishes per id; from the `crash_at`-th publish on, it
/// publishes and then never returns (the process died before it could mark the message
/// delivered), after telling the test.
struct Crashing {
    inner: NatsPublisher,
    published: Arc<Mutex<HashMap<String, usize>>>,
    calls: AtomicUsize,
    crash_at: usize,
    crashed: Arc<Notify>,
}

impl Publisher for Crashing {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            *self
                .published
                .lock()
                .unwrap()
                .entry(message.id.clone())
                .or_default() += 1;
            if self.calls.fetch_add(1, Ordering::SeqCst) + 1 >= self.crash_at {
                self.crashed.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

/// The consumer's effect, at most once per message id: one row per run in `effects`.
#[idempotent(key = msg_id, store = idem, skip(pool, table), name = "outbox.consumer")]
async fn handle(msg_id: String, idem: &Idem, pool: &PgPool, table: &str) -> Result<(), Error> {
    sqlx::query(&format!("INSERT INTO \"{table}\" (id) VALUES ($1)"))
        .bind(&msg_id)
        .execute(pool)
        .await
        .map_err(|e| Error::store("postgres", "effect", e))?;
    Ok(())
}

async fn a_killed_relay_redelivers_and_the_consumer_runs_once(pg: String, nats: String) {
    const MESSAGES: usize = 20;
    let admin = admin(&pg).await;
    let table = unique_table("obxn");
    let effects = unique_table("obxfx");
    let records = unique_table("obxnrec");
    sqlx::query(&format!("CREATE TABLE \"{effects}\" (id text NOT NULL)"))
        .execute(&admin)
        .await
        .unwrap();
    let outbox = Outbox::with_table(admin.clone(), &table)
        .unwrap()
        .migrate()
        .await
        .unwrap();

    let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("IDEM_OUTBOX_{}_{nanos}", std::process::id());
    let prefix = format!("idem.outbox.{}.{nanos}.", std::process::id());
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}>")],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();

    let mut tx = admin.begin().await.unwrap();
    for i in 0..MESSAGES {
        outbox
            .enqueue(
                &mut tx,
                Message::json("order.placed", &serde_json::json!({ "n": i }))
                    .unwrap()
                    .ordering_key(format!("order-{}", i % 4))
                    .id(format!("msg-{i}")),
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();

    // Relay 1, on a pool of its own, dies after publishing its 6th message (mid-round: the
    // round's messages are published but not marked delivered).
    let pool1 = PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg)
        .await
        .unwrap();
    let outbox1 = Outbox::with_table(pool1.clone(), &table).unwrap();
    let published = Arc::new(Mutex::new(HashMap::new()));
    let crashed = Arc::new(Notify::new());
    let relay1 = Relay::start(
        &outbox1,
        Crashing {
            inner: NatsPublisher::new(js.clone()).subject_prefix(&prefix),
            published: published.clone(),
            calls: AtomicUsize::new(0),
            crash_at: 6,
            crashed: crashed.clone(),
        },
        RelayOptions::default(),
    );
    crashed.notified().await;
    relay1.abort();
    // The process is gone: so are its connections, and its transaction with them.
    pool1.close().await;

    let relay2 = Relay::start(
        &outbox,
        Crashing {
            inner: NatsPublisher::new(js.clone()).subject_prefix(&prefix),
            published: published.clone(),
            calls: AtomicUsize::new(0),
            crash_at: usize::MAX,
            crashed: Arc::new(Notify::new()),
        },
        RelayOptions::default(),
    );
    for _ in 0..3000 {
        let delivered: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{table}\" WHERE status = 1"
        ))
        .fetch_one(&admin)
        .await
        .unwrap();
        if delivered == MESSAGES as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay2.stop().await;

    let published = published.lock().unwrap().clone();
    let publishes: usize = published.values().sum();
    assert_eq!(
        published.len(),
        MESSAGES,
        "every committed message was published"
    );
    assert!(
        publishes > MESSAGES,
        "the killed relay's round was published again: {publishes} publishes"
    );
    // JetStream dropped the copies: they carried the same Nats-Msg-Id.
    let mut stream = stream;
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        MESSAGES as u64,
        "JetStream deduplicated by Nats-Msg-Id"
    );

    // The consumer: the first delivery of each message runs the effect and "crashes" before
    // its ack, so the broker redelivers it; the redelivery replays and acks.
    let store = PostgresOptions::from_url(&pg)
        .unwrap()
        .table(&records)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("orders".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(500),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut deliveries = 0;
    let mut acked = 0;
    while acked < MESSAGES {
        let msg = messages.next().await.unwrap().unwrap();
        deliveries += 1;
        let id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .expect("the relay set Nats-Msg-Id")
            .as_str()
            .to_string();
        handle(id, &idem, &admin, &effects).await.unwrap();
        if msg.info().unwrap().delivered >= 2 {
            msg.ack().await.unwrap();
            acked += 1;
        }
    }
    let runs: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT id, count(*) FROM \"{effects}\" GROUP BY id"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert!(deliveries >= 2 * MESSAGES, "{deliveries} deliveries");
    assert_eq!(runs.len(), MESSAGES, "every message had its effect");
    assert!(
        runs.iter().all(|(_, n)| *n == 1),
        "an effect ran twice: {runs:?}"
    );
    println!(
        "{MESSAGES} committed, {publishes} publishes by the relays, {} stored by JetStream, \
         {deliveries} deliveries to the consumer, {} effects",
        MESSAGES,
        runs.len()
    );

    js.delete_stream(&name).await.unwrap();
    for t in [&table, &effects, &records] {
        drop_table(&admin, t).await;
    }
}

idem_integration::server_tests! {
    POSTGRES_AND_NATS => [
        a_killed_relay_redelivers_and_the_consumer_runs_once,
    ],
}
