//! The crash window, measured from outside: worker processes whose body writes a row to a
//! "gateway" table (another database's effect, keyed by `idem::current_key()`) and then works on
//! a little before returning, killed with `kill -9` at random fifty times over 600 keys, on the
//! PostgreSQL store and on the Redis store (the gateway is a PostgreSQL table in both). Three
//! runs each, one per way a takeover of an abandoned attempt is decided:
//!
//! * `rerun`: the body runs again. The test counts the keys whose effect happened twice and
//!   asserts what is deterministic: a key's rows are one per attempt that died inside the window
//!   (its effect made, its result not stored) plus the one that completed.
//! * `reconcile`: the reconcile looks the gateway row up by `current_key()`: no key has two.
//! * `park`: no key has two; the parked keys (`Inspect::parked`, what `idem pending` lists) are
//!   exactly the keys whose worker died holding the claim (the ones inside the window among them); an operator's resolve, from the gateway,
//!   then lets every key finish with one effect.
//!
//! Which attempts died inside the window is read after each kill, while no worker runs: the
//! store's in-progress records (Inspect listing) are the killed worker's claims, and a gateway row
//! carrying a record's token (`idem::current_token()`) says that attempt made its effect.
//!
//! Workers are this test binary itself, running the test named in their job.

mod pg_common;

use idem::store::postgres::PostgresOptions;
use idem::store::redis::RedisOptions;
use idem::store::{Filter, Inspect, KeyInfo, Status};
use idem::{Error, Idem, OnAbandoned, Outcome, Resolution};
use pg_common::{unique_table, Rng};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: i64 = 600;
const KILLS: usize = 50;
/// Each worker's calls in flight.
const IN_FLIGHT: usize = 8;
/// The lease of every call: short, so that the next workers take abandoned keys over.
const LEASE: Duration = Duration::from_millis(800);
/// How long after a kill (and its backends' end) the test reads what the kill left.
const SETTLE: Duration = Duration::from_millis(30);
/// Where a worker finds its job.
const JOB: &str = "IDEM_CRASH_WINDOW_JOB";

/// How a takeover is decided in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Mode {
    Rerun,
    Reconcile,
    Park,
}

/// Which store a run's records live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Backend {
    Postgres,
    Redis,
}

/// A run: what its workers are given in the environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    test: String,
    backend: Backend,
    mode: Mode,
    pg_url: String,
    redis_url: String,
    /// The PostgreSQL store's table, or the Redis store's key prefix.
    table: String,
    gateway: String,
    ns: String,
}

/// The store of a run: a handle on it, and its records as an operator lists them.
#[derive(Clone)]
struct Store {
    idem: Idem,
    inspect: Arc<dyn Inspect>,
}

impl Store {
    /// `worker`: its PostgreSQL connections carry the run's name (see [`settle`]).
    async fn open(job: &Job, worker: bool) -> Store {
        match job.backend {
            Backend::Postgres => {
                let store = PostgresOptions::from_url(&job.pg_url)
                    .unwrap()
                    .table(&job.table)
                    .application_name(if worker {
                        job.table.clone()
                    } else {
                        format!("{}-test", job.table)
                    })
                    .max_connections(IN_FLIGHT as u32 + 2)
                    .connect()
                    .await
                    .expect("open the PostgreSQL store");
                Store {
                    idem: Idem::from_store(store.clone()),
                    inspect: Arc::new(store),
                }
            }
            Backend::Redis => {
                let open = || async {
                    RedisOptions::from_url(&job.redis_url)
                        .unwrap()
                        .key_prefix(job.table.clone())
                        .connect()
                        .await
                        .expect("open the Redis store")
                };
                Store {
                    idem: Idem::from_store(open().await),
                    inspect: Arc::new(open().await),
                }
            }
        }
    }

    fn idem(&self) -> Idem {
        self.idem.clone()
    }

    /// The live records of the run's namespace with `status`.
    async fn list(&self, ns: &str, status: Status) -> Vec<KeyInfo> {
        let filter = Filter::new()
            .name(Some(ns.to_string()))
            .status(Some(status))
            .limit(10 * KEYS as usize);
        self.inspect
            .list(&filter)
            .await
            .expect("list the store's records")
    }
}

/// The gateway's connections carry the run's name, so that the test can tell when a dead
/// worker's are gone.
async fn gateway_pool(job: &Job) -> PgPool {
    let options = PgConnectOptions::from_str(&job.pg_url)
        .expect("a PostgreSQL URL")
        .application_name(&job.table);
    PgPoolOptions::new()
        .max_connections(IN_FLIGHT as u32 + 2)
        .connect_with(options)
        .await
        .expect("connect to the gateway's database")
}

/// Waits until the server has ended every backend of a dead worker: a backend finishes the
/// statement it was running (a claim, the effect, a completion) before it notices the closed
/// connection, so what the kill left is settled only then. The test's own connections are named
/// otherwise. Redis runs each command whole as it arrives: a short pause settles it.
async fn settle(admin: &PgPool, job: &Job) {
    let started = Instant::now();
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&job.table)
                .fetch_one(admin)
                .await
                .unwrap();
        if left == 0 || started.elapsed() > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(SETTLE).await;
}

/// The digest the store keeps for key `k` of namespace `ns`.
fn digest(ns: &str, k: i64) -> idem::key::Digest {
    idem::key::key_digest(ns, None, &idem::key::canonical(&k).unwrap())
}

/// One call for key `k`: the body makes the effect at the gateway under the call's key and
/// token, then works on for `work`.
async fn call_once(
    idem: &Idem,
    job: &Job,
    gateway: &PgPool,
    k: i64,
    work: Duration,
) -> Result<Outcome<i64>, Error> {
    let insert = format!(
        "INSERT INTO \"{}\" (key, k, token, pid) VALUES ($1, $2, $3, $4)",
        job.gateway
    );
    let lookup = format!("SELECT k FROM \"{}\" WHERE key = $1 LIMIT 1", job.gateway);
    let body = {
        let gateway = gateway.clone();
        async move {
            let key = idem::current_key().expect("inside the call");
            let token = idem::current_token().expect("inside the call");
            sqlx::query(&insert)
                .bind(key)
                .bind(k)
                .bind(token as i64)
                .bind(i64::from(std::process::id()))
                .execute(&gateway)
                .await
                .map_err(|e| Error::store("postgres", "gateway", e))?;
            // Works on after the effect: the crash window.
            tokio::time::sleep(work).await;
            Ok::<_, Error>(k)
        }
    };
    let call = idem
        .call(job.ns.clone())
        .key(&k)
        .lease(LEASE)
        .ttl(Duration::from_secs(3600))
        .wait(Duration::ZERO);
    match job.mode {
        Mode::Rerun => call.run(body).await,
        Mode::Park => call.on_abandoned(OnAbandoned::Park).run(body).await,
        Mode::Reconcile => {
            let gateway = gateway.clone();
            call.reconcile(move || async move {
                // The charge looked up at the gateway by the key it was sent under.
                let key = idem::current_key().expect("inside the call");
                sqlx::query_scalar::<_, i64>(&lookup)
                    .bind(key)
                    .fetch_optional(&gateway)
                    .await
                    .map_err(|e| Error::store("postgres", "gateway lookup", e))
            })
            .run(body)
            .await
        }
    }
}

/// A worker process: every key in random order, over and over, `IN_FLIGHT` at a time, until it
/// is killed. A key in flight elsewhere (or abandoned and not yet lapsed) or parked is skipped.
async fn worker(job: Job) {
    let store = Store::open(&job, true).await;
    let gateway = gateway_pool(&job).await;
    let idem = store.idem();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let (idem, job, gateway) = (idem.clone(), job.clone(), gateway.clone());
            tokio::spawn(async move {
                let mut rng = Rng::new();
                loop {
                    let order = rng.shuffled(KEYS as usize);
                    for k in order.into_iter().skip(t).step_by(IN_FLIGHT) {
                        let work = Duration::from_millis(10 + rng.below(30));
                        match call_once(&idem, &job, &gateway, k as i64, work).await {
                            Ok(_) => {}
                            Err(e) if e.is_in_progress() || e.is_outcome_unknown() => {}
                            Err(e) => eprintln!("key {k}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// What the kills left, read after each one: every attempt that died holding its claim, as
/// (key, token), and whether it had made its effect (inside the window).
#[derive(Default)]
struct Deaths {
    abandoned: BTreeSet<(i64, u64)>,
    in_window: BTreeSet<(i64, u64)>,
}

impl Deaths {
    fn keys(set: &BTreeSet<(i64, u64)>) -> BTreeSet<i64> {
        set.iter().map(|&(k, _)| k).collect()
    }
}

/// The gateway's rows: key → (tokens of the effects made).
async fn effects(gateway: &PgPool, job: &Job) -> BTreeMap<i64, Vec<u64>> {
    let rows: Vec<(i64, i64)> =
        sqlx::query_as(&format!("SELECT k, token FROM \"{}\"", job.gateway))
            .fetch_all(gateway)
            .await
            .unwrap();
    let mut by_key: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for (k, token) in rows {
        by_key.entry(k).or_default().push(token as u64);
    }
    by_key
}

/// After a kill: the store's live in-progress records are the dead worker's claims (no worker
/// runs now; those of an earlier kill still within their lease are seen again, and counted once).
async fn read_deaths(store: &Store, gateway: &PgPool, job: &Job, deaths: &mut Deaths) {
    let by_digest: HashMap<_, _> = (0..KEYS).map(|k| (digest(&job.ns, k), k)).collect();
    let made = effects(gateway, job).await;
    for info in store.list(&job.ns, Status::InProgress).await {
        let k = *by_digest
            .get(&info.key)
            .expect("every record is one of the run's keys");
        deaths.abandoned.insert((k, info.token));
        if made.get(&k).is_some_and(|t| t.contains(&info.token)) {
            deaths.in_window.insert((k, info.token));
        }
    }
}

/// Every key once more, in this process, until it returns (or, parked, answers so); the keys
/// that answered "outcome unknown".
async fn recovery_pass(store: &Store, gateway: &PgPool, job: &Job) -> BTreeSet<i64> {
    let idem = store.idem();
    let mut unknown = BTreeSet::new();
    for k in 0..KEYS {
        let started = Instant::now();
        loop {
            match call_once(&idem, job, gateway, k, Duration::ZERO).await {
                Ok(out) => {
                    assert_eq!(out.into_inner(), k);
                    break;
                }
                Err(e) if e.is_outcome_unknown() => {
                    unknown.insert(k);
                    break;
                }
                Err(e) if e.is_in_progress() && started.elapsed() < 4 * LEASE => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("key {k} in the recovery pass: {e}"),
            }
        }
    }
    unknown
}

/// One run: fifty kills, a recovery pass, the run's assertions and figures.
async fn run(job: Job) {
    // The test's own connections (its store's, for the recovery pass, are named by the store).
    let gateway = PgPoolOptions::new()
        .max_connections(IN_FLIGHT as u32 + 2)
        .connect(&job.pg_url)
        .await
        .expect("connect to the gateway's database");
    sqlx::query(&format!(
        "CREATE TABLE \"{}\" (key TEXT NOT NULL, k BIGINT NOT NULL, token BIGINT NOT NULL, \
         pid BIGINT NOT NULL)",
        job.gateway
    ))
    .execute(&gateway)
    .await
    .unwrap();
    sqlx::query(&format!("CREATE INDEX ON \"{}\" (key)", job.gateway))
        .execute(&gateway)
        .await
        .unwrap();
    let store = Store::open(&job, false).await;

    let started = Instant::now();
    let mut rng = Rng::new();
    let mut deaths = Deaths::default();
    let json = serde_json::to_string(&job).unwrap();
    for _ in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                job.test.as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(JOB, &json)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a worker");
        std::thread::sleep(Duration::from_millis(120 + rng.below(180)));
        child.kill().expect("kill -9 the worker"); // SIGKILL on Unix
        let out = child.wait_with_output().unwrap();
        assert!(
            !out.status.success(),
            "the worker ran to its end: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        settle(&gateway, &job).await;
        read_deaths(&store, &gateway, &job, &mut deaths).await;
    }
    let killing = started.elapsed();

    // Every abandoned claim lapses; then every key is called once more.
    tokio::time::sleep(LEASE).await;
    let unknown = recovery_pass(&store, &gateway, &job).await;
    let made = effects(&gateway, &job).await;
    let doubled: BTreeSet<i64> = made
        .iter()
        .filter(|(_, t)| t.len() > 1)
        .map(|(&k, _)| k)
        .collect();
    let window_keys = Deaths::keys(&deaths.in_window);
    let abandoned_keys = Deaths::keys(&deaths.abandoned);
    let label = format!("{:?}, {:?}", job.backend, job.mode).to_lowercase();
    eprintln!(
        "crash window ({label}): {KILLS} kills in {:.1} s over {KEYS} keys: {} attempts died \
         holding their claim ({} keys), {} of them inside the window ({} keys); {} keys with two \
         or more effects ({} effects too many)",
        killing.as_secs_f64(),
        deaths.abandoned.len(),
        abandoned_keys.len(),
        deaths.in_window.len(),
        window_keys.len(),
        doubled.len(),
        made.values().map(|t| t.len() - 1).sum::<usize>(),
    );
    assert!(
        !deaths.in_window.is_empty(),
        "no kill landed inside the window: the run measured nothing"
    );

    match job.mode {
        Mode::Rerun => {
            // Deterministic: one effect per attempt that died after its effect, plus the one
            // that completed; so every doubled key is one whose worker died inside the window.
            for k in 0..KEYS {
                let died = deaths
                    .in_window
                    .iter()
                    .filter(|&&(key, _)| key == k)
                    .count();
                let rows = made.get(&k).map_or(0, Vec::len);
                assert_eq!(
                    rows,
                    died + 1,
                    "key {k}: effects against deaths in the window"
                );
            }
            assert_eq!(doubled, window_keys);
            assert!(unknown.is_empty());
        }
        Mode::Reconcile => {
            assert!(doubled.is_empty(), "keys with two effects: {doubled:?}");
            assert!(unknown.is_empty());
            assert_eq!(made.len(), KEYS as usize, "every key made its effect");
        }
        Mode::Park => {
            assert!(doubled.is_empty(), "keys with two effects: {doubled:?}");
            let parked: BTreeSet<i64> = {
                let by_digest: HashMap<_, _> = (0..KEYS).map(|k| (digest(&job.ns, k), k)).collect();
                // What `idem pending` lists.
                store
                    .inspect
                    .parked(Some(&job.ns), 10 * KEYS as usize)
                    .await
                    .expect("list the parked keys")
                    .iter()
                    .map(|info| by_digest[&info.key])
                    .collect()
            };
            assert_eq!(
                parked, unknown,
                "the listing shows the keys that answered so"
            );
            assert_eq!(
                parked, abandoned_keys,
                "parked: exactly the keys whose worker died holding the claim"
            );
            assert!(window_keys.is_subset(&parked));
            eprintln!(
                "crash window ({label}): {} keys parked: {} died inside the window, {} before \
                 their effect",
                parked.len(),
                window_keys.len(),
                parked.len() - window_keys.len()
            );
            // The operator: each parked key resolved from the gateway, by its key.
            let idem = store.idem();
            for &k in &parked {
                let verdict = if made.contains_key(&k) {
                    Resolution::Applied(k)
                } else {
                    Resolution::NotApplied
                };
                idem.resolve(&job.ns, &k, verdict).await.unwrap();
            }
            let unknown = recovery_pass(&store, &gateway, &job).await;
            assert!(unknown.is_empty(), "still parked: {unknown:?}");
            let made = effects(&gateway, &job).await;
            assert!(made.values().all(|t| t.len() == 1));
            assert_eq!(made.len(), KEYS as usize, "every key made its effect once");
        }
    }

    let _ = sqlx::query(&format!("DROP TABLE IF EXISTS \"{}\"", job.gateway))
        .execute(&gateway)
        .await;
    match job.backend {
        Backend::Postgres => pg_common::drop_table(&gateway, &job.table).await,
        Backend::Redis => {
            let client = redis::Client::open(job.redis_url.as_str()).unwrap();
            let mut con = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*", job.table))
                .query_async(&mut con)
                .await
                .unwrap();
            if !keys.is_empty() {
                let _: () = redis::cmd("DEL")
                    .arg(keys)
                    .query_async(&mut con)
                    .await
                    .unwrap();
            }
        }
    }
}

/// The test's run (`test` names the test, for its workers), or, in a worker process, the
/// worker's part.
fn run_or_work(test: &str, backend: Backend, mode: Mode, pg_url: String, redis_url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(json) = std::env::var(JOB) {
        let job: Job = serde_json::from_str(&json).expect("a worker's job");
        assert_eq!(job.test, test);
        rt.block_on(worker(job));
        return;
    }
    let table = unique_table("crashw");
    let job = Job {
        test: test.to_string(),
        backend,
        mode,
        pg_url,
        redis_url,
        gateway: format!("{table}_gw"),
        ns: idem::testkit::unique("crash-window"),
        table: match backend {
            Backend::Postgres => table,
            Backend::Redis => format!("idem-test:{table}"),
        },
    };
    rt.block_on(run(job));
}

fn postgres_rerun(url: String) {
    run_or_work(
        "postgres_rerun",
        Backend::Postgres,
        Mode::Rerun,
        url,
        String::new(),
    );
}

fn postgres_reconcile(url: String) {
    run_or_work(
        "postgres_reconcile",
        Backend::Postgres,
        Mode::Reconcile,
        url,
        String::new(),
    );
}

fn postgres_park(url: String) {
    run_or_work(
        "postgres_park",
        Backend::Postgres,
        Mode::Park,
        url,
        String::new(),
    );
}

fn redis_rerun((pg, redis): (String, String)) {
    run_or_work("redis_rerun", Backend::Redis, Mode::Rerun, pg, redis);
}

fn redis_reconcile((pg, redis): (String, String)) {
    run_or_work(
        "redis_reconcile",
        Backend::Redis,
        Mode::Reconcile,
        pg,
        redis,
    );
}

fn redis_park((pg, redis): (String, String)) {
    run_or_work("redis_park", Backend::Redis, Mode::Park, pg, redis);
}

idem_integration::server_tests! {
    blocking POSTGRES => [
        postgres_rerun,
        postgres_reconcile,
        postgres_park,
    ],
    blocking POSTGRES_AND_REDIS => [
        redis_rerun,
        redis_reconcile,
        redis_park,
    ],
}
