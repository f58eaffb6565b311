//! The outbox under `kill -9`: producer processes (an `#[idempotent(transaction = tx)]`
//! checkout that inserts the order and enqueues `order.placed`) and relay processes (to NATS
//! JetStream) are killed with SIGKILL at random points, over and over, while a consumer whose
//! handler is `#[idempotent]` on the message id counts its effects in its own table. Then a
//! recovery pass. Every committed order has exactly one message and exactly one effect, and
//! nothing uncommitted is ever delivered. The figures are printed (docs/outbox.md has a run's).

mod pg_common;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem::outbox::nats::NatsPublisher;
use idem::outbox::{Delivery, Message, Outbox, Publisher, Relay, RelayOptions};
use idem::store::postgres::PostgresOptions;
use idem::{idempotent, BoxError, Error, Idem};
use pg_common::*;
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ORDERS: usize = 1500;
const ROUNDS: u64 = 25;
const TEST: &str = "killed_producers_and_relays_lose_nothing_and_duplicate_nothing";
const WORKER: &str = "IDEM_OUTBOX_KILL_WORKER";

/// What a worker process is told: its role and the names of everything.
#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct Job {
    role: String,
    orders: String,
    outbox: String,
    records: String,
    prefix: String,
    /// One row per publish JetStream acknowledged.
    publishes: String,
}

impl Job {
    fn spawn(&self, role: &str) -> Child {
        let job = Job {
            role: role.into(),
            ..self.clone()
        };
        Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(WORKER, serde_json::to_string(&job).unwrap())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a worker process")
    }
}

/// The producer's business transaction: the order row and its message commit together.
#[idempotent(transaction = tx, key = order, store = idem, skip(outbox, orders), name = "checkout")]
async fn checkout(
    order: i64,
    idem: &Idem,
    outbox: &Outbox,
    orders: &str,
    tx: &mut Transaction<'_, Postgres>,
) -> Result<String, Error> {
    sqlx::query(&format!("INSERT INTO \"{orders}\" (id) VALUES ($1)"))
        .bind(order)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::store("postgres", "body", e))?;
    let placed = Message::json("order.placed", &order)?
        .ordering_key(format!("customer-{}", order % 7))
        .name("placed");
    Ok(outbox.enqueue(tx, placed).await?.id)
}

/// Every order once, in this process's own random order; replays for the ones done.
async fn produce(pg: &str, job: &Job) {
    let store = PostgresOptions::from_url(pg)
        .unwrap()
        .table(&job.records)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store.clone());
    let outbox = Outbox::with_table(store.pool().clone(), &job.outbox).unwrap();
    for order in Rng::new().shuffled(ORDERS) {
        // A conflict with another producer's transaction: try again until it is placed.
        loop {
            let mut tx = store.pool().begin().await.unwrap();
            match checkout(order as i64, &idem, &outbox, &job.orders, &mut tx).await {
                Ok(_) => {
                    if tx.commit().await.is_ok() {
                        break;
                    }
                }
                Err(_) => {
                    let _ = tx.rollback().await;
                }
            }
        }
    }
}

/// The NATS publisher, recording each publish JetStream acknowledged in the table `log`
/// (committed at once, before the relay's round commits; a kill can only lose the record of
/// the publish in flight).
struct Counting {
    inner: NatsPublisher,
    pool: PgPool,
    log: String,
}

impl Publisher for Counting {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            sqlx::query(&format!("INSERT INTO \"{}\" (id) VALUES ($1)", self.log))
                .bind(&message.id)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}

fn relay_of(pool: PgPool, job: &Job, js: jetstream::Context) -> Relay {
    let outbox = Outbox::with_table(pool.clone(), &job.outbox).unwrap();
    Relay::start(
        &outbox,
        Counting {
            inner: NatsPublisher::new(js).subject_prefix(&job.prefix),
            pool,
            log: job.publishes.clone(),
        },
        RelayOptions::default()
            .batch(8)
            .poll(Duration::from_millis(200)),
    )
}

async fn worker(pg: String, nats: String, job: Job) {
    match job.role.as_str() {
        "producer" => produce(&pg, &job).await,
        "relay" => {
            let pool = admin(&pg).await;
            let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
            let _relay = relay_of(pool, &job, js);
            // Until SIGKILL.
            std::future::pending::<()>().await;
        }
        role => panic!("unknown role {role}"),
    }
}

/// The consumer's effect, once per message id, in its own table.
#[idempotent(key = msg_id, store = idem, skip(pool, effects, order), name = "consumer")]
async fn consume(
    msg_id: String,
    order: i64,
    idem: &Idem,
    pool: &PgPool,
    effects: &str,
) -> Result<(), Error> {
    sqlx::query(&format!(
        "INSERT INTO \"{effects}\" (id, order_id) VALUES ($1, $2)"
    ))
    .bind(&msg_id)
    .bind(order)
    .execute(pool)
    .await
    .map_err(|e| Error::store("postgres", "effect", e))?;
    Ok(())
}

async fn killed_producers_and_relays_lose_nothing_and_duplicate_nothing(pg: String, nats: String) {
    if let Ok(json) = std::env::var(WORKER) {
        return worker(pg, nats, serde_json::from_str(&json).unwrap()).await;
    }
    let admin = admin(&pg).await;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let job = Job {
        role: String::new(),
        orders: unique_table("obxk_orders"),
        outbox: unique_table("obxk"),
        records: unique_table("obxk_rec"),
        prefix: format!("idem.outboxkill.{}.{nanos}.", std::process::id()),
        publishes: unique_table("obxk_pub"),
    };
    let effects = unique_table("obxk_fx");
    let consumer_records = unique_table("obxk_crec");
    // No key on the business and effect tables: a duplicate would show as a second row.
    for sql in [
        format!("CREATE TABLE \"{}\" (id bigint NOT NULL)", job.orders),
        format!("CREATE TABLE \"{effects}\" (id text NOT NULL, order_id bigint NOT NULL)"),
        format!("CREATE TABLE \"{}\" (id text NOT NULL)", job.publishes),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    Outbox::with_table(admin.clone(), &job.outbox)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    // The producers' store: its schema created before they start.
    PostgresOptions::from_url(&pg)
        .unwrap()
        .table(&job.records)
        .connect()
        .await
        .unwrap();

    let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
    let name = format!("IDEM_OUTBOX_KILL_{}_{nanos}", std::process::id());
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{}>", job.prefix)],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();

    // The consumer, in this process, from the start: a short ack_wait, and one delivery in
    // four left unacked after its effect (the consumer "crashed" before its ack), so the
    // broker redelivers and the idempotent handler absorbs the duplicate.
    let consumer_idem = Idem::from_store(
        PostgresOptions::from_url(&pg)
            .unwrap()
            .table(&consumer_records)
            .connect()
            .await
            .unwrap(),
    );
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("orders".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(300),
            ..Default::default()
        })
        .await
        .unwrap();
    let consuming = {
        let (admin, effects) = (admin.clone(), effects.clone());
        tokio::spawn(async move {
            let mut messages = consumer.messages().await.unwrap();
            let mut rng = Rng::new();
            let (mut deliveries, mut acked) = (0usize, HashSet::new());
            while acked.len() < ORDERS {
                let msg = messages.next().await.unwrap().unwrap();
                deliveries += 1;
                let id = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .expect("Nats-Msg-Id")
                    .as_str()
                    .to_string();
                let order: i64 = serde_json::from_slice(&msg.payload).unwrap();
                if consume(id.clone(), order, &consumer_idem, &admin, &effects)
                    .await
                    .is_err()
                {
                    continue; // in progress elsewhere or a failure: redelivered
                }
                if rng.below(4) == 0 && msg.info().unwrap().delivered == 1 {
                    continue;
                }
                msg.ack().await.unwrap();
                acked.insert(id);
            }
            deliveries
        })
    };

    // The kills: two producers and two relays, SIGKILLed after a random pause (30 to 330 ms),
    // 25 times.
    let killer = {
        let job = job.clone();
        tokio::task::spawn_blocking(move || {
            let mut rng = Rng::new();
            for _ in 0..ROUNDS {
                let children: Vec<Child> = ["producer", "producer", "relay", "relay"]
                    .iter()
                    .map(|role| job.spawn(role))
                    .collect();
                std::thread::sleep(Duration::from_millis(30 + rng.below(300)));
                for mut c in children {
                    c.kill().expect("SIGKILL"); // SIGKILL on Unix
                    let _ = c.wait();
                }
            }
        })
    };
    killer.await.unwrap();
    let placed_under_kills: i64 =
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"{}\"", job.orders))
            .fetch_one(&admin)
            .await
            .unwrap();

    // Recovery: one producer and one relay that are not killed.
    let mut producer = job.spawn("producer");
    let relay = relay_of(admin.clone(), &job, js.clone());
    assert!(producer.wait().unwrap().success(), "the recovery producer");
    let deliveries = tokio::time::timeout(Duration::from_secs(300), consuming)
        .await
        .expect("the consumer got every committed order within 5 minutes")
        .unwrap();
    relay.stop().await;

    let count = |sql: String| {
        let admin = admin.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&admin)
                .await
                .unwrap()
        }
    };
    let orders = count(format!("SELECT count(*) FROM \"{}\"", job.orders)).await;
    let distinct_orders = count(format!("SELECT count(DISTINCT id) FROM \"{}\"", job.orders)).await;
    let messages = count(format!("SELECT count(*) FROM \"{}\"", job.outbox)).await;
    let delivered = count(format!(
        "SELECT count(*) FROM \"{}\" WHERE status = 1",
        job.outbox
    ))
    .await;
    let attempts = count(format!(
        "SELECT coalesce(sum(attempts), 0) FROM \"{}\"",
        job.outbox
    ))
    .await;
    let effect_rows = count(format!("SELECT count(*) FROM \"{effects}\"")).await;
    let effect_orders = count(format!(
        "SELECT count(DISTINCT order_id) FROM \"{effects}\""
    ))
    .await;
    // Nothing uncommitted delivered: every effect is of an order that committed.
    let orphans = count(format!(
        "SELECT count(*) FROM \"{effects}\" e WHERE NOT EXISTS \
         (SELECT 1 FROM \"{}\" o WHERE o.id = e.order_id)",
        job.orders
    ))
    .await;
    let publishes = count(format!("SELECT count(*) FROM \"{}\"", job.publishes)).await;
    let published_ids = count(format!(
        "SELECT count(DISTINCT id) FROM \"{}\"",
        job.publishes
    ))
    .await;
    let mut stream = stream;
    let stored = stream.info().await.unwrap().state.messages;
    println!(
        "outbox kill -9: {ROUNDS} rounds of 2 producers + 2 relays killed; {placed_under_kills} \
         orders placed under kills; orders committed {orders}, messages {messages}, delivered \
         {delivered}, published by the relays {publishes} (re-published after a kill {}), \
         stored by JetStream {stored}, consumer deliveries {deliveries}, effects \
         {effect_rows}, duplicates absorbed by the consumer {}, lost {}",
        publishes - published_ids,
        deliveries as i64 - effect_rows,
        orders - effect_orders
    );

    assert!(
        placed_under_kills > 0,
        "the producers got work done before the kills"
    );
    assert_eq!((orders, distinct_orders), (ORDERS as i64, ORDERS as i64));
    assert_eq!(messages, ORDERS as i64, "one message per committed order");
    assert_eq!(delivered, ORDERS as i64);
    assert!(attempts >= ORDERS as i64);
    assert_eq!(
        stored, ORDERS as u64,
        "JetStream deduplicated by Nats-Msg-Id"
    );
    assert_eq!(orphans, 0, "nothing uncommitted was delivered");
    assert_eq!(
        (effect_rows, effect_orders),
        (ORDERS as i64, ORDERS as i64),
        "every committed order processed exactly once"
    );
    assert!(deliveries > ORDERS, "the consumer absorbed redeliveries");
    assert_eq!(published_ids, ORDERS as i64, "every message published");

    js.delete_stream(&name).await.unwrap();
    for t in [
        &job.orders,
        &job.outbox,
        &job.records,
        &effects,
        &consumer_records,
        &job.publishes,
    ] {
        drop_table(&admin, t).await;
    }
}

idem_integration::server_tests! {
    POSTGRES_AND_NATS => [
        killed_producers_and_relays_lose_nothing_and_duplicate_nothing,
    ],
}
