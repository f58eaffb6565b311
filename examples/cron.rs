//! Three schedulers, each its own OS process, fire the same job on every tick of a one-second
//! schedule; they share one idempotency store, and each tick's invoice goes out once. One tick's
//! first run fails (the mail server refuses it): the next instance's attempt runs it again.
//!
//! ```text
//! cargo run --example cron                            # the three share a SQLite file
//! IDEM_CRON_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example cron --features postgres    # ... or a PostgreSQL database
//! ```
//!
//! The parent process starts three copies of itself (`cron scheduler <n> …`), waits for them,
//! then counts the invoices they wrote to a shared ledger file (appended with `O_APPEND`, one
//! `write` per line, so the processes' lines never interleave) and prints a verdict.

use idem::cron::{tick_key, Tick};
use idem::Idem;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The schedule: every second (the shortest period `tick_key` accepts).
const PERIOD: Duration = Duration::from_secs(1);
/// How many ticks each scheduler fires.
const TICKS: u64 = 4;
/// The tick (counted from 0) whose first run fails.
const FAILING: u64 = 1;
/// Where in the period the schedulers fire: away from the boundaries, so that clocks a little
/// apart still agree on the period (see `idem::cron`).
const FIRE_AT: Duration = Duration::from_millis(300);
const SCHEDULERS: usize = 3;

#[derive(Debug)]
enum JobError {
    Idem(idem::Error),
    /// The mail server refused the invoice.
    Mail(String),
    /// The ledger could not be written.
    Ledger(std::io::Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Idem(e) => write!(f, "{e}"),
            JobError::Mail(e) => write!(f, "mail: {e}"),
            JobError::Ledger(e) => write!(f, "ledger: {e}"),
        }
    }
}

impl From<idem::Error> for JobError {
    fn from(e: idem::Error) -> Self {
        JobError::Idem(e)
    }
}

/// What one scheduler process knows: its number, the store, the shared directory (ledger and
/// failure marker) and the first tick.
struct Scheduler {
    instance: usize,
    store: String,
    dir: PathBuf,
    first: u64,
}

impl Scheduler {
    fn ledger(&self) -> PathBuf {
        self.dir.join("invoices.log")
    }

    /// One line in the ledger, in a single `write` on an `O_APPEND` file: atomic between
    /// processes.
    fn record(&self, what: &str, tick: Tick) -> Result<(), JobError> {
        let line = format!("{what} {} {}\n", tick.period_start_unix, self.instance);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.ledger())
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(JobError::Ledger)
    }

    /// The job: render and send the invoice of the period. On the failing tick, the first
    /// attempt (whichever instance makes it: the marker file is created once) is refused.
    async fn send_invoice(&self, tick: Tick) -> Result<u64, JobError> {
        tokio::time::sleep(Duration::from_millis(100)).await; // rendering
        if tick.period_start_unix == self.first + FAILING * PERIOD.as_secs() {
            let marker = self.dir.join(format!("refused-{}", tick.period_start_unix));
            if std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(marker)
                .is_ok()
            {
                self.record("failed", tick)?;
                return Err(JobError::Mail("451 try again later".into()));
            }
        }
        self.record("invoice", tick)?;
        Ok(tick.period_start_unix)
    }

    async fn run(&self) -> Result<(), idem::Error> {
        let idem = open(&self.store).await?;
        for n in 0..TICKS {
            let scheduled =
                UNIX_EPOCH + Duration::from_secs(self.first) + PERIOD * n as u32 + FIRE_AT;
            if let Ok(ahead) = scheduled.duration_since(SystemTime::now()) {
                tokio::time::sleep(ahead).await;
            }
            // The key: the period of the scheduled time (not of `now()`, which a slow start
            // could push into the next period).
            let tick = tick_key(scheduled, PERIOD);
            let out = idem
                .call("cron.period-invoice")
                .key(&tick)
                // Longer than the period: an instance that fires late must still find the
                // finished run and replay it.
                .ttl(5 * PERIOD)
                // Shorter than the period: had the running instance died, the claim would lapse
                // and another instance, firing in the same period, would take over.
                .lease(PERIOD / 2)
                // The instances fire together: the others wait for the one that runs, and
                // replay its result, or, if it fails, one of them runs the job itself.
                .wait(PERIOD * 7 / 10)
                .run(self.send_invoice(tick))
                .await;
            let outcome = match out {
                Ok(o) if o.is_replayed() => "replayed".to_string(),
                Ok(_) => "ran".to_string(),
                Err(JobError::Idem(e)) if e.is_in_progress() => "in-progress".to_string(),
                Err(e) => format!("failed ({e})"),
            };
            println!("tick={n} instance={} {outcome}", self.instance);
        }
        Ok(())
    }
}

async fn open(url: &str) -> Result<Idem, idem::Error> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres") {
        return Idem::postgres(url).await;
    }
    Idem::sqlite(url).await
}

/// PostgreSQL when the build has it and `IDEM_CRON_POSTGRES_URL` names a server, else a SQLite
/// file in `dir`.
fn store_url(dir: &Path) -> (String, String) {
    match std::env::var("IDEM_CRON_POSTGRES_URL") {
        #[cfg(feature = "postgres")]
        Ok(url) => (url, "one PostgreSQL database".to_string()),
        #[cfg(not(feature = "postgres"))]
        Ok(_) => {
            eprintln!(
                "IDEM_CRON_POSTGRES_URL is set but this build has no `postgres` feature \
                 (cargo run --example cron --features postgres): using SQLite"
            );
            sqlite_url(dir)
        }
        Err(_) => sqlite_url(dir),
    }
}

fn sqlite_url(dir: &Path) -> (String, String) {
    let file = dir.join("idem.db");
    (
        format!("sqlite://{}", file.display()),
        format!("one SQLite file ({})", file.display()),
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("scheduler") {
        let [instance, first, dir, store] = &args[2..] else {
            eprintln!("usage: cron scheduler <instance> <first-tick> <dir> <store-url>");
            return ExitCode::from(2);
        };
        let (Ok(instance), Ok(first)) = (instance.parse(), first.parse()) else {
            eprintln!("cron scheduler: <instance> and <first-tick> are numbers");
            return ExitCode::from(2);
        };
        let me = Scheduler {
            instance,
            store: store.clone(),
            dir: PathBuf::from(dir),
            first,
        };
        return match me.run().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("scheduler {instance}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match parent().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cron: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the schedulers, waits for them, and checks the ledger. `Ok(false)`: a tick was
/// invoiced other than once.
async fn parent() -> Result<bool, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("idem-cron-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (url, what) = store_url(&dir);
    // The schema is created once here, before the schedulers open the store.
    open(&url).await?;

    // The first tick starts one to two seconds from now: time for the processes to start.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let first = now + 2;
    println!(
        "{SCHEDULERS} scheduler processes on {what}: {TICKS} ticks of {PERIOD:?}, \
         the run of tick {FAILING} fails once"
    );
    let exe = std::env::current_exe()?;
    let children = (1..=SCHEDULERS)
        .map(|n| {
            Command::new(&exe)
                .arg("scheduler")
                .arg(n.to_string())
                .arg(first.to_string())
                .arg(&dir)
                .arg(&url)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // outcomes[tick][instance]
    let mut outcomes: BTreeMap<u64, BTreeMap<usize, String>> = BTreeMap::new();
    let mut all_ok = true;
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        all_ok &= out.status.success();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut words = line.splitn(3, ' ');
            let (Some(tick), Some(_), Some(outcome)) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            if let Some(Ok(tick)) = tick.strip_prefix("tick=").map(str::parse) {
                outcomes
                    .entry(tick)
                    .or_default()
                    .insert(i + 1, outcome.to_string());
            }
        }
    }

    // ledger[tick] = (instances that sent its invoice, instances whose attempt failed)
    let mut ledger: BTreeMap<u64, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    let text = std::fs::read_to_string(dir.join("invoices.log")).unwrap_or_default();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let [what, start, instance] = words[..] else {
            continue;
        };
        let (Ok(start), Ok(instance)) = (start.parse::<u64>(), instance.parse()) else {
            continue;
        };
        let e = ledger.entry(start.saturating_sub(first)).or_default();
        match what {
            "invoice" => e.0.push(instance),
            _ => e.1.push(instance),
        }
    }

    let mut good = all_ok;
    for tick in 0..TICKS {
        let (invoices, failed) = ledger.get(&tick).cloned().unwrap_or_default();
        let seen = outcomes.get(&tick).cloned().unwrap_or_default();
        let by: Vec<String> = seen.iter().map(|(i, o)| format!("#{i} {o}")).collect();
        println!(
            "tick {tick}: {} invoice(s), {} failed attempt(s); schedulers {}",
            invoices.len(),
            failed.len(),
            by.join(", ")
        );
        good &= invoices.len() == 1 && failed.len() == usize::from(tick == FAILING);
        // The instance whose attempt failed does not retry it: another one did.
        good &= failed.iter().all(|f| !invoices.contains(f));
        good &= seen.len() == SCHEDULERS;
    }
    if good {
        println!(
            "verdict: OK: {TICKS} ticks fired by {SCHEDULERS} processes each, every tick \
             invoiced exactly once; the failed run of tick {FAILING} ran again on another \
             instance's attempt"
        );
    } else {
        println!(
            "verdict: FAILED: a tick was not invoiced exactly once, or a scheduler did not \
             fire every tick"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(good)
}
