//! Cron deduplication across OS processes on one PostgreSQL database: three schedulers fire the
//! same job on every tick of a one-second schedule, keyed by `idem::cron::tick_key`. Each tick's
//! side effect happens once; one tick's first run fails and another instance's attempt runs it
//! again.
//!
//! Schedulers are this test binary itself (`std::env::current_exe()`), running the `scheduler`
//! test with `IDEM_CRON_INSTANCE` set. Without it, `scheduler` runs three schedulers as tasks of
//! one process over two ticks, so it is a test of its own.

mod pg_common;

use idem::cron::{tick_key, Tick};
use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::{Error, Idem};
use pg_common::*;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const INSTANCE: &str = "IDEM_CRON_INSTANCE";
const PERIOD: Duration = Duration::from_secs(1);
/// Fire away from the period boundaries, as `idem::cron` advises.
const FIRE_AT: Duration = Duration::from_millis(300);

#[derive(Clone)]
struct Job {
    url: String,
    table: String,
    /// Side effects, one row per attempt that reached the "send" (`ok = false`: it failed);
    /// no unique constraint, so a tick run twice would show as two rows.
    side: String,
    /// The failing tick's one-shot marker: the first attempt to insert it fails.
    marker: String,
    ns: String,
    first: u64,
    ticks: u64,
    failing: u64,
}

impl Job {
    fn from_env() -> Job {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
        let num = |k: &str| var(k).parse().unwrap();
        Job {
            url: var("IDEM_TEST_POSTGRES_URL"),
            table: var("IDEM_CRON_TABLE"),
            side: var("IDEM_CRON_SIDE"),
            marker: var("IDEM_CRON_MARKER"),
            ns: var("IDEM_CRON_NS"),
            first: num("IDEM_CRON_FIRST"),
            ticks: num("IDEM_CRON_TICKS"),
            failing: num("IDEM_CRON_FAILING"),
        }
    }

    fn env(&self, cmd: &mut Command, instance: usize) {
        cmd.env(INSTANCE, instance.to_string())
            .env("IDEM_TEST_POSTGRES_URL", &self.url)
            .env("IDEM_CRON_TABLE", &self.table)
            .env("IDEM_CRON_SIDE", &self.side)
            .env("IDEM_CRON_MARKER", &self.marker)
            .env("IDEM_CRON_NS", &self.ns)
            .env("IDEM_CRON_FIRST", self.first.to_string())
            .env("IDEM_CRON_TICKS", self.ticks.to_string())
            .env("IDEM_CRON_FAILING", self.failing.to_string());
    }

    fn failing_tick(&self) -> u64 {
        self.first + self.failing * PERIOD.as_secs()
    }
}

/// The store's table, the side-effect table and the marker table; the first tick starts one to
/// two seconds from now, time for the scheduler processes to start.
async fn setup(url: &str, prefix: &str, ticks: u64, failing: u64) -> (Job, sqlx::PgPool) {
    let admin = admin(url).await;
    let table = unique_table(prefix);
    let (side, marker) = (format!("{table}_side"), format!("{table}_marker"));
    for ddl in [
        format!("CREATE TABLE \"{side}\" (tick bigint NOT NULL, instance int NOT NULL, ok bool NOT NULL)"),
        format!("CREATE TABLE \"{marker}\" (tick bigint PRIMARY KEY)"),
    ] {
        sqlx::query(&ddl).execute(&admin).await.unwrap();
    }
    PostgresOptions::from_url(url)
        .unwrap()
        .table(&table)
        .connect()
        .await
        .unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let job = Job {
        url: url.to_string(),
        table,
        side,
        marker,
        ns: idem::testkit::unique(prefix),
        first: now + 2,
        ticks,
        failing,
    };
    (job, admin)
}

async fn cleanup(admin: &sqlx::PgPool, job: &Job) {
    drop_table(admin, &job.table).await;
    drop_table(admin, &job.side).await;
    drop_table(admin, &job.marker).await;
}

/// How the job's body fails: idempotency errors, and the downstream's refusal.
#[derive(Debug)]
enum Fail {
    Idem(Error),
    Refused,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Idem(e)
    }
}

/// The job's body: on the failing tick the attempt that claims the marker fails after writing
/// its side effect; every other attempt writes its side effect and succeeds.
async fn send(store: &PostgresStore, job: &Job, tick: Tick, instance: usize) -> Result<u64, Fail> {
    let pg = |what: &'static str| move |e| Error::store("postgres", what, e);
    tokio::time::sleep(Duration::from_millis(100)).await; // the work itself
    let fails = tick.period_start_unix == job.failing_tick()
        && sqlx::query(&format!(
            "INSERT INTO \"{}\" (tick) VALUES ($1) ON CONFLICT DO NOTHING",
            job.marker
        ))
        .bind(tick.period_start_unix as i64)
        .execute(store.pool())
        .await
        .map_err(pg("marker"))?
        .rows_affected()
            == 1;
    sqlx::query(&format!(
        "INSERT INTO \"{}\" (tick, instance, ok) VALUES ($1, $2, $3)",
        job.side
    ))
    .bind(tick.period_start_unix as i64)
    .bind(instance as i32)
    .bind(!fails)
    .execute(store.pool())
    .await
    .map_err(pg("side effect"))?;
    if fails {
        return Err(Fail::Refused);
    }
    Ok(tick.period_start_unix)
}

/// One scheduler: fires every tick at `FIRE_AT` into its period and returns, per tick, what
/// its call came to: `ran`, `replayed`, `in-progress` or `failed`.
async fn scheduler(job: &Job, instance: usize) -> Vec<(u64, &'static str)> {
    let store = PostgresOptions::from_url(&job.url)
        .unwrap()
        .table(&job.table)
        .max_connections(4)
        .connect()
        .await
        .expect("open the store");
    let idem = Idem::from_store(store.clone());
    let mut fired = Vec::new();
    for n in 0..job.ticks {
        let scheduled = UNIX_EPOCH + Duration::from_secs(job.first) + PERIOD * n as u32 + FIRE_AT;
        if let Ok(ahead) = scheduled.duration_since(SystemTime::now()) {
            tokio::time::sleep(ahead).await;
        }
        let tick = tick_key(scheduled, PERIOD);
        assert_eq!(tick.period_start_unix, job.first + n);
        let out = idem
            .call(job.ns.clone())
            .key(&tick)
            .ttl(10 * PERIOD)
            .lease(PERIOD / 2)
            .wait(PERIOD * 7 / 10)
            .run(send(&store, job, tick, instance))
            .await;
        let what = match out {
            Ok(o) if o.is_replayed() => "replayed",
            Ok(o) => {
                assert_eq!(o.into_inner(), tick.period_start_unix);
                "ran"
            }
            Err(Fail::Idem(e)) if e.is_in_progress() => "in-progress",
            Err(Fail::Refused) => "failed",
            Err(e) => panic!("scheduler {instance}, tick {n}: {e:?}"),
        };
        fired.push((n, what));
    }
    fired
}

/// What the schedulers reported, `outcomes[tick][instance]`, checked against the side-effect
/// table: every instance fired every tick; every tick's side effect happened exactly once, and
/// the failing tick was attempted twice, by two instances.
async fn check(
    admin: &sqlx::PgPool,
    job: &Job,
    outcomes: &BTreeMap<u64, BTreeMap<usize, String>>,
    instances: usize,
) {
    let rows: Vec<(i64, i32, bool)> = sqlx::query_as(&format!(
        "SELECT tick, instance, ok FROM \"{}\" ORDER BY tick, ok",
        job.side
    ))
    .fetch_all(admin)
    .await
    .unwrap();
    for n in 0..job.ticks {
        let start = (job.first + n) as i64;
        let ok: Vec<i32> = rows
            .iter()
            .filter(|r| r.0 == start && r.2)
            .map(|r| r.1)
            .collect();
        let failed: Vec<i32> = rows
            .iter()
            .filter(|r| r.0 == start && !r.2)
            .map(|r| r.1)
            .collect();
        let seen = outcomes.get(&n).cloned().unwrap_or_default();
        eprintln!("tick {n}: side effects by {ok:?}, failed attempts by {failed:?}; {seen:?}");
        assert_eq!(ok.len(), 1, "tick {n}: side effect exactly once ({rows:?})");
        if n == job.failing {
            assert_eq!(failed.len(), 1, "tick {n}: one failed attempt ({rows:?})");
            assert_ne!(
                failed, ok,
                "tick {n}: the retry was another instance's attempt"
            );
            assert_eq!(
                seen.get(&(failed[0] as usize)).map(String::as_str),
                Some("failed")
            );
        } else {
            assert!(failed.is_empty(), "tick {n}: no failed attempt ({rows:?})");
        }
        assert_eq!(
            seen.len(),
            instances,
            "tick {n}: every instance fired ({seen:?})"
        );
        let count = |w: &str| seen.values().filter(|o| *o == w).count();
        assert_eq!(count("ran"), 1, "tick {n}: one instance ran it ({seen:?})");
        assert_eq!(count("failed"), usize::from(n == job.failing), "{seen:?}");
        // The dedup was exercised: every other instance's call was answered without a run.
        assert_eq!(
            count("replayed") + count("in-progress"),
            instances - 1 - usize::from(n == job.failing),
            "tick {n}: {seen:?}"
        );
    }
}

fn scheduler_role(url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(INSTANCE) {
        Ok(instance) => {
            let instance: usize = instance.parse().unwrap();
            for (n, what) in rt.block_on(scheduler(&Job::from_env(), instance)) {
                println!("\ntick={n} {what}");
            }
        }
        // Not a scheduler process: three schedulers as tasks of this one, over two ticks.
        Err(_) => rt.block_on(async {
            let (job, admin) = setup(&url, "cronin", 2, 0).await;
            let tasks: Vec<_> = (1..=3)
                .map(|i| {
                    let job = job.clone();
                    tokio::spawn(async move { (i, scheduler(&job, i).await) })
                })
                .collect();
            let mut outcomes: BTreeMap<u64, BTreeMap<usize, String>> = BTreeMap::new();
            for t in tasks {
                let (i, fired) = t.await.unwrap();
                for (n, what) in fired {
                    outcomes.entry(n).or_default().insert(i, what.to_string());
                }
            }
            check(&admin, &job, &outcomes, 3).await;
            cleanup(&admin, &job).await;
        }),
    }
}

/// Three scheduler processes, four ticks, the second tick's first run failing.
fn three_scheduler_processes_run_each_tick_once(url: String) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (job, admin) = rt.block_on(setup(&url, "cron", 4, 1));
    let children: Vec<_> = (1..=3)
        .map(|i| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "scheduler_role",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            job.env(&mut cmd, i);
            (i, cmd.spawn().expect("spawn a scheduler process"))
        })
        .collect();
    let mut outcomes: BTreeMap<u64, BTreeMap<usize, String>> = BTreeMap::new();
    for (i, child) in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scheduler {i} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            if let Some((n, what)) = line.strip_prefix("tick=").and_then(|l| l.split_once(' ')) {
                outcomes
                    .entry(n.parse().unwrap())
                    .or_default()
                    .insert(i, what.to_string());
            }
        }
    }
    rt.block_on(check(&admin, &job, &outcomes, 3));
    rt.block_on(cleanup(&admin, &job));
}

idem_integration::server_tests! {
    blocking POSTGRES => [
        scheduler_role,
        three_scheduler_processes_run_each_tick_once,
    ],
}
