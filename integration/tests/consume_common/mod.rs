//! The queue consumer's scenarios, run on every broker (`consume_rabbitmq.rs`, `consume_nats.rs`,
//! `consume_mqtt.rs`): each broker is a [`Kit`] (publish, open a source, read the dead letters).
//!
//! The `kill -9` scenario's consumers are this test binary itself, started with the
//! `IDEM_CONSUME_*` variables set ([`child_main`] runs before the harness): each consumes with
//! `Consumer::run_in_transaction` on PostgreSQL, the effect being a row written in the
//! handler's transaction, until its standard input closes.
#![allow(dead_code)]

use idem::consume::{Consumer, Message, Source, Stats};
use idem::Idem;
use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One broker, as the scenarios use it. A kit is opened per run (`run` names its queues).
pub trait Kit: Sized + Send + Sync + 'static {
    /// What a consumer reads.
    type Source: Source;

    /// The run's queue (stream, topic) and its dead-letter destination, created if missing.
    fn open(url: &str, run: &str) -> impl Future<Output = Self> + Send;

    /// Makes the consumers' subscriptions exist before anything is published (MQTT sessions).
    fn prepare(&self, _members: &[&str]) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// A source for the consumer called `member` (the MQTT client id's suffix).
    fn source(&self, member: &str) -> impl Future<Output = Self::Source> + Send;

    /// Publishes one message with `id` and waits for the broker to have it.
    fn publish(&self, id: &str, payload: &[u8]) -> impl Future<Output = ()> + Send;

    /// The key of a message: its id (NATS tests carry it in a header of their own, since
    /// JetStream would drop a second publish with the same `Nats-Msg-Id`).
    fn key(message: &Message) -> Option<String> {
        message.id.clone()
    }

    /// The dead letters so far: (id, reason).
    fn dead_letters(&self) -> impl Future<Output = Vec<(String, String)>> + Send;

    /// Deletes the run's queues.
    fn cleanup(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A name unique to this run: `c<pid>x<nanos>`.
pub fn run_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000_000;
    format!("c{}x{nanos}", std::process::id())
}

/// Effects counted per message id, in the test's process.
#[derive(Clone, Default)]
pub struct Effects(Arc<Mutex<HashMap<String, usize>>>);

impl Effects {
    pub fn add(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }

    pub fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn snapshot(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

/// Polls `done` every 50 ms until it holds; panics with `what` after `limit`.
pub async fn wait_until(limit: Duration, what: &str, done: impl FnMut() -> bool) {
    if let Err(e) = try_wait_until(limit, what, done).await {
        panic!("{e}");
    }
}

/// Polls `done` every 50 ms until it holds; after `limit`, says so.
pub async fn try_wait_until(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), String> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A consumer running on its own task, stopped by [`Running::stop`].
pub struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), idem::Error>>,
    pub stats: Arc<Stats>,
}

impl Running {
    pub async fn stop(self) -> Arc<Stats> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the consumer stops within 20 s")
            .unwrap()
            .unwrap();
        self.stats
    }
}

/// Starts a consumer on `source` whose effect is counted in `effects` after `work`.
pub fn spawn_consumer<K: Kit>(
    idem: &Idem,
    name: &str,
    source: K::Source,
    effects: Effects,
    work: Duration,
) -> Running {
    let consumer = Consumer::new(idem, name.to_owned())
        .key(K::key)
        .concurrency(8)
        .prefetch(16)
        .retry_delay(Duration::from_millis(100))
        .lease(Duration::from_secs(10));
    let stats = consumer.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(source, stopped, move |msg: Message| {
        let effects = effects.clone();
        async move {
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            effects.add(&K::key(&msg).unwrap_or_default());
            Ok::<_, idem::Error>(())
        }
    }));
    Running { stop, task, stats }
}

async fn postgres_idem(pg: &str) -> Idem {
    Idem::postgres(pg).await.expect("the PostgreSQL store")
}

/// 1 000 messages, 200 of them second copies of others (same id, same payload), two consumers
/// on two connections: every id's effect happens once, every copy is acked.
pub async fn duplicates_run_once<K: Kit>(pg: String, url: String) {
    let run = run_name();
    let kit = K::open(&url, &run).await;
    kit.prepare(&["a", "b"]).await;
    let effects = Effects::default();
    let idem = postgres_idem(&pg).await;
    let a = spawn_consumer::<K>(
        &idem,
        &run,
        kit.source("a").await,
        effects.clone(),
        Duration::ZERO,
    );
    let b = spawn_consumer::<K>(
        &idem,
        &run,
        kit.source("b").await,
        effects.clone(),
        Duration::ZERO,
    );
    let (distinct, copies) = (800, 200);
    for i in 0..distinct {
        let id = format!("m-{i}");
        kit.publish(&id, format!("payload {i}").as_bytes()).await;
        // Every fourth message comes twice, the copy a few messages later.
        if i % 4 == 3 {
            let j = i - 2;
            kit.publish(&format!("m-{j}"), format!("payload {j}").as_bytes())
                .await;
        }
    }
    let settled = |s: &Stats| s.processed() + s.replayed() + s.dead_lettered();
    wait_until(Duration::from_secs(60), "every copy settled", || {
        settled(&a.stats) + settled(&b.stats) >= (distinct + copies) as u64
    })
    .await;
    let (a, b) = (a.stop().await, b.stop().await);
    let counts = effects.snapshot();
    assert_eq!(counts.len(), distinct, "every id handled");
    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n != 1).collect();
    assert!(twice.is_empty(), "effects not once: {twice:?}");
    assert_eq!(a.processed() + b.processed(), distinct as u64);
    assert_eq!(a.replayed() + b.replayed(), copies as u64);
    assert_eq!(a.dead_lettered() + b.dead_lettered(), 0);
    assert!(
        a.processed() > 0 && b.processed() > 0,
        "both consumers worked"
    );
    kit.cleanup().await;
}

/// A message id reused with another payload is dead-lettered with the reason; every other
/// message is handled, the reused id's first payload once.
pub async fn a_poison_message_is_dead_lettered<K: Kit>(pg: String, url: String) {
    let run = run_name();
    let kit = K::open(&url, &run).await;
    kit.prepare(&["a"]).await;
    let effects = Effects::default();
    let idem = postgres_idem(&pg).await;
    let consumer = spawn_consumer::<K>(
        &idem,
        &run,
        kit.source("a").await,
        effects.clone(),
        Duration::ZERO,
    );
    kit.publish("poison", b"first payload").await;
    for i in 0..10 {
        kit.publish(&format!("n-{i}"), format!("payload {i}").as_bytes())
            .await;
    }
    kit.publish("poison", b"another payload").await;
    wait_until(
        Duration::from_secs(30),
        "11 handled and 1 dead letter",
        || consumer.stats.processed() == 11 && consumer.stats.dead_lettered() == 1,
    )
    .await;
    let stats = consumer.stop().await;
    assert_eq!(stats.failed(), 0);
    let counts = effects.snapshot();
    assert_eq!(counts.len(), 11, "{counts:?}");
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
    let mut dead = Vec::new();
    wait_until(Duration::from_secs(10), "the dead letter readable", || {
        dead = futures_block(kit.dead_letters());
        !dead.is_empty()
    })
    .await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, "poison");
    assert!(
        dead[0].1.contains("already used with other arguments"),
        "the reason names the mismatch: {}",
        dead[0].1
    );
    kit.cleanup().await;
}

/// Runs a future to completion from synchronous code inside the test's runtime.
fn futures_block<F: Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

// ---- kill -9 ---------------------------------------------------------------------------

const CHILD: &str = "IDEM_CONSUME_CHILD";

fn effects_table(run: &str) -> String {
    format!("consume_effects_{run}")
}

/// In a consumer process: consumes until standard input closes, printing `HANDLING id` when a
/// handler has written its effect (inside its open transaction) and then holds it for
/// `IDEM_CONSUME_HOLD_MS`, and `STATS processed replayed` at the end. `None` in the test
/// process itself.
pub fn child_main<K: Kit>() -> Option<ExitCode> {
    let run = std::env::var(CHILD).ok()?;
    let var = |name: &str| std::env::var(name).unwrap();
    let (pg, url, member) = (
        var("IDEM_CONSUME_PG"),
        var("IDEM_CONSUME_BROKER"),
        var("IDEM_CONSUME_MEMBER"),
    );
    let hold = Duration::from_millis(var("IDEM_CONSUME_HOLD_MS").parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let kit = K::open(&url, &run).await;
        let idem = postgres_idem(&pg).await;
        let pool = sqlx::PgPool::connect(&pg).await.unwrap();
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        });
        let consumer = Consumer::new(&idem, run.clone())
            .key(K::key)
            .concurrency(2)
            .prefetch(2);
        let stats = consumer.stats();
        let table = effects_table(&run);
        consumer
            .run_in_transaction(
                kit.source(&member).await,
                stdin_closed,
                pool,
                move |conn, msg| {
                    let sql = format!("INSERT INTO {table} (id, pid) VALUES ($1, $2)");
                    Box::pin(async move {
                        let id = K::key(&msg).unwrap_or_default();
                        sqlx::query(&sql)
                            .bind(&id)
                            .bind(std::process::id() as i32)
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| idem::Error::store("postgres", "effect", e))?;
                        println!("HANDLING {id}");
                        std::io::stdout().flush().unwrap();
                        tokio::time::sleep(hold).await;
                        Ok::<_, idem::Error>(())
                    })
                },
            )
            .await
            .unwrap();
        println!("STATS {} {}", stats.processed(), stats.replayed());
    });
    Some(ExitCode::SUCCESS)
}

fn spawn_child(run: &str, pg: &str, url: &str, member: &str, hold_ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .env(CHILD, run)
        .env("IDEM_CONSUME_PG", pg)
        .env("IDEM_CONSUME_BROKER", url)
        .env("IDEM_CONSUME_MEMBER", member)
        .env("IDEM_CONSUME_HOLD_MS", hold_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a consumer process")
}

/// Reads `child`'s standard output on a thread; each line goes to the channel.
fn lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn expect_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => return line,
            Ok(_) => {}
            Err(e) => panic!("no `{prefix}` line from the consumer within {limit:?}: {e}"),
        }
    }
}

/// A consumer process killed with `kill -9` while its handler holds the message (its effect
/// written in the open transaction): the broker redelivers to another process, whose effect
/// is the only one committed; a later copy of the message replays.
pub async fn a_killed_consumer_s_message_runs_once<K: Kit>(pg: String, url: String) {
    let run = run_name();
    let kit = K::open(&url, &run).await;
    kit.prepare(&["solo"]).await;
    let admin = sqlx::PgPool::connect(&pg).await.unwrap();
    let table = effects_table(&run);
    sqlx::query(&format!(
        "CREATE TABLE {table} (id text NOT NULL, pid int NOT NULL)"
    ))
    .execute(&admin)
    .await
    .unwrap();
    // Opens the store's table before any process races to create it.
    postgres_idem(&pg).await;

    let mut first = spawn_child(&run, &pg, &url, "solo", 60_000);
    let first_out = lines(&mut first);
    kit.publish("order-1", b"charge 10 EUR").await;
    let line = expect_line(&first_out, "HANDLING", Duration::from_secs(20));
    assert_eq!(line, "HANDLING order-1");
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();

    // The replacement (for MQTT: the same client id, whose session holds the message).
    let mut second = spawn_child(&run, &pg, &url, "solo", 0);
    let second_out = lines(&mut second);
    expect_line(&second_out, "HANDLING order-1", Duration::from_secs(30));
    // A copy of the message published later replays.
    kit.publish("order-1", b"charge 10 EUR").await;
    let count = |admin: sqlx::PgPool, table: String| async move {
        sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&admin)
            .await
            .unwrap()
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(second.stdin.take()); // shutdown: finish, settle, stop
    let stats = expect_line(&second_out, "STATS", Duration::from_secs(20));
    second.wait().unwrap();
    assert_eq!(
        stats, "STATS 1 1",
        "the redelivery ran, the later copy replayed"
    );
    let rows: Vec<(String, i32)> = sqlx::query_as(&format!("SELECT id, pid FROM {table}"))
        .fetch_all(&admin)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "the effect once: {rows:?}");
    assert_eq!(
        rows[0].1,
        second.id() as i32,
        "the killed process's effect rolled back"
    );
    assert_eq!(count(admin.clone(), table.clone()).await, 1);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&admin)
        .await
        .unwrap();
    kit.cleanup().await;
}
