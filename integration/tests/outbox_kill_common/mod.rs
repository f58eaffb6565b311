//! The outbox under `kill -9`, whatever the database (`outbox_kill.rs` on PostgreSQL,
//! `outbox_kill_mysql.rs` on MySQL / MariaDB): producer processes (an
//! `#[idempotent(transaction = tx)]` checkout that inserts the order and enqueues
//! `order.placed`) and relay processes (to NATS JetStream) are killed with SIGKILL at random
//! points, over and over, while a consumer whose handler is `#[idempotent]` on the message id
//! counts its effects in its own table. Then a recovery pass. Every committed order has exactly
//! one message and exactly one effect, and nothing uncommitted is ever delivered. The figures are
//! printed (docs/outbox.md has a run's).
//!
//! What depends on the database is a [`Backend`]: its store, its outbox, its checkout (the
//! `#[idempotent(transaction = tx)]` function, which names its transaction's type). The test's
//! own tables (orders, effects, the log of publishes) are read and written through sqlx's `Any`
//! driver with the [`Sql`] dialect's quoting and parameters.
#![allow(dead_code)]

#[path = "../outbox_db/mod.rs"]
pub mod outbox_db;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem::outbox::nats::NatsPublisher;
use idem::outbox::{Delivery, Message, Outbox, Publisher, Relay, RelayOptions};
use idem::{idempotent, BoxError, Error, Idem};
use sqlx::pool::PoolOptions;
use sqlx::{AnyPool, Pool, Transaction};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_db::sql_common;
pub use outbox_db::{OutboxDb, Sql};
use sql_common::{any_admin, drop_tables, unique_table, Rng};

/// The variable a worker process finds its [`Job`] in.
const WORKER: &str = "IDEM_OUTBOX_KILL_WORKER";

/// What differs between the databases.
pub trait Backend: OutboxDb {
    /// The first part of every table name of a run.
    const PREFIX: &'static str;
    /// How many orders.
    const ORDERS: usize;
    /// How many rounds of kills.
    const ROUNDS: u64;

    /// The producer's business transaction, on `tx`: the order row in `orders` and its
    /// `order.placed` message (built by [`placed`]) commit together; the message's id.
    fn checkout<'a>(
        order: i64,
        idem: &'a Idem,
        outbox: &'a Outbox<Self::Db>,
        orders: &'a str,
        tx: &'a mut Transaction<'static, Self::Db>,
    ) -> impl Future<Output = Result<String, Error>> + 'a;
}

/// The message of a checkout.
pub fn placed(order: i64) -> Result<Message, Error> {
    Ok(Message::json("order.placed", &order)?
        .ordering_key(format!("customer-{}", order % 7))
        .name("placed"))
}

/// The statement inserting a row of one column, `id` (the first parameter), into `table`: an
/// order, the record of a publish.
pub fn insert_id(sql: Sql, table: &str) -> String {
    format!(
        "INSERT INTO {} (id) VALUES ({})",
        sql.quote(table),
        sql.param(1)
    )
}

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
    fn spawn(&self, test: &str, role: &str) -> Child {
        let job = Job {
            role: role.into(),
            ..self.clone()
        };
        Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(WORKER, serde_json::to_string(&job).unwrap())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a worker process")
    }
}

/// A pool of the outbox's database for a relay.
async fn pool<B: Backend>(url: &str) -> Pool<B::Db> {
    PoolOptions::<B::Db>::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("a connection to the outbox's database")
}

/// Every order once, in this process's own random order; replays for the ones done.
async fn produce<B: Backend>(url: &str, job: &Job) {
    let (idem, pool) = B::store(url, &job.records).await;
    let outbox = B::outbox(pool.clone(), &job.outbox).unwrap();
    for order in Rng::new().shuffled(B::ORDERS) {
        // A conflict with another producer's transaction: try again until it is placed.
        loop {
            let mut tx = pool.begin().await.unwrap();
            match B::checkout(order as i64, &idem, &outbox, &job.orders, &mut tx).await {
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
    pool: AnyPool,
    insert: String,
}

impl Publisher for Counting {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            sqlx::query(&self.insert)
                .bind(&message.id)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}

fn relay_of<B: Backend>(
    pool: Pool<B::Db>,
    log: AnyPool,
    job: &Job,
    js: jetstream::Context,
) -> Relay {
    let outbox = B::outbox(pool, &job.outbox).unwrap();
    Relay::start(
        &outbox,
        Counting {
            inner: NatsPublisher::new(js).subject_prefix(&job.prefix),
            pool: log,
            insert: insert_id(B::SQL, &job.publishes),
        },
        RelayOptions::default()
            .batch(8)
            .poll(Duration::from_millis(200)),
    )
}

async fn worker<B: Backend>(url: String, nats: String, job: Job) {
    match job.role.as_str() {
        "producer" => produce::<B>(&url, &job).await,
        "relay" => {
            let js = jetstream::new(async_nats::connect(&nats).await.unwrap());
            let _relay = relay_of::<B>(pool::<B>(&url).await, any_admin(&url).await, &job, js);
            // Until SIGKILL.
            std::future::pending::<()>().await;
        }
        role => panic!("unknown role {role}"),
    }
}

/// The consumer's effect, once per message id, in its own table.
#[idempotent(key = msg_id, store = idem, skip(sql, pool, effects, order), name = "consumer")]
async fn consume(
    msg_id: String,
    order: i64,
    idem: &Idem,
    sql: Sql,
    pool: &AnyPool,
    effects: &str,
) -> Result<(), Error> {
    sqlx::query(&format!(
        "INSERT INTO {} (id, order_id) VALUES ({}, {})",
        sql.quote(effects),
        sql.param(1),
        sql.param(2)
    ))
    .bind(&msg_id)
    .bind(order)
    .execute(pool)
    .await
    .map_err(|e| Error::store(sql.name(), "effect", e))?;
    Ok(())
}

/// The test: in a worker process (the test `test` of this binary started by [`Job::spawn`]) its
/// role; in the test process, the kills, the recovery and the assertions.
pub async fn run<B: Backend>(test: &str, url: String, nats: String) {
    if let Ok(json) = std::env::var(WORKER) {
        return worker::<B>(url, nats, serde_json::from_str(&json).unwrap()).await;
    }
    let (sql, orders_n, rounds) = (B::SQL, B::ORDERS, B::ROUNDS);
    let q = |t: &str| sql.quote(t);
    let admin = any_admin(&url).await;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let table = |what: &str| unique_table(&format!("{}_{what}", B::PREFIX));
    let job = Job {
        role: String::new(),
        orders: table("orders"),
        outbox: table("ob"),
        records: table("rec"),
        prefix: format!("idem.outboxkill.{}.{nanos}.", std::process::id()),
        publishes: table("pub"),
    };
    let effects = table("fx");
    let consumer_records = table("crec");
    // No key on the business and effect tables: a duplicate would show as a second row.
    for ddl in [
        format!("CREATE TABLE {} (id BIGINT NOT NULL)", q(&job.orders)),
        format!(
            "CREATE TABLE {} (id VARCHAR(255) NOT NULL, order_id BIGINT NOT NULL)",
            q(&effects)
        ),
        format!(
            "CREATE TABLE {} (id VARCHAR(255) NOT NULL)",
            q(&job.publishes)
        ),
    ] {
        sqlx::query(&ddl).execute(&admin).await.unwrap();
    }
    let outbox_pool = pool::<B>(&url).await;
    B::outbox(outbox_pool.clone(), &job.outbox)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    // The producers' store: its schema created before they start.
    B::store(&url, &job.records).await;

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
    let (consumer_idem, _) = B::store(&url, &consumer_records).await;
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
            while acked.len() < orders_n {
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
                if consume(id.clone(), order, &consumer_idem, sql, &admin, &effects)
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
    // `rounds` times.
    let killer = {
        let (job, test) = (job.clone(), test.to_string());
        tokio::task::spawn_blocking(move || {
            let mut rng = Rng::new();
            for _ in 0..rounds {
                let children: Vec<Child> = ["producer", "producer", "relay", "relay"]
                    .iter()
                    .map(|role| job.spawn(&test, role))
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
    let count = |query: String| {
        let admin = admin.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&query)
                .fetch_one(&admin)
                .await
                .unwrap_or_else(|e| panic!("{query}: {e}"))
        }
    };
    let placed_under_kills = count(format!("SELECT COUNT(*) FROM {}", q(&job.orders))).await;

    // Recovery: one producer and one relay that are not killed.
    let mut producer = job.spawn(test, "producer");
    let relay = relay_of::<B>(outbox_pool, admin.clone(), &job, js.clone());
    assert!(producer.wait().unwrap().success(), "the recovery producer");
    let deliveries = tokio::time::timeout(Duration::from_secs(300), consuming)
        .await
        .expect("the consumer got every committed order within 5 minutes")
        .unwrap();
    relay.stop().await;

    let orders = count(format!("SELECT COUNT(*) FROM {}", q(&job.orders))).await;
    let distinct_orders = count(format!("SELECT COUNT(DISTINCT id) FROM {}", q(&job.orders))).await;
    let messages = count(format!("SELECT COUNT(*) FROM {}", q(&job.outbox))).await;
    let delivered = count(format!(
        "SELECT COUNT(*) FROM {} WHERE status = 1",
        q(&job.outbox)
    ))
    .await;
    // A sum is DECIMAL on MySQL, which the `Any` driver does not read.
    let attempts = count(format!(
        "SELECT CAST(COALESCE(SUM(attempts), 0) AS {}) FROM {}",
        match sql {
            Sql::Postgres => "BIGINT",
            Sql::Mysql => "SIGNED",
        },
        q(&job.outbox)
    ))
    .await;
    let effect_rows = count(format!("SELECT COUNT(*) FROM {}", q(&effects))).await;
    let effect_orders = count(format!(
        "SELECT COUNT(DISTINCT order_id) FROM {}",
        q(&effects)
    ))
    .await;
    // Nothing uncommitted delivered: every effect is of an order that committed.
    let orphans = count(format!(
        "SELECT COUNT(*) FROM {} e WHERE NOT EXISTS \
         (SELECT 1 FROM {} o WHERE o.id = e.order_id)",
        q(&effects),
        q(&job.orders)
    ))
    .await;
    let publishes = count(format!("SELECT COUNT(*) FROM {}", q(&job.publishes))).await;
    let published_ids = count(format!(
        "SELECT COUNT(DISTINCT id) FROM {}",
        q(&job.publishes)
    ))
    .await;
    let mut stream = stream;
    let stored = stream.info().await.unwrap().state.messages;
    println!(
        "outbox kill -9 ({}): {rounds} rounds of 2 producers + 2 relays killed; \
         {placed_under_kills} orders placed under kills; orders committed {orders}, messages \
         {messages}, delivered {delivered}, published by the relays {publishes} (re-published \
         after a kill {}), stored by JetStream {stored}, consumer deliveries {deliveries}, \
         effects {effect_rows}, duplicates absorbed by the consumer {}, lost {}",
        sql.name(),
        publishes - published_ids,
        deliveries as i64 - effect_rows,
        orders - effect_orders
    );

    let n = orders_n as i64;
    assert!(
        placed_under_kills > 0,
        "the producers got work done before the kills"
    );
    assert_eq!((orders, distinct_orders), (n, n));
    assert_eq!(messages, n, "one message per committed order");
    assert_eq!(delivered, n);
    assert!(attempts >= n);
    assert_eq!(
        stored, orders_n as u64,
        "JetStream deduplicated by Nats-Msg-Id"
    );
    assert_eq!(orphans, 0, "nothing uncommitted was delivered");
    assert_eq!(
        (effect_rows, effect_orders),
        (n, n),
        "every committed order processed exactly once"
    );
    assert!(deliveries > orders_n, "the consumer absorbed redeliveries");
    assert_eq!(published_ids, n, "every message published");

    js.delete_stream(&name).await.unwrap();
    let mut tables = vec![job.orders.clone(), effects, job.publishes.clone()];
    for t in [&job.outbox, &job.records, &consumer_records] {
        tables.push(t.clone());
        tables.push(format!("{t}_migrations"));
    }
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    drop_tables(sql, &admin, &tables).await;
}
