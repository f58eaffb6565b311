//! Resumable calls across OS processes (`#[idempotent(resume)]`, `Idem::resumer`): a process
//! killed mid-call is finished by another process that runs only a resumer, within the lease
//! plus the poll interval, its effect once; resumers in two processes racing for 200 abandoned
//! calls resume each once; stored arguments that no longer decode park the key. On SQLite (a
//! file), PostgreSQL, MySQL and Redis.
//!
//! Callers and resumers are this test binary itself (`std::env::current_exe()`), running the
//! `child` test with `IDEM_RESUME_ROLE` set; without it, `child` is a quick in-process check.
//! Effects are lines appended to a file (`<run> <order> <ms since the epoch>`): a call run
//! twice shows as two lines.

use idem::store::{Claim, ClaimOutcome, Status};
use idem::{idempotent, Idem};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROLE: &str = "IDEM_RESUME_ROLE";
const LEASE: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(200);
const NAME: &str = "resume_proc.pay";

#[derive(Debug)]
struct AppError(#[allow(dead_code)] String);

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        AppError(e.to_string())
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The call under test: a first attempt announces itself and hangs (its process is killed
/// there); a resumed one makes the effect.
#[idempotent(resume, lease = "1s", name = "resume_proc.pay")]
async fn pay(run: String, order: u64, effects: String) -> Result<u64, AppError> {
    if idem::recovery().is_none() {
        println!("in body {order}");
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&effects)
        .map_err(|e| AppError(e.to_string()))?;
    // One write(2) per line: with O_APPEND it lands whole even when two resumer processes
    // append at once (`writeln!` on a File may split a line over several writes).
    let line = format!("{run} {order} {}\n", now_ms());
    f.write_all(line.as_bytes())
        .map_err(|e| AppError(e.to_string()))?;
    Ok(order)
}

async fn open(url: &str) -> Idem {
    let idem = match url.split(':').next().unwrap_or("") {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Idem::postgres(url).await,
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Idem::mysql(url).await,
        #[cfg(feature = "redis")]
        "redis" => Idem::redis(url).await,
        _ => Idem::sqlite(url).await,
    };
    idem.expect("the store opens")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// A child process: `caller` makes `IDEM_RESUME_CALLS` calls that hang (and prints `ready`
/// once all are in their bodies), `worker` runs a resumer until it is killed.
fn child(_: ()) {
    let Ok(role) = std::env::var(ROLE) else {
        return in_process_check();
    };
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let (url, run, effects) = (
        var("IDEM_RESUME_URL"),
        var("IDEM_RESUME_RUN"),
        var("IDEM_RESUME_EFFECTS"),
    );
    runtime().block_on(async move {
        let idem = open(&url).await;
        idem.clone().install();
        match role.as_str() {
            "caller" => {
                let calls: u64 = var("IDEM_RESUME_CALLS").parse().unwrap();
                for order in 0..calls {
                    tokio::spawn(pay(run.clone(), order, effects.clone()));
                }
                // Each body prints its line; the parent counts them, then kills this process.
                tokio::time::sleep(Duration::from_secs(120)).await;
            }
            "worker" => {
                let _resumer = idem
                    .resumer()
                    .only([NAME])
                    .poll(POLL)
                    .concurrency(16)
                    .spawn()
                    .expect("the resumer starts");
                tokio::time::sleep(Duration::from_secs(120)).await;
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// Without a role: the function is registered and a resumer on SQLite in memory finds nothing.
fn in_process_check() {
    runtime().block_on(async {
        let idem = Idem::sqlite("sqlite::memory:").await.unwrap();
        let resumer = idem.resumer().only([NAME]);
        assert_eq!(resumer.functions().unwrap().len(), 1);
        assert_eq!(resumer.run_once().await.unwrap().found, 0);
    });
}

struct Run {
    url: String,
    run: String,
    effects: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Run {
    fn new(url: &str) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let url = if url.is_empty() {
            format!("sqlite://{}", dir.path().join("idem.db").display())
        } else {
            url.to_string()
        };
        Run {
            url,
            run: format!("run{}-{}", std::process::id(), now_ms()),
            effects: dir.path().join("effects.log"),
            _dir: dir,
        }
    }

    fn spawn(&self, role: &str, calls: u64) -> Child {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
            .env(ROLE, role)
            .env("IDEM_RESUME_URL", &self.url)
            .env("IDEM_RESUME_RUN", &self.run)
            .env("IDEM_RESUME_EFFECTS", &self.effects)
            .env("IDEM_RESUME_CALLS", calls.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    /// Starts a caller of `calls` calls, waits until every one is in its body, kills it:
    /// when it was killed.
    fn kill_mid_call(&self, calls: u64) -> u128 {
        let mut caller = self.spawn("caller", calls);
        let out = BufReader::new(caller.stdout.take().unwrap());
        let mut in_body = 0;
        for line in out.lines() {
            if line.unwrap().contains("in body") {
                in_body += 1;
                if in_body == calls {
                    break;
                }
            }
        }
        assert_eq!(in_body, calls, "every call reached its body");
        caller.kill().unwrap();
        let killed = now_ms();
        caller.wait().unwrap();
        killed
    }

    /// This run's effects by order: the times they happened.
    fn effects(&self) -> BTreeMap<u64, Vec<u128>> {
        let text = std::fs::read_to_string(&self.effects).unwrap_or_default();
        let mut out = BTreeMap::<u64, Vec<u128>>::new();
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            if parts[0] == self.run {
                out.entry(parts[1].parse().unwrap())
                    .or_default()
                    .push(parts[2].parse().unwrap());
            }
        }
        out
    }

    /// Waits until `calls` orders have an effect (or `limit` passes), then a little more, so
    /// that a second run of any would show.
    fn settle(&self, calls: u64, limit: Duration) -> BTreeMap<u64, Vec<u128>> {
        let start = Instant::now();
        while (self.effects().len() as u64) < calls && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(LEASE + POLL * 2);
        self.effects()
    }
}

fn stop(mut children: Vec<Child>) {
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Percentile `p` (0..=100) of sorted `v`.
fn percentile(v: &[u128], p: usize) -> u128 {
    v[((v.len() - 1) * p) / 100]
}

/// `calls` calls killed mid-body, finished by `workers` resumer processes: each once; the
/// latencies from the kill to the effect, sorted.
fn killed_and_resumed(url: &str, calls: u64, workers: usize) -> Vec<u128> {
    let run = Run::new(url);
    let resumers: Vec<Child> = (0..workers).map(|_| run.spawn("worker", 0)).collect();
    let killed = run.kill_mid_call(calls);
    let effects = run.settle(calls, Duration::from_secs(30));
    stop(resumers);
    assert_eq!(
        effects.len() as u64,
        calls,
        "every call finished: {effects:?}"
    );
    let twice: Vec<_> = effects.iter().filter(|(_, t)| t.len() != 1).collect();
    assert!(
        twice.is_empty(),
        "calls whose effect happened twice: {twice:?}"
    );
    let mut lat: Vec<u128> = effects
        .values()
        .map(|t| t[0].saturating_sub(killed))
        .collect();
    lat.sort();
    eprintln!(
        "resume latency after a kill ({calls} calls, {workers} resumer process(es), lease {LEASE:?}, poll {POLL:?}): p50 {} ms, p99 {} ms, max {} ms",
        percentile(&lat, 50),
        percentile(&lat, 99),
        lat[lat.len() - 1]
    );
    lat
}

fn a_killed_call_is_finished_by_another_process(url: &str) {
    let lat = killed_and_resumed(url, 1, 1);
    // Within the lease and a poll, with slack for a loaded machine.
    let bound = (LEASE + POLL).as_millis() + 2_000;
    assert!(
        lat[0] <= bound,
        "resumed {} ms after the kill (bound {bound} ms)",
        lat[0]
    );
}

fn two_resumers_race_for_200_calls(url: &str) {
    killed_and_resumed(url, 200, 2);
}

fn latency_with_one_and_three_resumers(url: &str) {
    killed_and_resumed(url, 50, 1);
    killed_and_resumed(url, 50, 3);
}

fn undecodable_arguments_park_the_key(url: &str) {
    let run = Run::new(url);
    runtime().block_on(async {
        let idem = open(&run.url).await;
        // A call of an older deploy, whose `order` was a string.
        let key = idem::key::Digest(*b"resume_proc undecodable argument");
        let mut bytes = key.0;
        bytes[..8].copy_from_slice(&(now_ms() as u64).to_be_bytes());
        let key = idem::key::Digest(bytes);
        let claim = Claim {
            name: NAME,
            key: &key,
            fingerprint: &key,
            lease: Duration::from_millis(300),
            ttl: Duration::from_secs(600),
        };
        let ClaimOutcome::Claimed { token, .. } = idem.store().claim(claim).await.unwrap() else {
            panic!("a fresh key")
        };
        let mut args = vec![1u8, b'a'];
        args.extend_from_slice(format!(r#"["{}", "forty-two", "/dev/null"]"#, run.run).as_bytes());
        assert!(idem.store().keep_args(&key, token, &args).await.unwrap());
        tokio::time::sleep(Duration::from_millis(600)).await;
        // This resumer parks it, or one of a concurrent test's resumer processes (same store,
        // same function) did first.
        idem.resumer().only([NAME]).run_once().await.unwrap();
        let record = idem.store().get(&key).await.unwrap().expect("parked, live");
        assert_eq!(record.status, Status::Parked);
    });
}

#[cfg(feature = "postgres")]
fn postgres_killed(url: String) {
    a_killed_call_is_finished_by_another_process(&url)
}
#[cfg(feature = "postgres")]
fn postgres_race(url: String) {
    two_resumers_race_for_200_calls(&url)
}
#[cfg(feature = "postgres")]
fn postgres_latency(url: String) {
    latency_with_one_and_three_resumers(&url)
}
#[cfg(feature = "postgres")]
fn postgres_undecodable(url: String) {
    undecodable_arguments_park_the_key(&url)
}
#[cfg(feature = "mysql")]
fn mysql_killed(url: String) {
    a_killed_call_is_finished_by_another_process(&url)
}
#[cfg(feature = "mysql")]
fn mysql_race(url: String) {
    two_resumers_race_for_200_calls(&url)
}
#[cfg(feature = "mysql")]
fn mysql_undecodable(url: String) {
    undecodable_arguments_park_the_key(&url)
}
#[cfg(feature = "redis")]
fn redis_killed(url: String) {
    a_killed_call_is_finished_by_another_process(&url)
}
#[cfg(feature = "redis")]
fn redis_race(url: String) {
    two_resumers_race_for_200_calls(&url)
}
#[cfg(feature = "redis")]
fn redis_undecodable(url: String) {
    undecodable_arguments_park_the_key(&url)
}
fn sqlite_killed(_: ()) {
    a_killed_call_is_finished_by_another_process("")
}
fn sqlite_race(_: ()) {
    two_resumers_race_for_200_calls("")
}
fn sqlite_latency(_: ()) {
    latency_with_one_and_three_resumers("")
}
fn sqlite_undecodable(_: ()) {
    undecodable_arguments_park_the_key("")
}

idem_integration::server_tests! {
    blocking ANYWHERE => [
        child,
        sqlite_killed,
        sqlite_race,
        sqlite_latency,
        sqlite_undecodable,
    ],
    blocking POSTGRES => [
        #[cfg(feature = "postgres")] postgres_killed,
        #[cfg(feature = "postgres")] postgres_race,
        #[cfg(feature = "postgres")] postgres_latency,
        #[cfg(feature = "postgres")] postgres_undecodable,
    ],
    blocking MYSQL => [
        #[cfg(feature = "mysql")] mysql_killed,
        #[cfg(feature = "mysql")] mysql_race,
        #[cfg(feature = "mysql")] mysql_undecodable,
    ],
    blocking REDIS => [
        #[cfg(feature = "redis")] redis_killed,
        #[cfg(feature = "redis")] redis_race,
        #[cfg(feature = "redis")] redis_undecodable,
    ],
}
