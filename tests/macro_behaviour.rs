//! `#[idempotent]` end to end on the memory store: real calls, bodies counted.

use idem::{idempotent, Idem, OnError};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize, PartialEq, Clone)]
enum AppError {
    Idem(String),
    Mismatch,
    InProgress,
    Declined(String),
    Transient,
}

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        match e {
            idem::Error::Mismatch { .. } => AppError::Mismatch,
            idem::Error::InProgress { .. } => AppError::InProgress,
            other => AppError::Idem(other.to_string()),
        }
    }
}

mod app {
    /// An `io::Result`-style alias.
    pub type Result<T> = std::result::Result<T, super::AppError>;
}

/// Counts body runs; not `Serialize`, so it must be skipped.
#[derive(Default)]
struct Counter(AtomicUsize);

impl Counter {
    fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------- default key

#[idempotent(store = idem, skip(runs))]
async fn charge(order: u64, amount: u64, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    Ok(order * 1000 + amount)
}

#[tokio::test]
async fn body_runs_once_and_replays() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(charge(1, 50, &idem, &runs).await, Ok(1050));
    assert_eq!(charge(1, 50, &idem, &runs).await, Ok(1050));
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn default_key_is_every_argument_not_skipped() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(charge(1, 50, &idem, &runs).await, Ok(1050));
    assert_eq!(charge(1, 60, &idem, &runs).await, Ok(1060));
    assert_eq!(charge(2, 50, &idem, &runs).await, Ok(2050));
    assert_eq!(runs.get(), 3);
    // A skipped argument is not in the key: another counter, same key, a replay.
    let other = Counter::default();
    assert_eq!(charge(1, 60, &idem, &other).await, Ok(1060));
    assert_eq!(other.get(), 0);
}

// ---------------------------------------------------------------- key and fingerprint

#[idempotent(key = order, store = idem, skip(runs))]
async fn pay(order: u64, amount: u64, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    Ok(amount)
}

#[tokio::test]
async fn key_given_fingerprint_defaults_to_the_arguments() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(pay(7, 10, &idem, &runs).await, Ok(10));
    assert_eq!(pay(7, 10, &idem, &runs).await, Ok(10));
    // Same key, other arguments: refused, and the refusal reaches the caller as `E::from`.
    assert_eq!(pay(7, 20, &idem, &runs).await, Err(AppError::Mismatch));
    assert_eq!(runs.get(), 1);
}

#[idempotent(key = req.0, fingerprint = req.1, store = idem, skip(runs))]
async fn pay_fp(req: (u64, u64, u64), idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    Ok(req.2)
}

#[tokio::test]
async fn explicit_fingerprint() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(pay_fp((1, 5, 100), &idem, &runs).await, Ok(100));
    // The third field is neither key nor fingerprint: a replay.
    assert_eq!(pay_fp((1, 5, 999), &idem, &runs).await, Ok(100));
    assert_eq!(
        pay_fp((1, 6, 100), &idem, &runs).await,
        Err(AppError::Mismatch)
    );
    assert_eq!(runs.get(), 1);
}

// ---------------------------------------------------------------- on_error

#[idempotent(store = idem, skip(runs))]
async fn flaky_release(n: u64, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    if runs.hit() == 1 {
        return Err(AppError::Transient);
    }
    Ok(n)
}

#[tokio::test]
async fn default_policy_releases_errors() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(
        flaky_release(3, &idem, &runs).await,
        Err(AppError::Transient)
    );
    assert_eq!(flaky_release(3, &idem, &runs).await, Ok(3));
    assert_eq!(flaky_release(3, &idem, &runs).await, Ok(3));
    assert_eq!(runs.get(), 2);
}

#[idempotent(store = idem, skip(runs), on_error = keep)]
async fn declined(n: u64, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    Err(AppError::Declined(format!("card {n}")))
}

#[tokio::test]
async fn on_error_keep_replays_the_error() {
    let idem = Idem::memory();
    let runs = Counter::default();
    let want = Err(AppError::Declined("card 4".into()));
    assert_eq!(declined(4, &idem, &runs).await, want);
    assert_eq!(declined(4, &idem, &runs).await, want);
    assert_eq!(runs.get(), 1);
}

fn keep_final(e: &AppError) -> OnError {
    match e {
        AppError::Transient => OnError::Release,
        _ => OnError::Keep,
    }
}

#[idempotent(store = idem, skip(runs, fail), on_error = keep_final)]
async fn decided(n: u64, fail: AppError, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    let _ = n;
    Err(fail)
}

#[tokio::test]
async fn on_error_path_decides_per_error() {
    let idem = Idem::memory();
    let runs = Counter::default();
    // Transient: released, so the next call runs again.
    assert_eq!(
        decided(1, AppError::Transient, &idem, &runs).await,
        Err(AppError::Transient)
    );
    assert_eq!(
        decided(1, AppError::Transient, &idem, &runs).await,
        Err(AppError::Transient)
    );
    assert_eq!(runs.get(), 2);
    // Declined: kept and replayed, whatever error the next attempt would have had.
    let final_err = AppError::Declined("no".into());
    assert_eq!(
        decided(2, final_err.clone(), &idem, &runs).await,
        Err(final_err.clone())
    );
    assert_eq!(
        decided(2, AppError::Transient, &idem, &runs).await,
        Err(final_err)
    );
    assert_eq!(runs.get(), 3);
}

// ---------------------------------------------------------------- name and scope

#[idempotent(store = idem, skip(runs), name = "shared.v1")]
async fn shared_a(n: u64, idem: &Idem, runs: &Counter) -> Result<String, AppError> {
    runs.hit();
    Ok(format!("a{n}"))
}

#[idempotent(store = idem, skip(runs), name = "shared.v1")]
async fn shared_b(n: u64, idem: &Idem, runs: &Counter) -> Result<String, AppError> {
    runs.hit();
    Ok(format!("b{n}"))
}

#[idempotent(store = idem, skip(runs))]
async fn own_name(n: u64, idem: &Idem, runs: &Counter) -> Result<String, AppError> {
    runs.hit();
    Ok(format!("c{n}"))
}

#[tokio::test]
async fn name_is_the_namespace() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(shared_a(1, &idem, &runs).await, Ok("a1".into()));
    // Same name, same key: b replays a's result.
    assert_eq!(shared_b(1, &idem, &runs).await, Ok("a1".into()));
    assert_eq!(runs.get(), 1);
    // Another name (the default: the function's), same key: its own namespace.
    assert_eq!(own_name(1, &idem, &runs).await, Ok("c1".into()));
    assert_eq!(runs.get(), 2);
}

#[idempotent(store = idem, skip(runs, tenant), scope = tenant)]
async fn scoped(tenant: &str, n: u64, idem: &Idem, runs: &Counter) -> Result<String, AppError> {
    runs.hit();
    Ok(format!("{tenant}:{n}"))
}

#[tokio::test]
async fn scope_separates_keys() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(scoped("acme", 1, &idem, &runs).await, Ok("acme:1".into()));
    assert_eq!(
        scoped("umbrella", 1, &idem, &runs).await,
        Ok("umbrella:1".into())
    );
    assert_eq!(scoped("acme", 1, &idem, &runs).await, Ok("acme:1".into()));
    assert_eq!(runs.get(), 2);
}

// ---------------------------------------------------------------- methods, generics, traits

struct Account {
    idem: Idem,
    balance: u64,
}

impl Account {
    /// A `&mut self` method; the handle is a field.
    #[idempotent(store = self.idem)]
    async fn deposit(&mut self, id: u64, amount: u64) -> Result<u64, AppError> {
        let _ = id;
        self.balance += amount;
        Ok(self.balance)
    }
}

#[tokio::test]
async fn mut_self_method() {
    let mut acct = Account {
        idem: Idem::memory(),
        balance: 0,
    };
    assert_eq!(acct.deposit(1, 10).await, Ok(10));
    assert_eq!(acct.deposit(1, 10).await, Ok(10));
    assert_eq!(acct.deposit(2, 5).await, Ok(15));
    assert_eq!(acct.balance, 15);
}

struct Service {
    idem: Arc<Idem>,
    runs: Counter,
}

impl Service {
    /// A `&self` method; the handle is an `Arc<Idem>` field.
    #[idempotent(store = self.idem)]
    async fn lookup(&self, id: u64) -> app::Result<u64> {
        self.runs.hit();
        Ok(id + 1)
    }
}

#[tokio::test]
async fn ref_self_method_with_arc_and_result_alias() {
    let svc = Service {
        idem: Arc::new(Idem::memory()),
        runs: Counter::default(),
    };
    assert_eq!(svc.lookup(1).await, Ok(2));
    assert_eq!(svc.lookup(1).await, Ok(2));
    assert_eq!(svc.runs.get(), 1);
}

#[idempotent(store = idem, skip(runs))]
async fn echo<T>(value: T, idem: &Idem, runs: &Counter) -> Result<T, AppError>
where
    T: Serialize + DeserializeOwned + Send,
{
    runs.hit();
    Ok(value)
}

#[tokio::test]
async fn generic_fn() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(echo(vec![1u8, 2], &idem, &runs).await, Ok(vec![1, 2]));
    assert_eq!(echo(vec![1u8, 2], &idem, &runs).await, Ok(vec![1, 2]));
    assert_eq!(
        echo("x".to_string(), &idem, &runs).await,
        Ok("x".to_string())
    );
    assert_eq!(runs.get(), 2);
}

trait Charger {
    async fn charge(&self, order: u64) -> Result<u64, AppError>;
}

struct Stripe {
    idem: Idem,
    runs: Counter,
}

impl Charger for Stripe {
    #[idempotent(store = self.idem)]
    async fn charge(&self, order: u64) -> Result<u64, AppError> {
        self.runs.hit();
        Ok(order)
    }
}

#[tokio::test]
async fn trait_impl() {
    let s = Stripe {
        idem: Idem::memory(),
        runs: Counter::default(),
    };
    assert_eq!(s.charge(9).await, Ok(9));
    assert_eq!(s.charge(9).await, Ok(9));
    assert_eq!(s.runs.get(), 1);
}

// ---------------------------------------------------------------- body features

#[idempotent(store = idem, skip(seen))]
async fn keyed(n: u64, idem: &Idem, seen: &Mutex<Vec<Option<String>>>) -> Result<u64, AppError> {
    let first = {
        let mut seen = seen.lock().unwrap();
        seen.push(idem::current_key());
        seen.len() == 1
    };
    if first {
        return Err(AppError::Transient);
    }
    Ok(n)
}

#[tokio::test]
async fn current_key_is_stable_across_retries() {
    let idem = Idem::memory();
    let seen = Mutex::new(Vec::new());
    assert_eq!(idem::current_key(), None);
    assert_eq!(keyed(5, &idem, &seen).await, Err(AppError::Transient));
    assert_eq!(keyed(5, &idem, &seen).await, Ok(5));
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].is_some());
    assert_eq!(seen[0], seen[1]);
    assert_eq!(idem::current_key(), None);
}

#[idempotent(store = idem, skip(runs))]
async fn with_question_mark(
    text: String,
    mut extra: Vec<u64>,
    idem: &Idem,
    runs: &Counter,
) -> Result<u64, AppError> {
    runs.hit();
    let n: u64 = text.parse().map_err(|_| AppError::Transient)?;
    extra.push(n);
    Ok(extra.iter().sum())
}

#[tokio::test]
async fn question_mark_and_mut_arguments() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(
        with_question_mark("5".into(), vec![1, 2], &idem, &runs).await,
        Ok(8)
    );
    assert_eq!(
        with_question_mark("5".into(), vec![1, 2], &idem, &runs).await,
        Ok(8)
    );
    assert_eq!(
        with_question_mark("x".into(), vec![], &idem, &runs).await,
        Err(AppError::Transient)
    );
    assert_eq!(runs.get(), 2);
}

// ---------------------------------------------------------------- stores, Send, durations

static INSTALLED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent]
async fn no_store(n: u64) -> Result<u64, AppError> {
    INSTALLED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(n * 2)
}

#[tokio::test]
async fn installed_handle_for_a_storeless_fn() {
    // The only test that installs: the installed handle is process-wide.
    Idem::memory().install();
    assert_eq!(no_store(21).await, Ok(42));
    assert_eq!(no_store(21).await, Ok(42));
    assert_eq!(INSTALLED_RUNS.load(Ordering::SeqCst), 1);
}

static STORE: LazyLock<Idem> = LazyLock::new(Idem::memory);
static SPAWNED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(store = STORE)]
async fn spawned(n: u64) -> Result<u64, AppError> {
    SPAWNED_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::task::yield_now().await;
    Ok(n)
}

fn assert_send<F: std::future::Future + Send>(f: F) -> F {
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_is_send_and_spawnable() {
    let a = tokio::spawn(assert_send(spawned(11)));
    assert_eq!(a.await.unwrap(), Ok(11));
    let b = tokio::spawn(spawned(11));
    assert_eq!(b.await.unwrap(), Ok(11));
    assert_eq!(SPAWNED_RUNS.load(Ordering::SeqCst), 1);
}

#[idempotent(store = idem, skip(runs), ttl = "300ms", lease = Duration::from_secs(5))]
async fn short_lived(n: u64, idem: &Idem, runs: &Counter) -> Result<u64, AppError> {
    runs.hit();
    Ok(n)
}

#[tokio::test]
async fn ttl_literal_and_lease_expression() {
    let idem = Idem::memory();
    let runs = Counter::default();
    assert_eq!(short_lived(1, &idem, &runs).await, Ok(1));
    assert_eq!(short_lived(1, &idem, &runs).await, Ok(1));
    assert_eq!(runs.get(), 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The ttl has passed: the key is free again.
    assert_eq!(short_lived(1, &idem, &runs).await, Ok(1));
    assert_eq!(runs.get(), 2);
}

#[idempotent(store = idem, skip(runs), wait = "5s")]
async fn slow_waiting(n: u64, idem: Idem, runs: Arc<Counter>) -> Result<u64, AppError> {
    runs.hit();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(n)
}

#[idempotent(store = idem, skip(runs))]
async fn slow(n: u64, idem: Idem, runs: Arc<Counter>) -> Result<u64, AppError> {
    runs.hit();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replays_the_attempt_in_flight() {
    let idem = Idem::memory();
    let runs = Arc::new(Counter::default());
    let first = tokio::spawn(slow_waiting(1, idem.clone(), runs.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(slow_waiting(1, idem.clone(), runs.clone()).await, Ok(1));
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(runs.get(), 1);

    // Without `wait`, a duplicate in flight is refused at once.
    let first = tokio::spawn(slow(1, idem.clone(), runs.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        slow(1, idem.clone(), runs.clone()).await,
        Err(AppError::InProgress)
    );
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(runs.get(), 2);
}

mod steps {
    use idem::{idempotent, Idem};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CHARGES: AtomicUsize = AtomicUsize::new(0);
    static GLOBAL: AtomicUsize = AtomicUsize::new(0);
    /// Not the installed handle: other tests in this binary install theirs concurrently.
    static STORE: std::sync::LazyLock<Idem> = std::sync::LazyLock::new(Idem::memory);

    #[idempotent(step, store = STORE)]
    async fn charge_step(order: u64) -> Result<usize, idem::Error> {
        Ok(CHARGES.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Not a step: deduplicated across every caller by its own key.
    #[idempotent(name = "steps-global-receipt", store = STORE)]
    async fn global_receipt(customer: u64) -> Result<usize, idem::Error> {
        Ok(GLOBAL.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(key = order, store = STORE)]
    async fn parent(order: u64, fail: bool) -> Result<usize, idem::Error> {
        let n = charge_step(order).await?;
        global_receipt(9).await?;
        if fail {
            return Err(idem::Error::Config("later failure".into()));
        }
        Ok(n)
    }

    #[tokio::test]
    async fn step_functions_replay_on_the_parents_retry() {
        assert!(parent(1, true).await.is_err());
        assert_eq!(parent(1, false).await.unwrap(), 1);
        assert_eq!(
            parent(2, false).await.unwrap(),
            2,
            "another parent runs its own step"
        );
        assert_eq!(CHARGES.load(Ordering::SeqCst), 2);
        assert_eq!(
            GLOBAL.load(Ordering::SeqCst),
            1,
            "the non-step call is global"
        );
        // Outside any parent, a step is an ordinary top-level call.
        assert_eq!(charge_step(77).await.unwrap(), 3);
        assert_eq!(charge_step(77).await.unwrap(), 3);
    }
}

/// Steps as the contract says: `idem::step` takes its key by value (any `Serialize`), a step
/// inherits its parent's TTL, and a `ttl` written on a step is honoured as written, also when
/// it is longer than the parent's.
mod step_keys_and_ttl {
    use idem::{idempotent, Idem};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    static KEPT: AtomicUsize = AtomicUsize::new(0);
    static STORE: std::sync::LazyLock<Idem> = std::sync::LazyLock::new(Idem::memory);

    /// Longer than its parent's 200 ms.
    #[idempotent(step, store = STORE, ttl = "1h")]
    async fn kept_step(order: u64) -> Result<usize, idem::Error> {
        Ok(KEPT.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[tokio::test]
    async fn keys_by_value_and_the_steps_own_ttl() {
        let (inherited, by_value) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
        let parent = move |fail: bool| {
            STORE
                .call("step-ttl-parent")
                .key("order-1")
                .ttl(Duration::from_millis(200))
                .run(async move {
                    let name = String::from("pack");
                    let id = 7u64;
                    // Keys by value: a tuple, a reference, a plain integer.
                    idem::step(("ship", id), || async {
                        Ok::<_, idem::Error>(by_value.fetch_add(1, Ordering::SeqCst))
                    })
                    .await?;
                    idem::step(&name, || async { Ok::<_, idem::Error>(()) }).await?;
                    idem::step(id, || async {
                        Ok::<_, idem::Error>(inherited.fetch_add(1, Ordering::SeqCst))
                    })
                    .await?;
                    kept_step(1).await?;
                    if fail {
                        return Err(idem::Error::Config("later failure".into()));
                    }
                    Ok(())
                })
        };
        assert!(parent(true).await.is_err());
        // The parent's retry at once replays every finished step.
        assert!(parent(true).await.is_err());
        assert_eq!(by_value.load(Ordering::SeqCst), 1);
        assert_eq!(inherited.load(Ordering::SeqCst), 1);
        assert_eq!(KEPT.load(Ordering::SeqCst), 1);
        // Past the parent's TTL: the steps that inherited it run again; the one whose own
        // TTL is an hour still replays.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(parent(false).await.is_ok());
        assert_eq!(inherited.load(Ordering::SeqCst), 2);
        assert_eq!(by_value.load(Ordering::SeqCst), 2);
        assert_eq!(
            KEPT.load(Ordering::SeqCst),
            1,
            "a step's own ttl is honoured"
        );
    }
}

/// `Error::InProgress` says when to ask again: the running attempt's lease left, capped at one
/// second — not the whole lease (30 s by default) for a body that takes milliseconds.
#[tokio::test]
async fn in_progress_retry_after_is_the_lease_left_capped() {
    let idem = Idem::memory();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call("retry-after")
                .key("k")
                .run(async move {
                    let _ = started_tx.send(());
                    let _ = released.await;
                    Ok::<_, idem::Error>(1u8)
                })
                .await
        })
    };
    started.await.unwrap();
    let dup = idem
        .call("retry-after")
        .key("k")
        .run(async { Ok::<_, idem::Error>(2u8) })
        .await
        .unwrap_err();
    assert!(dup.is_in_progress(), "{dup}");
    assert_eq!(dup.retry_after(), Some(idem::protocol::MAX_RETRY_AFTER));
    let short = idem
        .call("retry-after-short")
        .key("k")
        .lease(Duration::from_millis(600));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release_short, released) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn(short.run(async move {
        let _ = started_tx.send(());
        let _ = released.await;
        Ok::<_, idem::Error>(1u8)
    }));
    started.await.unwrap();
    let dup = idem
        .call("retry-after-short")
        .key("k")
        .run(async { Ok::<_, idem::Error>(2u8) })
        .await
        .unwrap_err();
    let hint = dup.retry_after().unwrap();
    assert!(
        hint > Duration::ZERO && hint <= Duration::from_millis(600),
        "{hint:?}"
    );
    assert_eq!(idem::Error::Config("x".into()).retry_after(), None);
    release.send(()).unwrap();
    release_short.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap().into_inner(), 1);
    assert_eq!(second.await.unwrap().unwrap().into_inner(), 1);
}

/// A payment gateway that records charges under the idempotency key it is given: what a
/// reconcile asks after a crash.
#[derive(Default)]
struct Gateway {
    charges: Mutex<std::collections::HashMap<String, u64>>,
    made: AtomicUsize,
}

impl Gateway {
    /// Charges under `key` (the call's `current_key()`), once per key as a real gateway would
    /// with an idempotency key, and counts the charges it made.
    fn charge(&self, key: String, amount: u64) -> u64 {
        let mut charges = self.charges.lock().unwrap();
        *charges.entry(key).or_insert_with(|| {
            self.made.fetch_add(1, Ordering::SeqCst);
            amount
        })
    }

    async fn find(&self) -> Result<Option<u64>, AppError> {
        let key = idem::current_key().expect("inside the call");
        Ok(self.charges.lock().unwrap().get(&key).copied())
    }
}

#[idempotent(key = order, store = idem, skip(idem, gateway, crash), lease = "250ms",
             reconcile = gateway.find())]
async fn pay_once(
    order: u64,
    amount: u64,
    idem: &Idem,
    gateway: &Gateway,
    crash: bool,
) -> Result<u64, AppError> {
    let charged = gateway.charge(idem::current_key().unwrap(), amount);
    if crash {
        // The process dies after the side effect, before the result is stored.
        std::future::pending::<()>().await;
    }
    Ok(charged)
}

/// The crash window: the body charged, then its process died before idem stored the result.
/// The next call takes the abandoned attempt over and its reconcile finds the charge by the
/// key passed down: the charge is returned and stored, and the body does not run again.
#[tokio::test]
async fn a_reconcile_closes_the_crash_window() {
    let idem = Idem::memory();
    let gateway = Gateway::default();
    let crashed = tokio::time::timeout(
        Duration::from_millis(100),
        pay_once(7, 1200, &idem, &gateway, true),
    )
    .await;
    assert!(crashed.is_err(), "the first attempt died mid-call");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(pay_once(7, 1200, &idem, &gateway, false).await, Ok(1200));
    assert_eq!(pay_once(7, 1200, &idem, &gateway, false).await, Ok(1200));
    assert_eq!(gateway.made.load(Ordering::SeqCst), 1, "one charge");
}

#[idempotent(key = order, store = idem, skip(idem, gateway, crash), lease = "250ms",
             on_abandoned = park)]
async fn pay_or_park(
    order: u64,
    idem: &Idem,
    gateway: &Gateway,
    crash: bool,
) -> Result<u64, AppError> {
    let charged = gateway.charge(idem::current_key().unwrap(), order);
    if crash {
        std::future::pending::<()>().await;
    }
    Ok(charged)
}

/// `on_abandoned = park`: after the crash, callers get `OutcomeUnknown` (through `From`) and
/// nothing runs until an operator resolves the key; then they get the resolved value.
#[tokio::test]
async fn a_parked_crash_waits_for_an_operator() {
    let idem = Idem::memory();
    let gateway = Gateway::default();
    let crashed = tokio::time::timeout(
        Duration::from_millis(100),
        pay_or_park(9, &idem, &gateway, true),
    )
    .await;
    assert!(crashed.is_err());
    tokio::time::sleep(Duration::from_millis(600)).await;
    for _ in 0..2 {
        match pay_or_park(9, &idem, &gateway, false).await {
            Err(AppError::Idem(msg)) => assert!(msg.contains("parked"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
    idem.resolve("pay_or_park", &9u64, idem::Resolution::Applied(9u64))
        .await
        .unwrap();
    assert_eq!(pay_or_park(9, &idem, &gateway, false).await, Ok(9));
    assert_eq!(gateway.made.load(Ordering::SeqCst), 1);
}

/// A `Duration` expression that would turn idempotency off (zero) or overflow the stores'
/// clocks (above 100 years) is a typed error at run time; the body does not run.
#[tokio::test]
async fn a_zero_or_absurd_ttl_expression_is_a_config_error() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    #[idempotent(store = idem, ttl = ttl)]
    async fn charge(order: u64, ttl: Duration, idem: &Idem) -> Result<u64, idem::Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(order)
    }
    let idem = Idem::memory();
    for ttl in [Duration::ZERO, Duration::from_secs(36_501 * 86_400)] {
        let err = charge(1, ttl, &idem).await.unwrap_err();
        assert_eq!(err.kind(), idem::ErrorKind::Config, "{err}");
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);
    assert_eq!(charge(1, Duration::from_secs(60), &idem).await.unwrap(), 1);
}
