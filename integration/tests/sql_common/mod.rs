//! What the PostgreSQL and MySQL test binaries share, parameterised by the backend: unique table
//! names, the side-effect tables and their exactly-once check, the job a worker process is given,
//! a seeded shuffle, and the record of which bodies ran. `pg_common` and `mysql_common` add what
//! only their server has.
#![allow(dead_code)]

use serde::{Deserialize, Serialize};
use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The SQL backend a test runs on: what differs in the text of the test's own statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sql {
    /// PostgreSQL: `"name"`, `$1`.
    Postgres,
    /// MySQL / MariaDB: `` `name` ``, `?`.
    Mysql,
}

impl Sql {
    /// `name` quoted as an identifier.
    pub fn quote(self, name: &str) -> String {
        match self {
            Sql::Postgres => format!("\"{name}\""),
            Sql::Mysql => format!("`{name}`"),
        }
    }

    /// The `n`-th (from 1) bind parameter.
    pub fn param(self, n: usize) -> String {
        match self {
            Sql::Postgres => format!("${n}"),
            Sql::Mysql => "?".to_string(),
        }
    }

    /// How the backend is named in `Error::store`.
    pub fn name(self) -> &'static str {
        match self {
            Sql::Postgres => "postgres",
            Sql::Mysql => "mysql",
        }
    }
}

/// A table name no other test, process or run uses.
pub fn unique_table(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A pool of either backend for the test's own statements on tables of the test's own (the
/// side effects of the process tests), where only the SQL text differs.
pub async fn any_admin(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .expect("admin connection")
}

/// Drops the tables, each if it exists.
pub async fn drop_tables(sql: Sql, admin: &AnyPool, tables: &[&str]) {
    for t in tables {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {}", sql.quote(t)))
            .execute(admin)
            .await;
    }
}

/// The job of the racing and killed worker processes: a store table, a side-effect table
/// without a unique constraint (`k`, `pid`: a key run twice shows as two rows), a namespace and
/// a number of keys. Workers get it in one environment variable.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub sql: Sql,
    pub url: String,
    pub table: String,
    pub side: String,
    pub ns: String,
    pub keys: usize,
}

/// The variable a worker process finds its [`Job`] in.
const JOB: &str = "IDEM_SQL_WORKER_JOB";

impl Job {
    /// A job on new tables (the side-effect table is created; the store's is the store's to
    /// create), and an admin pool.
    pub async fn create(sql: Sql, url: &str, prefix: &str, keys: usize) -> (Job, AnyPool) {
        let admin = any_admin(url).await;
        let table = unique_table(prefix);
        let side = format!("{table}_side");
        sqlx::query(&format!(
            "CREATE TABLE {} (k BIGINT NOT NULL, pid BIGINT NOT NULL)",
            sql.quote(&side)
        ))
        .execute(&admin)
        .await
        .unwrap();
        let job = Job {
            sql,
            url: url.to_string(),
            table,
            side,
            ns: idem::testkit::unique(prefix),
            keys,
        };
        (job, admin)
    }

    /// In a worker process: its job and role, or `None` in the test process itself.
    pub fn of_worker() -> Option<(Job, String)> {
        let json = std::env::var(JOB).ok()?;
        let (job, role): (Job, String) = serde_json::from_str(&json).expect("a worker's job");
        Some((job, role))
    }

    /// Starts this test binary as a worker running the test `test` alone, in role `role`;
    /// its output piped.
    pub fn spawn(&self, test: &str, role: &str) -> Child {
        let json = serde_json::to_string(&(self, role)).unwrap();
        Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(JOB, json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a worker process")
    }

    /// The statement of one side effect: `(k, pid)`.
    pub fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} (k, pid) VALUES ({}, {})",
            self.sql.quote(&self.side),
            self.sql.param(1),
            self.sql.param(2)
        )
    }

    /// Every key has exactly one side-effect row.
    pub async fn assert_exactly_once(&self, admin: &AnyPool) {
        let side = self.sql.quote(&self.side);
        let (distinct, total): (i64, i64) =
            sqlx::query_as(&format!("SELECT COUNT(DISTINCT k), COUNT(*) FROM {side}"))
                .fetch_one(admin)
                .await
                .unwrap();
        let twice: Vec<(i64, i64)> = sqlx::query_as(&format!(
            "SELECT k, COUNT(*) FROM {side} GROUP BY k HAVING COUNT(*) > 1 ORDER BY k LIMIT 10"
        ))
        .fetch_all(admin)
        .await
        .unwrap();
        assert!(twice.is_empty(), "side effects executed twice: {twice:?}");
        assert_eq!((distinct, total), (self.keys as i64, self.keys as i64));
    }

    /// Claims still open in the store's table.
    pub async fn open_claims(&self, admin: &AnyPool) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE status = 0",
            self.sql.quote(&self.table)
        ))
        .fetch_one(admin)
        .await
        .unwrap()
    }

    /// Drops the job's tables.
    pub async fn cleanup(&self, admin: &AnyPool) {
        let migrations = format!("{}_migrations", self.table);
        drop_tables(self.sql, admin, &[&self.table, &migrations, &self.side]).await;
    }
}

/// Waits for a worker that must succeed; its standard output.
pub fn succeeded(child: Child, who: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{who} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of the first `name=value` line a worker printed.
pub fn reported(stdout: &str, name: &str) -> usize {
    stdout
        .lines()
        .find_map(|l| l.split_once(&format!("{name}=")).map(|(_, n)| n))
        .unwrap_or_else(|| panic!("the worker reports its {name}: {stdout}"))
        .trim()
        .parse()
        .unwrap()
}

/// xorshift64*, seeded per process: enough to shuffle keys and pick kill times.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng((nanos ^ (u64::from(std::process::id()) << 32)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn shuffled(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
        v
    }
}

/// The orders whose body ran, once per run (each test uses its own orders: tests run in
/// parallel).
static RUNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records that the body of `order` ran.
pub fn ran(order: &str) {
    RUNS.lock().unwrap().push(order.to_string());
}

/// How many times the body of `order` ran.
pub fn runs(order: &str) -> usize {
    RUNS.lock().unwrap().iter().filter(|o| *o == order).count()
}

/// One racing worker: every key of `job` once, in the order `order`, eight at a time, waiting
/// for duplicates in flight; `effect(k)` is the body's side effect (a row in the side table).
/// Returns how many keys this process ran fresh.
pub async fn race<F, Fut>(idem: &idem::Idem, job: &Job, order: Vec<usize>, effect: F) -> usize
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), idem::Error>> + Send + 'static,
{
    use idem::Error;
    use std::sync::Arc;
    use std::time::Duration;
    let order = Arc::new(order);
    let fresh = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (idem, order, fresh, ns, effect) = (
                idem.clone(),
                order.clone(),
                fresh.clone(),
                job.ns.clone(),
                effect.clone(),
            );
            tokio::spawn(async move {
                for &k in order.iter().skip(t).step_by(8) {
                    loop {
                        let effect = effect.clone();
                        let out = idem
                            .call(ns.clone())
                            .key(&k)
                            .wait(Duration::from_secs(20))
                            .run(async move {
                                effect(k).await?;
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

/// Four worker processes (this binary's test `test` in role `race`) race over the job's keys;
/// asserts that together they ran every key fresh once.
pub fn four_processes_race(job: &Job, test: &str) {
    let workers: Vec<_> = (0..4).map(|_| job.spawn(test, "race")).collect();
    let mut fresh = 0;
    for w in workers {
        let n = reported(&succeeded(w, "worker"), "fresh");
        eprintln!("worker ran {n} keys fresh");
        fresh += n;
    }
    assert_eq!(fresh, job.keys);
}

/// Starts a worker process (test `test`, role `txkill`) fifty times and kills it (`SIGKILL`)
/// after `pause(i)`; how many keys the killed workers reported committed (`C k` lines).
pub fn kill_fifty_times(
    job: &Job,
    test: &str,
    mut pause: impl FnMut(u64) -> std::time::Duration,
) -> usize {
    let mut committed = 0;
    for i in 0..50 {
        let mut child = job.spawn(test, "txkill");
        std::thread::sleep(pause(i));
        child.kill().expect("SIGKILL the worker"); // SIGKILL on Unix
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success());
        committed += String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("C "))
            .count();
    }
    committed
}

/// What the transactional kill test asserts after the kills and a recovery pass over every key:
/// the killed workers got work done, the two counts add up (a worker killed between its commit
/// and its `C` line leaves a key counted by neither), no claim outlives its transaction, and
/// every key's side effect is there exactly once.
pub async fn assert_recovered(
    job: &Job,
    admin: &AnyPool,
    committed_before_kill: usize,
    recovered_fresh: usize,
) {
    assert!(
        committed_before_kill > 0,
        "the workers got work done before the kills"
    );
    assert!(committed_before_kill + recovered_fresh <= job.keys);
    assert!(committed_before_kill + recovered_fresh >= job.keys - 4 * 50);
    assert_eq!(
        job.open_claims(admin).await,
        0,
        "no claim outlives its transaction"
    );
    job.assert_exactly_once(admin).await;
}
