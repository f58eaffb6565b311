//! A checkout, in two parts.
//!
//! 1. **Steps** (in memory, no server): reserve stock, charge the card, send the receipt — the
//!    receipt step fails on the first attempt; the retry replays the finished steps and runs
//!    only the rest: the card is charged once and the receipt sent once.
//! 2. **The outbox** (feature `outbox`, PostgreSQL): the checkout commits the order and enqueues
//!    `order.placed` in one transaction; the process "dies" before anything is published, a
//!    declined checkout rolls back, the client retries, a relay dies mid-delivery — and the
//!    output says what happened to each message: every committed order's message reaches the
//!    consumer, whose effect runs once; the rolled-back one is never sent.
//!
//! ```text
//! cargo run --example checkout                      # part 1
//! IDEM_CHECKOUT_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example checkout --features outbox  # parts 1 and 2
//! ```
//!
//! Part 2 needs a PostgreSQL 13+ database (default `postgres://postgres@127.0.0.1:5432/test`)
//! where it may create and drop the tables `checkout_orders`, `checkout_emails`,
//! `checkout_outbox` and `checkout_idem` (and their `_migrations`); no message broker: the
//! relay publishes to an in-process consumer (`idem::outbox::nats::NatsPublisher` is the
//! JetStream one).

use idem::{idempotent, Idem};
use std::sync::atomic::{AtomicUsize, Ordering};

static RESERVED: AtomicUsize = AtomicUsize::new(0);
static CHARGED: AtomicUsize = AtomicUsize::new(0);
static MAILS_TRIED: AtomicUsize = AtomicUsize::new(0);
static MAILS_SENT: AtomicUsize = AtomicUsize::new(0);

/// The checkout's own error: its failures, plus idem's (every `#[idempotent]` function's error
/// type needs `From<idem::Error>`, so that a store failure or an in-progress duplicate reaches
/// the caller).
#[derive(Debug)]
enum CheckoutError {
    Idem(idem::Error),
    /// The mail server refused the receipt.
    Mail(String),
}

impl std::fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckoutError::Idem(e) => write!(f, "{e}"),
            CheckoutError::Mail(e) => write!(f, "mail: {e}"),
        }
    }
}

impl From<idem::Error> for CheckoutError {
    fn from(e: idem::Error) -> Self {
        CheckoutError::Idem(e)
    }
}

#[idempotent(step)]
async fn reserve_stock(order: u64, items: u32) -> Result<u32, CheckoutError> {
    RESERVED.fetch_add(1, Ordering::SeqCst);
    println!("  reserve_stock: {items} items for order {order}");
    Ok(items)
}

#[idempotent(step)]
async fn charge_card(order: u64, cents: u64) -> Result<String, CheckoutError> {
    CHARGED.fetch_add(1, Ordering::SeqCst);
    println!("  charge_card: {cents} cents for order {order}");
    Ok(format!("ch_{order}"))
}

async fn send_receipt(order: u64) -> Result<(), CheckoutError> {
    // The receipt is a block, not worth its own function: `idem::step`.
    idem::step(("receipt", order), || async move {
        if MAILS_TRIED.fetch_add(1, Ordering::SeqCst) == 0 {
            println!("  send_receipt: mail server unavailable");
            return Err(CheckoutError::Mail("server unavailable".into()));
        }
        MAILS_SENT.fetch_add(1, Ordering::SeqCst);
        println!("  send_receipt: sent for order {order}");
        Ok(())
    })
    .await
}

#[idempotent(key = order, ttl = "7d")]
async fn checkout(order: u64, items: u32, cents: u64) -> Result<String, CheckoutError> {
    reserve_stock(order, items).await?;
    let charge = charge_card(order, cents).await?;
    send_receipt(order).await?;
    Ok(charge)
}

#[tokio::main]
async fn main() {
    println!("== part 1: steps ==");
    Idem::memory().install();
    for attempt in 1..=3 {
        println!("attempt {attempt}:");
        match checkout(1001, 2, 4_999).await {
            Ok(charge) => println!("  -> done, charge {charge}"),
            Err(e) => println!("  -> failed: {e}"),
        }
    }
    println!(
        "stock reserved {} time(s), card charged {} time(s), receipt sent {} time(s) ({} tries)",
        RESERVED.load(Ordering::SeqCst),
        CHARGED.load(Ordering::SeqCst),
        MAILS_SENT.load(Ordering::SeqCst),
        MAILS_TRIED.load(Ordering::SeqCst),
    );

    #[cfg(feature = "outbox")]
    if let Err(e) = outbox_part::run().await {
        eprintln!("part 2 failed: {e}");
        std::process::exit(1);
    }
    #[cfg(not(feature = "outbox"))]
    println!(
        "\n(part 2, the transactional outbox, needs PostgreSQL: \
         IDEM_CHECKOUT_POSTGRES_URL=postgres://USER@HOST:PORT/DB cargo run --example checkout \
         --features outbox)"
    );
}

#[cfg(feature = "outbox")]
mod outbox_part {
    use idem::outbox::{
        Delivery, ListFilter, Message, MessageState, Outbox, Publisher, Relay, RelayOptions,
    };
    use idem::postgres::sqlx::{self, postgres::PgPoolOptions, PgPool, Postgres, Transaction};
    use idem::postgres::PostgresOptions;
    use idem::{idempotent, BoxError, Error, Idem};
    use std::collections::BTreeMap;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

    /// The checkout's error: a declined card, or idem's.
    #[derive(Debug)]
    enum CheckoutError {
        Idem(Error),
        Declined,
    }

    impl From<Error> for CheckoutError {
        fn from(e: Error) -> Self {
            CheckoutError::Idem(e)
        }
    }

    impl std::fmt::Display for CheckoutError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                CheckoutError::Idem(e) => write!(f, "{e}"),
                CheckoutError::Declined => f.write_str("card declined"),
            }
        }
    }

    #[derive(serde::Serialize)]
    struct Placed {
        order: i64,
        cents: i64,
    }

    fn db(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
        move |e| Error::store("postgres", what, e)
    }

    /// The order row and its `order.placed` message, on the caller's transaction, with the
    /// idempotency record: all three commit together, or none does. The card is charged last
    /// (here: declined above 1000.00), after the enqueue, to show a rollback taking the
    /// message with it.
    #[idempotent(transaction = tx, key = order, store = idem, skip(outbox))]
    async fn place_order(
        order: i64,
        cents: i64,
        idem: &Idem,
        outbox: &Outbox,
        tx: &mut Transaction<'_, Postgres>,
    ) -> Result<String, CheckoutError> {
        sqlx::query("INSERT INTO checkout_orders (id, cents) VALUES ($1, $2)")
            .bind(order)
            .bind(cents)
            .execute(&mut **tx)
            .await
            .map_err(db("insert order"))?;
        let placed = Message::json("order.placed", &Placed { order, cents })?
            .ordering_key(format!("order-{order}"))
            .name("placed");
        let m = outbox.enqueue(tx, placed).await?;
        if cents > 100_000 {
            return Err(CheckoutError::Declined);
        }
        Ok(m.id)
    }

    /// What the consumer saw of one message id.
    #[derive(Default, Debug, Clone, Copy)]
    struct Seen {
        deliveries: u32,
        effects: u32,
    }

    /// The other system: an idempotent consumer keyed on the message id (what a JetStream
    /// consumer does with `Nats-Msg-Id`), sending one confirmation mail per order.
    #[derive(Clone)]
    struct MailService {
        idem: Idem,
        pool: PgPool,
        seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    }

    impl MailService {
        async fn handle(&self, message: &Delivery) -> Result<(), Error> {
            self.seen
                .lock()
                .unwrap()
                .entry(message.id.clone())
                .or_default()
                .deliveries += 1;
            let (pool, seen, id) = (self.pool.clone(), self.seen.clone(), message.id.clone());
            let payload = message.payload.clone();
            self.idem
                .call("mail.order_placed")
                .key(&message.id)
                .run(async move {
                    sqlx::query("INSERT INTO checkout_emails (message_id, body) VALUES ($1, $2)")
                        .bind(&id)
                        .bind(String::from_utf8_lossy(&payload).into_owned())
                        .execute(&pool)
                        .await
                        .map_err(db("insert mail"))?;
                    seen.lock().unwrap().entry(id).or_default().effects += 1;
                    Ok::<_, Error>(())
                })
                .await
                .map(drop)
        }
    }

    /// The relay's publisher: hands the message to the mail service. `die_after_publish`: the
    /// first message is handed over and then the publisher hangs, for the relay to be killed
    /// before it records the delivery.
    struct ToMailService {
        mail: MailService,
        die_after_publish: bool,
        published: Arc<Mutex<Vec<String>>>,
    }

    impl Publisher for ToMailService {
        fn publish<'a>(
            &'a self,
            message: &'a Delivery,
        ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
            Box::pin(async move {
                self.mail.handle(message).await?;
                self.published.lock().unwrap().push(message.id.clone());
                if self.die_after_publish {
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
        }
    }

    async fn reset(pool: &PgPool) -> Result<(), Error> {
        for t in [
            "checkout_orders",
            "checkout_emails",
            "checkout_outbox",
            "checkout_outbox_migrations",
            "checkout_idem",
            "checkout_idem_migrations",
        ] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(pool)
                .await
                .map_err(db("reset"))?;
        }
        for ddl in [
            "CREATE TABLE checkout_orders (id bigint PRIMARY KEY, cents bigint NOT NULL)",
            // No unique key: a duplicate effect would be a second row.
            "CREATE TABLE checkout_emails (message_id text NOT NULL, body text NOT NULL)",
        ] {
            sqlx::query(ddl).execute(pool).await.map_err(db("reset"))?;
        }
        Ok(())
    }

    async fn checkout(
        idem: &Idem,
        outbox: &Outbox,
        order: i64,
        cents: i64,
    ) -> Result<Result<String, CheckoutError>, Error> {
        let mut tx = outbox.pool().begin().await.map_err(db("begin"))?;
        let placed = place_order(order, cents, idem, outbox, &mut tx).await;
        if placed.is_ok() {
            tx.commit().await.map_err(db("commit"))?;
        } else {
            tx.rollback().await.map_err(db("rollback"))?;
        }
        Ok(placed)
    }

    async fn count(pool: &PgPool, sql: &str) -> Result<i64, Error> {
        sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await
            .map_err(db("count"))
    }

    pub(super) async fn run() -> Result<(), Error> {
        let url = std::env::var("IDEM_CHECKOUT_POSTGRES_URL").unwrap_or(DEFAULT_URL.into());
        println!("\n== part 2: the transactional outbox (PostgreSQL {url}) ==");
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .map_err(db("connect"))?;
        reset(&pool).await?;
        let store = PostgresOptions::from_url(&url)?
            .table("checkout_idem")
            .connect()
            .await?;
        let idem = Idem::from_store(store);
        let outbox = Outbox::with_table(pool.clone(), "checkout_outbox")?
            .migrate()
            .await?;
        let mail = MailService {
            idem: idem.clone(),
            pool: pool.clone(),
            seen: Default::default(),
        };

        // 1. Two checkouts commit; the process dies before publishing anything (no relay runs).
        println!("1. checkout of orders 1001 and 1002; the process dies before publishing:");
        let mut ids = BTreeMap::new();
        for (order, cents) in [(1001, 4_999), (1002, 1_250)] {
            let id = checkout(&idem, &outbox, order, cents)
                .await?
                .map_err(|e| Error::config(format!("checkout {order} should succeed: {e}")))?;
            println!(
                "   order {order}: committed with its order.placed message {}",
                &id[..12]
            );
            ids.insert(id, order);
        }
        let stats = outbox.stats().await?;
        println!(
            "   nothing published yet, and nothing lost: {} messages pending in the outbox, \
             committed with their orders",
            stats.pending
        );

        // 2. A checkout whose card is declined after the enqueue: rolled back, message too.
        println!("2. checkout of order 1003, card declined after the message was enqueued:");
        match checkout(&idem, &outbox, 1003, 250_000).await? {
            Err(e) => println!("   order 1003: {e}; the transaction rolled back"),
            Ok(_) => return Err(Error::config("order 1003 should be declined")),
        }

        // 3. The client, who never got an answer for 1001, retries it.
        println!("3. the client retries order 1001 (same key):");
        let again = checkout(&idem, &outbox, 1001, 4_999).await?;
        let again = again.map_err(|e| Error::config(format!("the retry failed: {e}")))?;
        println!(
            "   replayed the stored result (message {}); the outbox still holds {} messages",
            &again[..12],
            outbox.stats().await?.pending
        );

        // 4. A relay starts, hands the first message over, and is killed before it records
        // the delivery (its own connections closed, as a dead process's are).
        println!("4. a relay publishes order 1001's message and is killed before recording it:");
        let published = Arc::new(Mutex::new(Vec::new()));
        let doomed_pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .map_err(db("connect"))?;
        let doomed = Relay::start(
            &Outbox::with_table(doomed_pool.clone(), "checkout_outbox")?,
            ToMailService {
                mail: mail.clone(),
                die_after_publish: true,
                published: published.clone(),
            },
            RelayOptions::default().batch(1),
        );
        while published.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        doomed.abort();
        doomed_pool.close().await;
        println!(
            "   killed; the outbox still has {} pending: that message will go out again",
            outbox.stats().await?.pending
        );

        // 5. Another relay delivers everything committed.
        println!("5. a second relay delivers what is pending:");
        let relay = Relay::start(
            &outbox,
            ToMailService {
                mail: mail.clone(),
                die_after_publish: false,
                published: published.clone(),
            },
            RelayOptions::default(),
        );
        while outbox.stats().await?.pending > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        relay.stop().await;

        // What happened to each message.
        println!("\nwhat happened to each message:");
        let delivered = outbox
            .list(&ListFilter::new().state(MessageState::Delivered))
            .await?;
        let seen = mail.seen.lock().unwrap().clone();
        let published = published.lock().unwrap().clone();
        for m in &delivered {
            let s = seen.get(&m.id).copied().unwrap_or_default();
            let times = published.iter().filter(|p| **p == m.id).count();
            println!(
                "   order.placed of order {} (id {}): committed with the order; published {times} \
                 time(s){}; the mail service ran its effect {} time(s){}",
                ids.get(&m.id).copied().unwrap_or_default(),
                &m.id[..12],
                if times > 1 {
                    " (the first by the killed relay)"
                } else {
                    ""
                },
                s.effects,
                if s.deliveries > s.effects {
                    format!(
                        ", {} duplicate absorbed by its idempotency key",
                        s.deliveries - s.effects
                    )
                } else {
                    String::new()
                },
            );
        }
        println!(
            "   order.placed of order 1003: rolled back with the declined order; never in the \
             outbox, never published"
        );
        let orders = count(&pool, "SELECT count(*) FROM checkout_orders").await?;
        let mails = count(&pool, "SELECT count(*) FROM checkout_emails").await?;
        let dupes = count(
            &pool,
            "SELECT count(*) FROM (SELECT message_id FROM checkout_emails \
             GROUP BY message_id HAVING count(*) > 1) d",
        )
        .await?;
        println!(
            "orders committed {orders}, messages delivered {}, mails sent {mails} \
             ({dupes} duplicates), lost 0",
            delivered.len()
        );
        let ok = orders == 2
            && delivered.len() == 2
            && mails == 2
            && dupes == 0
            && delivered.iter().all(|m| ids.contains_key(&m.id));
        if !ok {
            return Err(Error::config("the outbox example did not end as it should"));
        }
        Ok(())
    }
}
