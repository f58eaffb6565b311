//! The conformance suite: one set of scenarios, generic over the store, that every store runs.
//!
//! A store's test file is one line:
//!
//! ```text
//! idem::conformance_suite!(make_store); // async fn make_store() -> Option<idem::Idem>
//! ```
//!
//! which expands into one `#[test]` per scenario, each on its own multi-thread runtime. The
//! constructor returns `None` to skip (a server that is not configured); use [`service_url`]
//! so that CI, which sets `IDEM_REQUIRE_SERVICES=1`, fails instead of skipping.
//!
//! Scenarios never assume an empty store: every one works in namespaces of its own, so the
//! suite can run against a shared database, in parallel, and twice in a row.

use crate::error::Error;
use crate::key::{self, Digest};
use crate::store::{Claim, ClaimOutcome, Complete, Status};
use crate::{Call, Idem, KeepErrors, Outcome};
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
            eprintln!("skipped: {what} tests ({var} is not set)");
            None
        }
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        if let Some(idem) = make().await {
            scenario(idem).await;
        }
    });
}

/// Expands into one `#[test]` per conformance scenario against the store `make` opens.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@tests $make;
            first_call_runs_body_once, repeat_after_finish_replays, repeat_in_flight_is_in_progress,
            wait_replays_the_finished_value, wait_gives_up_with_in_progress, mismatch_is_refused,
            err_releases_the_key, panic_releases_the_key, dropped_future_lapses_after_lease,
            lease_lost_completion_is_fenced, store_steps_are_fenced, renewal_keeps_a_slow_body_exclusive,
            type_change_is_a_codec_error, ttl_expiry_frees_the_key, concurrent_duplicates_run_once,
            odd_keys_are_just_keys, kept_errors_replay, scope_and_name_separate_keys,
            current_key_is_stable_across_retries, purge_removes_only_expired_records,
            purge_spares_claims_taken_over_meanwhile,
            get_returns_the_live_record, force_release_frees_a_live_claim, values_are_binary_safe,
            steps_replay_finished_and_rerun_failed, steps_survive_a_crash_between_steps,
            steps_nest_and_dedupe, step_with_other_arguments_is_a_mismatch);
    };
    (@tests $make:path; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testkit::run_scenario($make, $crate::testkit::scenarios::$name);
            }
        )*
    };
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
#[derive(Clone, Default)]
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

/// The scenarios. Each takes a handle on the store under test.
pub mod scenarios {
    use super::*;

    async fn charge(
        idem: &Idem,
        name: &str,
        key: &str,
        counter: &Counter,
    ) -> Result<Outcome<Receipt>, Failure> {
        let counter = counter.clone();
        idem.call(name.to_string())
            .key(key)
            .run(async move {
                let id = counter.hit() as u64;
                Ok(Receipt {
                    id,
                    memo: format!("charged {id}"),
                })
            })
            .await
    }

    /// The first call for a key runs the body once and returns its value fresh.
    pub async fn first_call_runs_body_once(idem: Idem) {
        let c = Counter::default();
        let name = unique("first");
        let out = charge(&idem, &name, "k", &c).await.unwrap();
        assert!(!out.is_replayed());
        assert_eq!(out.into_inner().id, 1);
        assert_eq!(c.get(), 1);
    }

    /// A repeat after the first finished replays the stored value; the body does not run.
    pub async fn repeat_after_finish_replays(idem: Idem) {
        let c = Counter::default();
        let name = unique("replay");
        let first = charge(&idem, &name, "k", &c).await.unwrap();
        for _ in 0..3 {
            let again = charge(&idem, &name, "k", &c).await.unwrap();
            assert!(again.is_replayed());
            assert_eq!(again.into_inner(), first.clone().into_inner());
        }
        assert_eq!(c.get(), 1);
        let other = charge(&idem, &name, "other", &c).await.unwrap();
        assert!(!other.is_replayed());
        assert_eq!(c.get(), 2);
    }

    /// A repeat while an attempt is in flight gets `InProgress` at once.
    pub async fn repeat_in_flight_is_in_progress(idem: Idem) {
        let name = unique("inflight");
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let idem = idem.clone();
            let name = name.clone();
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .run(async move {
                        started_tx.send(()).unwrap();
                        go_rx.await.unwrap();
                        Ok::<_, Failure>(7u32)
                    })
                    .await
            })
        };
        started_rx.await.unwrap();
        let dup = idem
            .call(name.clone())
            .key("k")
            .run(async { Ok::<_, Failure>(8u32) })
            .await;
        match dup {
            Err(Failure::Idem(Error::InProgress {
                retry_after, key, ..
            })) => {
                assert!(retry_after.is_some());
                assert_eq!(key, digest(&name, "k").to_hex());
            }
            other => panic!("expected InProgress, got {other:?}"),
        }
        go_tx.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), Outcome::Fresh(7));
        let after = idem
            .call(name)
            .key("k")
            .run(async { Ok::<_, Failure>(9u32) })
            .await
            .unwrap();
        assert_eq!(after, Outcome::Replayed(7));
    }

    /// With `wait`, a duplicate waits for the attempt in flight and replays its value.
    pub async fn wait_replays_the_finished_value(idem: Idem) {
        let c = Counter::default();
        let name = unique("wait");
        let slow = {
            let (idem, name, c) = (idem.clone(), name.clone(), c.clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .run(async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok::<_, Failure>(c.hit())
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let c2 = c.clone();
        let waited = idem
            .call(name)
            .key("k")
            .wait(Duration::from_secs(10))
            .run(async move { Ok::<_, Failure>(c2.hit() + 100) })
            .await
            .unwrap();
        assert_eq!(waited, Outcome::Replayed(1));
        assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
        assert_eq!(c.get(), 1);
    }

    /// A duplicate whose `wait` runs out gets `InProgress`.
    pub async fn wait_gives_up_with_in_progress(idem: Idem) {
        let name = unique("waitout");
        let slow = {
            let (idem, name) = (idem.clone(), name.clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .run(async {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        Ok::<_, Failure>(1u8)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        let dup = idem
            .call(name)
            .key("k")
            .wait(Duration::from_millis(200))
            .run(async { Ok::<_, Failure>(2u8) })
            .await;
        assert!(
            matches!(dup, Err(Failure::Idem(Error::InProgress { .. }))),
            "{dup:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(started.elapsed() < Duration::from_millis(1400));
        assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
    }

    /// The same key with another fingerprint is refused, finished or in flight.
    pub async fn mismatch_is_refused(idem: Idem) {
        let c = Counter::default();
        let name = unique("mismatch");
        let call = |amount: u32| {
            let c = c.clone();
            idem.call(name.clone())
                .key("order-1")
                .fingerprint(&("order-1", amount))
                .run(async move {
                    c.hit();
                    Ok::<_, Failure>(amount)
                })
        };
        assert_eq!(call(100).await.unwrap(), Outcome::Fresh(100));
        assert!(matches!(
            call(200).await,
            Err(Failure::Idem(Error::Mismatch { .. }))
        ));
        assert_eq!(call(100).await.unwrap(), Outcome::Replayed(100));
        assert_eq!(c.get(), 1);

        // In flight: a different payload is a mismatch, not "in progress".
        let name2 = unique("mismatch-inflight");
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let (idem, name2) = (idem.clone(), name2.clone());
            tokio::spawn(async move {
                idem.call(name2)
                    .key("k")
                    .fingerprint(&1)
                    .run(async move {
                        go_rx.await.unwrap();
                        Ok::<_, Failure>(1)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let dup = idem
            .call(name2)
            .key("k")
            .fingerprint(&2)
            .run(async { Ok::<_, Failure>(2) })
            .await;
        assert!(
            matches!(dup, Err(Failure::Idem(Error::Mismatch { .. }))),
            "{dup:?}"
        );
        go_tx.send(()).unwrap();
        first.await.unwrap().unwrap();
    }

    /// An `Err` from the body releases the key: the next call runs the body again.
    pub async fn err_releases_the_key(idem: Idem) {
        let c = Counter::default();
        let name = unique("err");
        let call = |fail: bool| {
            let c = c.clone();
            idem.call(name.clone()).key("k").run(async move {
                let n = c.hit();
                if fail {
                    Err(Failure::Body(TestError::Declined(format!("attempt {n}"))))
                } else {
                    Ok(n)
                }
            })
        };
        assert!(matches!(call(true).await, Err(Failure::Body(_))));
        assert_eq!(call(false).await.unwrap(), Outcome::Fresh(2));
        assert_eq!(call(false).await.unwrap(), Outcome::Replayed(2));
        assert_eq!(c.get(), 2);
    }

    /// A panicking body releases the key and the panic reaches the caller.
    pub async fn panic_releases_the_key(idem: Idem) {
        let name = unique("panic");
        let joined = {
            let (idem, name) = (idem.clone(), name.clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .run(async {
                        if true {
                            panic!("body panicked on purpose");
                        }
                        Ok::<u8, Failure>(0)
                    })
                    .await
            })
            .await
        };
        let err = joined.expect_err("the panic must reach the caller");
        assert!(err.is_panic());
        let retry = idem
            .call(name)
            .key("k")
            .run(async { Ok::<_, Failure>(5u8) })
            .await
            .unwrap();
        assert_eq!(retry, Outcome::Fresh(5));
    }

    /// A future dropped mid-call stops renewing; its claim lapses after the lease.
    pub async fn dropped_future_lapses_after_lease(idem: Idem) {
        let name = unique("dropped");
        let lease = Duration::from_millis(400);
        let call = idem
            .call(name.clone())
            .key("k")
            .lease(lease)
            .run(std::future::pending::<Result<u8, Failure>>());
        assert!(tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err());
        let soon = idem
            .call(name.clone())
            .key("k")
            .lease(lease)
            .run(async { Ok::<_, Failure>(1u8) })
            .await;
        assert!(
            matches!(soon, Err(Failure::Idem(Error::InProgress { .. }))),
            "{soon:?}"
        );
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        let later = idem
            .call(name)
            .key("k")
            .lease(lease)
            .run(async { Ok::<_, Failure>(2u8) })
            .await
            .unwrap();
        assert_eq!(later, Outcome::Fresh(2));
    }

    /// An attempt that outlived its lease (its thread blocked, so no renewal) and was taken
    /// over cannot complete: `LeaseLost`; the new attempt's value is the one replayed.
    pub async fn lease_lost_completion_is_fenced(idem: Idem) {
        let name = unique("fenced");
        let lease = Duration::from_millis(300);
        let stalled = {
            let (idem, name) = (idem.clone(), name.clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .lease(lease)
                    .run(async move {
                        // Blocks this future (so its heartbeat cannot renew) but hands the
                        // worker's other tasks to another thread, as a stalled process would
                        // leave the rest of the world running.
                        tokio::task::block_in_place(|| {
                            std::thread::sleep(Duration::from_millis(900))
                        });
                        Ok::<_, Failure>(1u8)
                    })
                    .await
            })
        };
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let took_over = idem
            .call(name.clone())
            .key("k")
            .lease(lease)
            .run(async { Ok::<_, Failure>(2u8) })
            .await
            .unwrap();
        assert_eq!(took_over, Outcome::Fresh(2));
        match stalled.await.unwrap() {
            Err(Failure::Idem(Error::LeaseLost { token, .. })) => assert!(token > 0),
            other => panic!("expected LeaseLost, got {other:?}"),
        }
        let replay = idem
            .call(name)
            .key("k")
            .run(async { Ok::<_, Failure>(3u8) })
            .await
            .unwrap();
        assert_eq!(replay, Outcome::Replayed(2));
    }

    /// The store's own steps: a lapsed claim is taken over with a greater token, and every
    /// step with the old token is refused.
    pub async fn store_steps_are_fenced(idem: Idem) {
        let store = idem.store();
        let name = unique("steps");
        let key = digest(&name, "k");
        let fp = fingerprint("k");
        let claim = Claim {
            name: &name,
            key: &key,
            fingerprint: &fp,
            lease: Duration::from_millis(200),
        };
        let ClaimOutcome::Claimed { token: t1 } = store.claim(claim).await.unwrap() else {
            panic!("first claim must succeed")
        };
        match store.claim(claim).await.unwrap() {
            ClaimOutcome::Existing(r) => {
                assert_eq!(
                    (r.status, r.token, r.fingerprint),
                    (Status::InProgress, t1, fp)
                );
                assert_eq!(r.name, name);
            }
            other => panic!("expected the live claim, got {other:?}"),
        }
        assert!(store
            .renew(&key, t1, Duration::from_millis(200))
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ClaimOutcome::Claimed { token: t2 } = store.claim(claim).await.unwrap() else {
            panic!("a lapsed claim must be taken over")
        };
        assert!(t2 > t1, "tokens must grow: {t1} then {t2}");
        let stale = Complete {
            key: &key,
            token: t1,
            value: b"stale",
            ttl: Duration::from_secs(60),
        };
        assert!(!store.complete(stale).await.unwrap());
        assert!(!store.renew(&key, t1, Duration::from_secs(1)).await.unwrap());
        assert!(!store.release(&key, t1).await.unwrap());
        let fresh = Complete {
            token: t2,
            value: b"fresh",
            ..stale
        };
        assert!(store.complete(fresh).await.unwrap());
        assert!(!store.complete(fresh).await.unwrap(), "complete twice");
        assert!(
            !store.release(&key, t2).await.unwrap(),
            "a completed record is not released"
        );
        assert!(!store.renew(&key, t2, Duration::from_secs(1)).await.unwrap());
        let r = store.get(&key).await.unwrap().expect("completed record");
        assert_eq!((r.status, r.token), (Status::Completed, t2));
        assert_eq!(r.value.as_deref(), Some(&b"fresh"[..]));
    }

    /// A body slower than its lease (lease 1 s, body 3 s) keeps its claim by renewal: no
    /// duplicate runs it a second time.
    pub async fn renewal_keeps_a_slow_body_exclusive(idem: Idem) {
        let c = Counter::default();
        let name = unique("slow");
        let run = |c: Counter| {
            idem.call(name.clone())
                .key("k")
                .lease(Duration::from_secs(1))
                .run(async move {
                    c.hit();
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, Failure>(1u8)
                })
        };
        let slow = tokio::spawn(run(c.clone()));
        let started = std::time::Instant::now();
        // Duplicates well past the first lease (1 s) and short of the body's end (3 s).
        while started.elapsed() < Duration::from_millis(2300) {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let dup = run(c.clone()).await;
            assert!(
                matches!(dup, Err(Failure::Idem(Error::InProgress { .. }))),
                "{dup:?}"
            );
        }
        assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
        assert_eq!(c.get(), 1);
    }

    /// A stored value that no longer decodes into the return type is `Error::Codec`, and the
    /// body does not run.
    pub async fn type_change_is_a_codec_error(idem: Idem) {
        let name = unique("codec");
        let c = Counter::default();
        charge(&idem, &name, "k", &c).await.unwrap();
        let c2 = c.clone();
        let changed = idem
            .call(name)
            .key("k")
            .run(async move {
                c2.hit();
                Ok::<u64, Failure>(0)
            })
            .await;
        match changed {
            Err(Failure::Idem(Error::Codec(e))) => {
                assert_eq!(e.kind, crate::CodecErrorKind::TypeChanged)
            }
            other => panic!("expected a codec error, got {other:?}"),
        }
        assert_eq!(c.get(), 1);
    }

    /// Once `ttl` has passed, the key is free again.
    pub async fn ttl_expiry_frees_the_key(idem: Idem) {
        let name = unique("ttl");
        let c = Counter::default();
        let call = || {
            let c = c.clone();
            idem.call(name.clone())
                .key("k")
                .ttl(Duration::from_millis(400))
                .run(async move { Ok::<_, Failure>(c.hit()) })
        };
        assert_eq!(call().await.unwrap(), Outcome::Fresh(1));
        assert_eq!(call().await.unwrap(), Outcome::Replayed(1));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(call().await.unwrap(), Outcome::Fresh(2));
    }

    /// 64 concurrent calls with one key run the body exactly once; every caller gets its value.
    pub async fn concurrent_duplicates_run_once(idem: Idem) {
        stampede(&idem, 64, Duration::from_millis(50)).await;
    }

    /// Keys are digests: an empty key, a 100 KB key and a key with NUL bytes are keys like any
    /// other, and distinct from each other.
    pub async fn odd_keys_are_just_keys(idem: Idem) {
        let name = unique("oddkeys");
        let c = Counter::default();
        let big = "x".repeat(100 * 1024);
        let keys = ["", big.as_str(), "a\0b", "a\0c", "\0"];
        for k in keys {
            assert!(!charge(&idem, &name, k, &c).await.unwrap().is_replayed());
        }
        for k in keys {
            assert!(charge(&idem, &name, k, &c).await.unwrap().is_replayed());
        }
        assert_eq!(c.get(), keys.len());
    }

    /// With the keep policy an `Err` is stored and replayed like an `Ok`.
    pub async fn kept_errors_replay(idem: Idem) {
        let name = unique("keep");
        let c = Counter::default();
        let call = || {
            let c = c.clone();
            idem.call(name.clone())
                .key("k")
                .run_with(KeepErrors, async move {
                    c.hit();
                    Err::<u8, _>(TestError::Declined("card declined".into()))
                })
        };
        assert_eq!(
            call().await,
            Err(TestError::Declined("card declined".into()))
        );
        assert_eq!(
            call().await,
            Err(TestError::Declined("card declined".into()))
        );
        assert_eq!(c.get(), 1);
    }

    /// The same key in two scopes, or in two namespaces, is two keys.
    pub async fn scope_and_name_separate_keys(idem: Idem) {
        let name = unique("scoped");
        let c = Counter::default();
        for tenant in ["alice", "bob", "alice", "bob"] {
            let c = c.clone();
            idem.call(name.clone())
                .scope(tenant)
                .key("k")
                .run(async move { Ok::<_, Failure>(c.hit()) })
                .await
                .unwrap();
        }
        assert_eq!(c.get(), 2);
        let other = unique("scoped-other");
        charge(&idem, &other, "k", &c).await.unwrap();
        assert_eq!(c.get(), 3);
    }

    /// `current_key()` is the same on every attempt of one logical call.
    pub async fn current_key_is_stable_across_retries(idem: Idem) {
        let name = unique("curkey");
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        for fail in [true, false] {
            let seen = seen.clone();
            let _ = idem
                .call(name.clone())
                .key("k")
                .run(async move {
                    seen.lock().unwrap().push(crate::current_key());
                    if fail {
                        Err(Failure::Body(TestError::Declined("first".into())))
                    } else {
                        Ok(())
                    }
                })
                .await;
        }
        let seen = seen.lock().unwrap();
        let expected = Some(digest(&name, "k").to_hex());
        assert_eq!(*seen, vec![expected.clone(), expected]);
        assert_eq!(crate::current_key(), None);
    }

    /// `purge_expired` removes expired records and leaves live ones.
    pub async fn purge_removes_only_expired_records(idem: Idem) {
        let name = unique("purge");
        let c = Counter::default();
        for i in 0..5 {
            let c = c.clone();
            idem.call(name.clone())
                .key(&("short", i))
                .ttl(Duration::from_millis(100))
                .run(async move { Ok::<_, Failure>(c.hit()) })
                .await
                .unwrap();
        }
        for i in 0..3 {
            charge(&idem, &name, &format!("long-{i}"), &c)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        idem.purge_expired(2).await.unwrap();
        let store = idem.store();
        for i in 0..5 {
            let key = digest(&name, &("short", i));
            assert_eq!(
                store.force_release(&key).await.unwrap(),
                None,
                "expired record {i} left"
            );
        }
        for i in 0..3 {
            let key = digest(&name, &format!("long-{i}"));
            assert!(
                store.get(&key).await.unwrap().is_some(),
                "live record {i} purged"
            );
        }
        assert_eq!(c.get(), 8);
    }

    /// A purge that runs while calls take over expired keys deletes none of the claims those
    /// calls now hold: every call runs, completes and stores its result. (A purge that deleted
    /// a row between its takeover and its completion would fail that completion.)
    pub async fn purge_spares_claims_taken_over_meanwhile(idem: Idem) {
        const N: usize = 200;
        let name = unique("purgerace");
        for i in 0..N {
            idem.call(name.clone())
                .key(&i)
                .ttl(Duration::from_millis(50))
                .run(async move { Ok::<_, Failure>(i) })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        let purge = {
            let idem = idem.clone();
            tokio::spawn(async move {
                for _ in 0..N / 5 {
                    idem.purge_expired(5).await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        let callers: Vec<_> = (0..4)
            .map(|t| {
                let (idem, name) = (idem.clone(), name.clone());
                tokio::spawn(async move {
                    for i in (t..N).step_by(4) {
                        let out = idem
                            .call(name.clone())
                            .key(&i)
                            .run(async move {
                                tokio::task::yield_now().await;
                                Ok::<_, Failure>(N + i)
                            })
                            .await
                            .unwrap();
                        assert_eq!(out, Outcome::Fresh(N + i), "key {i}");
                    }
                })
            })
            .collect();
        for c in callers {
            c.await.unwrap();
        }
        purge.await.unwrap();
        for i in 0..N {
            let out = idem
                .call(name.clone())
                .key(&i)
                .run(async move { Ok::<_, Failure>(0) })
                .await
                .unwrap();
            assert_eq!(out, Outcome::Replayed(N + i), "key {i}");
        }
    }

    /// `get` returns the live record as stored: name, fingerprint, status, value, times.
    pub async fn get_returns_the_live_record(idem: Idem) {
        let name = unique("get");
        let c = Counter::default();
        let out = charge(&idem, &name, "k", &c).await.unwrap().into_inner();
        let r = idem
            .store()
            .get(&digest(&name, "k"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.name, name);
        assert_eq!(r.status, Status::Completed);
        assert_eq!(r.fingerprint, fingerprint("k"));
        assert!(r.remaining() <= Duration::from_secs(24 * 3600));
        assert!(r.remaining() > Duration::from_secs(23 * 3600));
        let text = crate::describe_value(r.value.as_deref().unwrap());
        assert!(text.contains(&out.memo), "{text}");
        assert_eq!(
            idem.store().get(&digest(&name, "absent")).await.unwrap(),
            None
        );
    }

    /// An operator's forced release frees a live claim at once.
    pub async fn force_release_frees_a_live_claim(idem: Idem) {
        let name = unique("force");
        let pending = idem
            .call(name.clone())
            .key("k")
            .lease(Duration::from_secs(60))
            .run(std::future::pending::<Result<u8, Failure>>());
        assert!(tokio::time::timeout(Duration::from_millis(50), pending)
            .await
            .is_err());
        let released = idem
            .store()
            .force_release(&digest(&name, "k"))
            .await
            .unwrap();
        assert_eq!(released.map(|r| r.status), Some(Status::InProgress));
        let retry = idem
            .call(name)
            .key("k")
            .run(async { Ok::<_, Failure>(1u8) })
            .await
            .unwrap();
        assert_eq!(retry, Outcome::Fresh(1));
    }

    /// Stored values are binary-safe: every byte value round-trips through the store.
    pub async fn values_are_binary_safe(idem: Idem) {
        let name = unique("binary");
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        let c = Counter::default();
        let call = || {
            let (bytes, c) = (bytes.clone(), c.clone());
            idem.call(name.clone()).key("k").run(async move {
                c.hit();
                Ok::<_, Failure>((bytes, "\0\u{1F600}\"\\".to_string()))
            })
        };
        let a = call().await.unwrap();
        let b = call().await.unwrap();
        assert!(b.is_replayed());
        assert_eq!(a.into_inner(), b.into_inner());
        assert_eq!(c.get(), 1);
    }

    // ---- steps: a retry resumes where the failed attempt stopped ----

    async fn checkout(
        idem: &Idem,
        name: &str,
        effects: &[Counter; 3],
        fail_third: bool,
    ) -> Result<u8, Failure> {
        let effects = effects.clone();
        idem.call(name.to_string())
            .key("order-1")
            .lease(Duration::from_secs(5))
            .run(async move {
                crate::step("reserve", || async { Ok::<_, Failure>(effects[0].hit()) }).await?;
                crate::step("charge", || async { Ok::<_, Failure>(effects[1].hit()) }).await?;
                crate::step("receipt", || async {
                    effects[2].hit();
                    if fail_third {
                        Err(Failure::Body(TestError::Declined(
                            "mail server down".into(),
                        )))
                    } else {
                        Ok(())
                    }
                })
                .await?;
                Ok(3u8)
            })
            .await
            .map(Outcome::into_inner)
    }

    /// A three-step body whose third step fails once: on the retry the first two steps
    /// replay (their effects happened once) and the third runs again.
    pub async fn steps_replay_finished_and_rerun_failed(idem: Idem) {
        let name = unique("checkout");
        let effects: [Counter; 3] = Default::default();
        assert!(matches!(
            checkout(&idem, &name, &effects, true).await,
            Err(Failure::Body(_))
        ));
        assert_eq!(checkout(&idem, &name, &effects, false).await.unwrap(), 3);
        assert_eq!(checkout(&idem, &name, &effects, false).await.unwrap(), 3);
        let counts: Vec<usize> = effects.iter().map(Counter::get).collect();
        assert_eq!(
            counts,
            vec![1, 1, 2],
            "reserve once, charge once, receipt failed then sent once"
        );
    }

    /// The future dropped between two steps: after the parent's lease, the retry replays the
    /// finished step and runs the rest.
    pub async fn steps_survive_a_crash_between_steps(idem: Idem) {
        let name = unique("crash");
        let effects: [Counter; 2] = Default::default();
        let lease = Duration::from_millis(300);
        let attempt = |hang: bool| {
            let effects = effects.clone();
            idem.call(name.clone())
                .key("k")
                .lease(lease)
                .run(async move {
                    crate::step("one", || async { Ok::<_, Failure>(effects[0].hit()) }).await?;
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    crate::step("two", || async { Ok::<_, Failure>(effects[1].hit()) }).await?;
                    Ok::<_, Failure>(())
                })
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(100), attempt(true))
                .await
                .is_err()
        );
        tokio::time::sleep(lease + Duration::from_millis(150)).await;
        assert_eq!(attempt(false).await.unwrap(), Outcome::Fresh(()));
        assert_eq!((effects[0].get(), effects[1].get()), (1, 1));
    }

    /// Steps nest three deep; a step called twice with one key runs once; a nested call that is
    /// not a step keeps its own global key.
    pub async fn steps_nest_and_dedupe(idem: Idem) {
        let name = unique("nest");
        let global = unique("global-receipt");
        let c: [Counter; 4] = Default::default();
        let run = |order: &'static str| {
            let (c, idem2, global) = (c.clone(), idem.clone(), global.clone());
            idem.call(name.clone()).key(order).run(async move {
                let depth3 = crate::step("outer", || async {
                    c[0].hit();
                    crate::step("middle", || async {
                        c[1].hit();
                        crate::step("inner", || async { Ok::<_, Failure>(c[2].hit()) }).await
                    })
                    .await
                })
                .await?;
                let again = crate::step("outer", || async { Ok::<_, Failure>(99) }).await?;
                assert_eq!(again, depth3, "the same step key inside one body replays");
                // Not a step: deduplicated across every caller by its own key.
                let c3 = c[3].clone();
                idem2
                    .call(global)
                    .key("receipt-for-customer-9")
                    .run(async move { Ok::<_, Failure>(c3.hit()) })
                    .await?;
                Ok::<_, Failure>(depth3)
            })
        };
        assert_eq!(run("order-1").await.unwrap().into_inner(), 1);
        assert_eq!(run("order-2").await.unwrap().into_inner(), 2);
        let counts: Vec<usize> = c.iter().map(Counter::get).collect();
        assert_eq!(
            counts,
            vec![2, 2, 2, 1],
            "steps per parent; the global call once overall"
        );
    }

    /// A parent whose retry calls a step with other arguments than the first attempt gets
    /// `Mismatch` for that step, not a second side effect.
    pub async fn step_with_other_arguments_is_a_mismatch(idem: Idem) {
        let name = unique("determinism");
        let c = Counter::default();
        let attempt = |amount: u32, fail: bool| {
            let c = c.clone();
            idem.call(name.clone()).key("k").run(async move {
                let c2 = c.clone();
                Call::installed("charge")
                    .step()
                    .key("charge")
                    .fingerprint(&amount)
                    .run(async move { Ok::<_, Failure>(c2.hit()) })
                    .await?;
                if fail {
                    return Err(Failure::Body(TestError::Declined("later failure".into())));
                }
                Ok(())
            })
        };
        assert!(matches!(attempt(100, true).await, Err(Failure::Body(_))));
        assert!(matches!(
            attempt(200, false).await,
            Err(Failure::Idem(Error::Mismatch { .. }))
        ));
        assert_eq!(c.get(), 1);
    }
}
