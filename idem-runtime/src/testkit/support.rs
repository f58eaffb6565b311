//! What the scenarios, the stores' tests and the benches share: service URLs, one runtime
//! per scenario, unique namespaces, counted bodies and the stampede.

use crate::error::Error;
use crate::key::{self, Digest};
use crate::Idem;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Reads a server URL from `var`. When it is unset: `None` with a line saying what is skipped,
/// or a panic when `IDEM_REQUIRE_SERVICES=1` (CI), so a missing server can never pass silently.
pub fn service_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1") => {
            panic!("IDEM_REQUIRE_SERVICES=1 but {var} is not set: the {what} tests cannot run")
        }
        _ => {
            let why = format!("{what} tests ({var} is not set)");
            SKIPPED.with(|skipped| match &mut *skipped.borrow_mut() {
                // A harness that shows the test as ignored prints the reason itself.
                Some(reason) => *reason = why,
                None => eprintln!("skipped: {why}"),
            });
            None
        }
    }
}

thread_local! {
    /// Inside [`try_scenario`]: why [`service_url`] returned `None` on this thread.
    static SKIPPED: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Whether a scenario ran, or was skipped because its store is not configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// The scenario ran to its end (a failed assertion panics instead).
    Completed,
    /// The store constructor returned `None`; the reason, as [`service_url`] gave it.
    Skipped(String),
}

/// Gives the threads a test harness spawns from now on 8 MiB of stack, unless `RUST_MIN_STACK`
/// says otherwise. Scenarios nest calls (steps) over a store's client, and in a debug build
/// the poll frames of those futures (the AWS SDK's above all) outgrow the default 2 MiB. Call
/// it first in a harness's `main`, before any thread is spawned (what
/// [`crate::conformance_suite!`]'s `main:` form does).
pub fn roomy_test_threads() {
    if std::env::var_os("RUST_MIN_STACK").is_none() {
        std::env::set_var("RUST_MIN_STACK", (8usize << 20).to_string());
    }
}

/// Runs one scenario on a fresh multi-thread runtime (used by [`crate::conformance_suite!`]).
pub fn run_scenario<M, MF, S, SF>(make: M, scenario: S)
where
    M: FnOnce() -> MF,
    MF: std::future::Future<Output = Option<Idem>>,
    S: FnOnce(Idem) -> SF,
    SF: std::future::Future<Output = ()>,
{
    block_on(async move {
        if let Some(idem) = make().await {
            scenario(idem).await;
        }
    });
}

/// [`run_scenario`] for a harness that can ignore a test at run time: says whether the
/// scenario ran or its store was not configured (and why), instead of printing it.
pub fn try_scenario<M, MF, S, SF>(make: M, scenario: S) -> Ran
where
    M: FnOnce() -> MF,
    MF: std::future::Future<Output = Option<Idem>>,
    S: FnOnce(Idem) -> SF,
    SF: std::future::Future<Output = ()>,
{
    // `block_on` polls `make` on this thread, where `service_url` records the reason.
    SKIPPED.with(|skipped| *skipped.borrow_mut() = Some(String::new()));
    let ran = block_on(async move {
        match make().await {
            Some(idem) => {
                scenario(idem).await;
                true
            }
            None => false,
        }
    });
    let why = SKIPPED.with(|skipped| skipped.borrow_mut().take());
    match (ran, why) {
        (true, _) => Ran::Completed,
        (false, Some(why)) if !why.is_empty() => Ran::Skipped(why),
        (false, _) => Ran::Skipped("the store is not configured".to_string()),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

/// `idem` with everything that transforms a stored result turned on, as far as the features
/// built allow: encryption under a ring of two keys (`old`, then `new`, which seals; feature
/// `encryption`), zstd above 64 bytes (feature `compression`), and the local cache with its
/// defaults (feature `cache`). The second opener of
/// [`conformance_suite!`](crate::conformance_suite!)`(…, sealed: …)`: every scenario must pass
/// through it as without.
pub fn sealed(idem: Idem) -> Idem {
    #[cfg(feature = "encryption")]
    let idem = idem.with_encryption(
        crate::Keyring::new("old", [1; 32])
            .and_then(|ring| ring.with_key("new", [2; 32]))
            .expect("two valid keys"),
    );
    #[cfg(feature = "compression")]
    let idem = idem.with_compression(64);
    #[cfg(feature = "cache")]
    let idem = idem.with_cache(crate::CacheOptions::new());
    idem
}

/// A namespace no other scenario, process or earlier run uses.
pub fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{name}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The digest `Call` computes for `key` in namespace `name` without a scope.
pub fn digest<K: Serialize + ?Sized>(name: &str, key: &K) -> Digest {
    key::key_digest(name, None, &key::canonical(key).expect("encodable key"))
}

/// The fingerprint `Call` stores for `fingerprint`.
pub fn fingerprint<F: Serialize + ?Sized>(fingerprint: &F) -> Digest {
    key::fingerprint_digest(&key::canonical(fingerprint).expect("encodable fingerprint"))
}

/// A counted body: how many times the side effect really ran.
#[derive(Clone, Default, Debug)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// One more execution; returns the new count.
    pub fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    /// Executions so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A receipt-like value, to check that what is replayed is what was returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The id the body made.
    pub id: u64,
    /// Some text.
    pub memo: String,
}

/// A body error that scenarios keep or release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TestError {
    /// The body's own failure.
    Declined(String),
    /// An idempotency failure, as text and kind.
    Idem(String),
}

/// The kind of idempotency failure, kept apart from the body's own errors in assertions.
#[derive(Debug)]
pub enum Failure {
    /// The body's error.
    Body(TestError),
    /// An idempotency failure.
    Idem(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

impl From<Error> for TestError {
    fn from(e: Error) -> Self {
        TestError::Idem(e.to_string())
    }
}

/// A stampede: `duplicates` concurrent calls of one new key (in a namespace of its own), all
/// released at once, each waiting (up to 60 s) for the attempt in flight, whose body takes
/// `body` (long enough that the duplicates find it in flight). Panics unless the body ran
/// exactly once and every caller got its value (one fresh, the others replayed). Returns the
/// time from spawning the calls until the last one had its answer.
pub async fn stampede(idem: &Idem, duplicates: usize, body: Duration) -> Duration {
    let name = unique("stampede");
    let c = Counter::default();
    let barrier = Arc::new(tokio::sync::Barrier::new(duplicates));
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..duplicates)
        .map(|_| {
            let (idem, name, c, barrier) = (idem.clone(), name.clone(), c.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                idem.call(name)
                    .key("k")
                    .wait(Duration::from_secs(60))
                    .run(async move {
                        let n = c.hit();
                        tokio::time::sleep(body).await;
                        Ok::<_, Failure>(n)
                    })
                    .await
            })
        })
        .collect();
    let mut fresh = 0;
    for t in tasks {
        let out = t.await.expect("a stampede task").expect("a stampede call");
        fresh += usize::from(!out.is_replayed());
        assert_eq!(
            out.into_inner(),
            1,
            "every caller gets the one execution's value"
        );
    }
    let elapsed = started.elapsed();
    assert_eq!(
        (fresh, c.get()),
        (1, 1),
        "{duplicates} duplicates: exactly one execution, exactly one fresh answer"
    );
    elapsed
}
