//! The transactional outbox's scenarios, whatever the database (`outbox_postgres.rs` on
//! PostgreSQL, `outbox_mysql.rs` on MySQL / MariaDB): what a transaction enqueues is sent if and
//! only if it commits, a retried call enqueues once, relays share the work and keep the order of
//! each key, a failing publisher is retried and then dead-lettered, delivered messages are
//! purged, a relay does not spin on a message another relay holds.
//!
//! Each scenario is written once, generic over a [`Backend`]: what depends on the database (its
//! pools and outbox, the test's own SQL on the outbox's table, the `#[idempotent]` functions,
//! which name their database's types, and the checks only one database has). [`scenarios!`]
//! makes a binary's `main` of them: one test per scenario.
#![allow(dead_code)]

#[path = "../outbox_db/mod.rs"]
pub mod outbox_db;

use idem::outbox::{Delivery, Message, Outbox, OutboxDatabase, Publisher, Relay, RelayOptions};
use idem::{idempotent, BoxError, Error, Idem};
use sqlx::pool::PoolOptions;
use sqlx::{AnyPool, Pool, Transaction};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_db::sql_common;
pub use outbox_db::{OutboxDb, Sql};
use sql_common::{any_admin, drop_tables};

/// What differs between the databases.
pub trait Backend: OutboxDb {
    /// The first part of every table name (MySQL's stay under idem's limit of 48 bytes).
    const PREFIX: &'static str;
    /// How the test reads the `last_error` column.
    const LAST_ERROR: &'static str;

    /// `#[idempotent(transaction = tx, key = order, store = idem, skip(outbox))]` over
    /// [`place_in_tx`].
    fn place_in_tx<'a>(
        order: &'a str,
        idem: &'a Idem,
        outbox: &'a Outbox<Self::Db>,
        tx: &'a mut Transaction<'static, Self::Db>,
    ) -> impl Future<Output = Result<String, Error>> + 'a;

    /// What [`enqueue_outside_a_transaction_is_refused`] checks on this database only, on the
    /// fresh outbox of `s` (empty afterwards).
    fn refusals_of_this_database(s: &Setup<Self>) -> impl Future<Output = ()>;
}

/// The `main` of a binary: a test function per scenario, each running it on `$backend`, all
/// behind `$need` (the `server_tests!` group of that database). The list of scenarios is here
/// only, so a scenario written above runs on every database or fails to compile.
macro_rules! scenarios {
    ($backend:ty, $need:ident) => {
        outbox_common::scenarios!(@each $backend, $need;
            only_committed_messages_are_sent,
            enqueue_outside_a_transaction_is_refused,
            a_retried_call_enqueues_once,
            two_relays_share_the_work_in_order,
            three_relays_with_failures_keep_each_keys_order,
            a_failing_publisher_is_retried_then_dead_lettered,
            delivered_messages_are_purged,
            a_relay_does_not_spin_on_a_message_another_relay_holds,
        );
    };
    (@each $backend:ty, $need:ident; $($name:ident),* $(,)?) => {
        $(
            async fn $name(url: String) {
                outbox_common::$name::<$backend>(url).await
            }
        )*
        idem_integration::server_tests! {
            $need => [$($name),*],
        }
    };
}
pub(crate) use scenarios;

/// What a publisher was handed: (relay name, delivery).
#[derive(Clone, Default)]
struct Recorder {
    name: &'static str,
    seen: Arc<Mutex<Vec<(&'static str, Delivery)>>>,
    /// Fail the first this-many publishes.
    fail_first: Arc<AtomicUsize>,
}

impl Publisher for Recorder {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            let failing = self
                .fail_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Err("the broker said no".into());
            }
            self.seen.lock().unwrap().push((self.name, message.clone()));
            Ok(())
        })
    }
}

impl Recorder {
    fn named(name: &'static str, seen: &Arc<Mutex<Vec<(&'static str, Delivery)>>>) -> Self {
        Recorder {
            name,
            seen: seen.clone(),
            fail_first: Default::default(),
        }
    }
    fn ids(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, d)| d.id.clone())
            .collect()
    }
}

/// A new outbox on a table of its own, and the pools of the test's own statements.
pub struct Setup<B: Backend> {
    /// A pool of the outbox's database: the outbox's, and the producers' transactions.
    pub admin: Pool<B::Db>,
    /// The same database through sqlx's `Any` driver, for the test's own statements on the
    /// outbox's table, written in [`Backend::SQL`].
    any: AnyPool,
    pub outbox: Outbox<B::Db>,
    pub table: String,
}

/// A table name no other test, process or run uses.
fn unique_table<B: Backend>(prefix: &str) -> String {
    sql_common::unique_table(&format!("{}{prefix}", B::PREFIX))
}

async fn setup<B: Backend>(url: &str) -> Setup<B> {
    let admin = PoolOptions::<B::Db>::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("admin connection");
    let table = unique_table::<B>("obx");
    let outbox = B::outbox(admin.clone(), &table)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    Setup {
        admin,
        any: any_admin(url).await,
        outbox,
        table,
    }
}

impl<B: Backend> Setup<B> {
    /// The outbox's table, quoted.
    fn quoted(&self) -> String {
        B::SQL.quote(&self.table)
    }
    /// How many messages have `status`.
    pub async fn count(&self, status: i16) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE status = {}",
            self.quoted(),
            B::SQL.param(1)
        ))
        .bind(status)
        .fetch_one(&self.any)
        .await
        .unwrap()
    }
    /// How many messages.
    pub async fn all(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", self.quoted()))
            .fetch_one(&self.any)
            .await
            .unwrap()
    }
    /// The attempts and the last error of the dead letter `id`.
    async fn dead_letter(&self, id: &str) -> (i32, String) {
        sqlx::query_as(&format!(
            "SELECT attempts, {} FROM {} WHERE id = {} AND status = 2",
            B::LAST_ERROR,
            self.quoted(),
            B::SQL.param(1)
        ))
        .bind(id)
        .fetch_one(&self.any)
        .await
        .unwrap()
    }
    /// What a relay mid-publish holds: the row lock of message `id`, until the transaction ends.
    async fn lock(&self, id: &str) -> sqlx::Transaction<'static, sqlx::Any> {
        let mut holder = self.any.begin().await.unwrap();
        sqlx::query(&format!(
            "SELECT id FROM {} WHERE id = {} FOR UPDATE",
            self.quoted(),
            B::SQL.param(1)
        ))
        .bind(id)
        .execute(&mut *holder)
        .await
        .unwrap();
        holder
    }
    /// Drops `table` (a store's or an outbox's) and its version table.
    async fn drop_table(&self, table: &str) {
        let migrations = format!("{table}_migrations");
        drop_tables(B::SQL, &self.any, &[table, &migrations]).await;
    }
    /// Waits until `n` messages are delivered (the relays run in the background).
    async fn until_delivered(&self, n: i64) {
        for _ in 0..3000 {
            if self.count(1).await >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} messages were not delivered within 30 s");
    }
    async fn cleanup(self) {
        self.drop_table(&self.table).await;
    }
}

/// A rolled-back transaction sends nothing; a committed one is delivered with its payload,
/// topic, ordering key and headers.
pub async fn only_committed_messages_are_sent<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let publisher = Recorder::default();
    let options = RelayOptions::default();

    let mut tx = s.admin.begin().await.unwrap();
    s.outbox
        .enqueue(
            &mut tx,
            Message::new("orders.placed", b"rolled back".to_vec()),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        Relay::deliver_once(&s.outbox, &publisher, &options)
            .await
            .unwrap(),
        0
    );
    assert!(publisher.ids().is_empty());

    let mut tx = s.admin.begin().await.unwrap();
    let enqueued = s
        .outbox
        .enqueue(
            &mut tx,
            Message::json("orders.placed", &serde_json::json!({"order": 42}))
                .unwrap()
                .ordering_key("order-42")
                .header("trace", "t-1"),
        )
        .await
        .unwrap();
    assert!(enqueued.new);
    // Not committed yet: invisible to the relay.
    assert_eq!(
        Relay::deliver_once(&s.outbox, &publisher, &options)
            .await
            .unwrap(),
        0
    );
    tx.commit().await.unwrap();
    assert_eq!(
        Relay::deliver_once(&s.outbox, &publisher, &options)
            .await
            .unwrap(),
        1
    );
    let seen = publisher.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let d = &seen[0].1;
    assert_eq!(d.id, enqueued.id);
    assert_eq!(d.topic, "orders.placed");
    assert_eq!(d.ordering_key, "order-42");
    assert_eq!(d.payload, br#"{"order":42}"#);
    assert_eq!(d.headers["trace"], "t-1");
    assert_eq!(d.headers["content-type"], "application/json");
    assert_eq!(d.attempt, 1);
    // Delivered: not sent again.
    assert_eq!(
        Relay::deliver_once(&s.outbox, &publisher, &options)
            .await
            .unwrap(),
        0
    );
    s.cleanup().await;
}

/// A connection outside a transaction is refused: the message would commit on its own.
pub async fn enqueue_outside_a_transaction_is_refused<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let mut conn = s.admin.acquire().await.unwrap();
    let err = s
        .outbox
        .enqueue(&mut conn, Message::new("t", Vec::new()))
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err:?}");
    assert_eq!(s.all().await, 0);
    assert!(B::outbox(s.admin.clone(), "bad;name")
        .unwrap_err()
        .is_config());
    B::refusals_of_this_database(&s).await;
    s.cleanup().await;
}

/// How many times [`place_and_fail_once`] ran.
static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

/// An ordinary idempotent call whose body commits its own transaction with two messages and
/// then fails: the retry runs the body again and enqueues the same two ids, so nothing twice.
#[idempotent(key = order, store = idem, skip(outbox, sql))]
async fn place_and_fail_once<Db: OutboxDatabase>(
    order: &str,
    idem: &Idem,
    outbox: &Outbox<Db>,
    sql: Sql,
) -> Result<Vec<bool>, Error> {
    let db = |e| Error::store(sql.name(), "body", e);
    let mut tx = outbox.pool().begin().await.map_err(db)?;
    let a = outbox
        .enqueue(
            &mut tx,
            Message::new("orders.placed", order.as_bytes().to_vec()),
        )
        .await?;
    let b = outbox
        .enqueue(
            &mut tx,
            Message::new("orders.audit", order.as_bytes().to_vec()),
        )
        .await?;
    tx.commit().await.map_err(db)?;
    if ATTEMPTS.fetch_add(1, Ordering::SeqCst) == 0 {
        // The crash window: the messages are committed, the call is not finished.
        return Err(Error::Config("crashed after the commit".into()));
    }
    Ok(vec![a.new, b.new])
}

/// The body of the transactional mode (`Backend::place_in_tx`): the messages commit with the
/// idempotency record.
pub async fn place_in_tx<Db: OutboxDatabase>(
    order: &str,
    outbox: &Outbox<Db>,
    tx: &mut Transaction<'_, Db>,
) -> Result<String, Error> {
    let m = outbox
        .enqueue(
            &mut *tx,
            Message::new("orders.placed", order.as_bytes().to_vec()).name("placed"),
        )
        .await?;
    Ok(m.id)
}

pub async fn a_retried_call_enqueues_once<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let records = unique_table::<B>("obxrec");
    let (idem, pool) = B::store(&url, &records).await;

    let first = place_and_fail_once("o-1", &idem, &s.outbox, B::SQL).await;
    assert!(first.is_err());
    assert_eq!(s.all().await, 2);
    let again = place_and_fail_once("o-1", &idem, &s.outbox, B::SQL)
        .await
        .unwrap();
    assert_eq!(
        again,
        vec![false, false],
        "the retry's messages were already there"
    );
    assert_eq!(s.all().await, 2, "a retried call enqueues once");
    // Another logical call: other ids.
    place_and_fail_once("o-2", &idem, &s.outbox, B::SQL)
        .await
        .unwrap();
    assert_eq!(s.all().await, 4);

    // The transactional mode: a rolled-back attempt leaves nothing, the committed one a
    // message whose id does not depend on the attempt; the replay enqueues nothing.
    let mut tx = pool.begin().await.unwrap();
    let rolled = B::place_in_tx("o-3", &idem, &s.outbox, &mut tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(s.all().await, 4);
    let mut tx = pool.begin().await.unwrap();
    let id = B::place_in_tx("o-3", &idem, &s.outbox, &mut tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        id, rolled,
        "the id is the logical call's, not the attempt's"
    );
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        B::place_in_tx("o-3", &idem, &s.outbox, &mut tx)
            .await
            .unwrap(),
        id
    );
    tx.commit().await.unwrap();
    assert_eq!(s.all().await, 5);

    s.drop_table(&records).await;
    s.cleanup().await;
}

/// Two relays on one outbox: every message published exactly once (nothing crashed), and
/// the messages of each key in the order they were enqueued.
pub async fn two_relays_share_the_work_in_order<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    const KEYS: usize = 8;
    const PER_KEY: usize = 25;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let options = RelayOptions::default().batch(4);
    let a = Relay::start(&s.outbox, Recorder::named("a", &seen), options.clone());
    let b = Relay::start(&s.outbox, Recorder::named("b", &seen), options);

    // Producers in parallel, one per key, each message its own transaction.
    let mut producers = Vec::new();
    for k in 0..KEYS {
        let outbox = s.outbox.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..PER_KEY {
                let mut tx = outbox.pool().begin().await.unwrap();
                outbox
                    .enqueue(
                        &mut tx,
                        Message::new("t", format!("{i}").into_bytes())
                            .ordering_key(format!("key-{k}"))
                            .id(format!("m-{k}-{i}")),
                    )
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let total = (KEYS * PER_KEY) as i64;
    s.until_delivered(total).await;
    let (sa, sb) = (a.stats(), b.stats());
    a.stop().await;
    b.stop().await;

    let seen = seen.lock().unwrap().clone();
    let mut times: HashMap<String, usize> = HashMap::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    for (_, d) in &seen {
        *times.entry(d.id.clone()).or_default() += 1;
        let i: i64 = String::from_utf8(d.payload.clone())
            .unwrap()
            .parse()
            .unwrap();
        let prev = last.insert(d.ordering_key.clone(), i).unwrap_or(-1);
        assert_eq!(
            i,
            prev + 1,
            "key {} out of order: {prev} then {i}",
            d.ordering_key
        );
    }
    assert_eq!(times.len(), KEYS * PER_KEY);
    assert!(
        times.values().all(|n| *n == 1),
        "a message was published twice"
    );
    assert_eq!(sa.delivered + sb.delivered, total as u64, "{sa:?} {sb:?}");
    println!(
        "relay a delivered {}, relay b {}",
        sa.delivered, sb.delivered
    );
    s.cleanup().await;
}

/// A publisher that fails is retried with back-off; after `max_attempts` the message is dead
/// and the next message of its key goes out.
pub async fn a_failing_publisher_is_retried_then_dead_lettered<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let options = RelayOptions::default()
        .max_attempts(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(1));
    let publisher = Recorder::default();
    publisher.fail_first.store(2, Ordering::SeqCst);

    let enqueue = |ids: &'static [&'static str]| {
        let (pool, outbox) = (s.admin.clone(), s.outbox.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            for id in ids {
                outbox
                    .enqueue(
                        &mut tx,
                        Message::new("t", Vec::new()).ordering_key("k").id(*id),
                    )
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
        }
    };
    enqueue(&["recovers"]).await;

    // Two failures, then "recovers" goes out on its third attempt.
    while s.count(1).await == 0 {
        Relay::deliver_once(&s.outbox, &publisher, &options)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = publisher.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1.id, "recovers");
    assert_eq!(seen[0].1.attempt, 3);

    // "dies" fails every time: dead after 3 attempts, with the last error kept; meanwhile
    // the next message of its key waits.
    enqueue(&["dies", "after-the-dead"]).await;
    let always = Recorder::default();
    always.fail_first.store(usize::MAX, Ordering::SeqCst);
    while s.count(2).await == 0 {
        Relay::deliver_once(&s.outbox, &always, &options)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (attempts, error) = s.dead_letter("dies").await;
    assert_eq!(attempts, 3);
    assert_eq!(error, "the broker said no");

    // The dead letter no longer holds its key back.
    let ok = Recorder::default();
    while s.count(1).await < 2 {
        Relay::deliver_once(&s.outbox, &ok, &options).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(ok.ids(), vec!["after-the-dead".to_string()]);
    assert_eq!(s.count(2).await, 1, "the dead letter is kept");
    let stats = s.outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.delivered, stats.dead), (0, 2, 1));
    assert_eq!(stats.oldest_pending, None);

    // An operator re-queues the dead letter: delivered on the next round.
    assert_eq!(s.outbox.retry_dead(Some("dies")).await.unwrap(), 1);
    assert_eq!(s.outbox.stats().await.unwrap().pending, 1);
    assert!(s.outbox.stats().await.unwrap().oldest_pending.is_some());
    Relay::deliver_once(&s.outbox, &ok, &options).await.unwrap();
    assert_eq!(
        ok.ids(),
        vec!["after-the-dead".to_string(), "dies".to_string()]
    );
    assert_eq!(s.outbox.retry_dead(None).await.unwrap(), 0);
    s.cleanup().await;
}

/// Delivered messages are purged after the retention; dead letters stay.
pub async fn delivered_messages_are_purged<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let mut tx = s.admin.begin().await.unwrap();
    for i in 0..5 {
        s.outbox
            .enqueue(&mut tx, Message::new("t", Vec::new()).id(format!("p-{i}")))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let relay = Relay::start(
        &s.outbox,
        Recorder::default(),
        RelayOptions::default()
            .retention(Duration::ZERO, Duration::from_millis(20))
            .poll(Duration::from_millis(20)),
    );
    while relay.stats().purged < 5 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.stop().await;
    assert_eq!(s.all().await, 0);
    s.cleanup().await;
}

/// What the relays published, in order: (relay, ordering key, payload).
type Published = Arc<Mutex<Vec<(&'static str, String, i64)>>>;

/// Fails one publish in three (a fixed pattern), records the others: (relay, key, payload).
struct Flaky {
    name: &'static str,
    calls: Arc<AtomicUsize>,
    seen: Published,
}

impl Publisher for Flaky {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            if self.calls.fetch_add(1, Ordering::SeqCst) % 3 == 1 {
                return Err("the broker is busy".into());
            }
            let i = String::from_utf8(message.payload.clone())
                .unwrap()
                .parse()
                .unwrap();
            // Some time in the publisher, so that the relays' rounds overlap.
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.seen
                .lock()
                .unwrap()
                .push((self.name, message.ordering_key.clone(), i));
            Ok(())
        })
    }
}

/// Three relays and a publisher that fails one attempt in three (each failure backs the key's
/// head off): every key's messages still reach the publisher in insertion order, each once —
/// a failed head holds its key back, the other relays do not skip past it.
pub async fn three_relays_with_failures_keep_each_keys_order<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    const KEYS: usize = 6;
    const PER_KEY: usize = 20;
    // Inserted first, interleaved across keys, each in its own transaction; the relays start
    // on a full table, so each round sees many keys at once.
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let mut tx = s.outbox.pool().begin().await.unwrap();
            s.outbox
                .enqueue(
                    &mut tx,
                    Message::new("t", i.to_string().into_bytes())
                        .ordering_key(format!("key-{k}"))
                        .id(format!("m-{k}-{i}")),
                )
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let options = RelayOptions::default()
        .batch(2)
        .max_attempts(50)
        .backoff(Duration::from_millis(2), Duration::from_millis(20));
    let relays: Vec<Relay> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            let p = Flaky {
                name,
                calls: calls.clone(),
                seen: seen.clone(),
            };
            Relay::start(&s.outbox, p, options.clone())
        })
        .collect();
    let total = (KEYS * PER_KEY) as i64;
    s.until_delivered(total).await;
    let mut by_relay = Vec::new();
    for r in relays {
        by_relay.push(r.stats());
        r.stop().await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), KEYS * PER_KEY, "each message published once");
    let mut next: HashMap<String, i64> = HashMap::new();
    let mut relays_used = std::collections::HashSet::new();
    for (relay, key, i) in &seen {
        relays_used.insert(*relay);
        let want = next.entry(key.clone()).or_insert(0);
        assert_eq!(
            *i, *want,
            "{key}: message {i} published when {want} was due"
        );
        *want += 1;
    }
    let failed: u64 = by_relay.iter().map(|r| r.failed).sum();
    assert!(failed >= total as u64 / 3, "failures injected: {failed}");
    assert_eq!(s.count(2).await, 0, "no dead letter");
    println!(
        "{} publishes, {failed} failed and retried; delivered per relay: {:?}; relays used: {}",
        calls.load(Ordering::SeqCst),
        by_relay.iter().map(|r| r.delivered).collect::<Vec<_>>(),
        relays_used.len()
    );
    s.cleanup().await;
}

/// A message another relay holds (locked mid-publish) is left to it, and the relay that cannot
/// take it sleeps between looks instead of asking again at once; the message goes out as soon
/// as the holder lets go.
pub async fn a_relay_does_not_spin_on_a_message_another_relay_holds<B: Backend>(url: String) {
    let s = setup::<B>(&url).await;
    let mut tx = s.outbox.pool().begin().await.unwrap();
    s.outbox
        .enqueue(&mut tx, Message::new("t", b"held".to_vec()).id("held-1"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // What a relay mid-publish holds: the message's row lock.
    let holder = s.lock("held-1").await;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let relay = Relay::start(
        &s.outbox,
        Recorder::named("idle", &seen),
        RelayOptions::default().poll(Duration::from_secs(5)),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = relay.stats();
    assert_eq!(held.delivered, 0, "a held message was published: {held:?}");
    // 25 ms between looks: about 80 rounds in 2 s. Asking again at once is thousands.
    assert!(
        held.rounds <= 120,
        "{} rounds in 2 s while the message was held: the relay spins",
        held.rounds
    );
    assert!(
        held.rounds >= 2,
        "the relay looked only {} times",
        held.rounds
    );

    holder.rollback().await.unwrap();
    s.until_delivered(1).await;
    let after = relay.stats();
    relay.stop().await;
    assert_eq!(after.delivered, 1);
    assert_eq!(
        Recorder::named("idle", &seen).ids(),
        vec!["held-1".to_string()]
    );
    println!("{} rounds while held for 2 s", held.rounds);
    s.cleanup().await;
}
