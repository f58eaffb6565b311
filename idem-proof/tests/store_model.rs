//! Model-based tests of the real stores: random sequences of claim / complete / release /
//! renew / get / force_release / park / abandon / resolve / purge and clock advances, run
//! against a real store and against the model's store side by side, every outcome compared
//! (a claim's takeover of an abandoned attempt and its attempt number included).
//!
//! The memory, SQLite, PostgreSQL, MySQL, Redis and Redis Cluster stores take time from a clock the test cannot
//! drive, so time advances by real sleeps in units of `UNIT`: every operation of a unit runs
//! in its first half, leases are 1.5 units and TTLs 2.5 units, so a record's liveness at any
//! later operation is the same on the real clock and on the model's, whatever the operations'
//! own latency (up to half a unit; a case that overruns stops early and is counted).
//!
//! Operations follow each other at once, so a claim often lands in the same millisecond as the
//! release before it: the store must still hand out a new token (a release ends the record and
//! keeps its token; see docs/protocol.md, "Findings").

use idem_proof::ModelStore;
use idem_runtime::key::Digest;
use idem_runtime::store::{
    Claim, ClaimOutcome, Complete, Record, Resolve, Resolved, Status, Store,
};
use idem_runtime::Idem;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One model time unit in model milliseconds; operations of a unit get model times
/// `unit * 1000 + j`, with `j` well below half a unit.
const MODEL_UNIT: i64 = 1000;
const MODEL_LEASE: i64 = 1500;
const MODEL_TTL: i64 = 2500;
const NAME: &str = "idem-proof";

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: u8,
        fingerprint: u8,
    },
    Complete {
        key: u8,
        token: u8,
        value: u8,
    },
    Release {
        key: u8,
        token: u8,
    },
    Renew {
        key: u8,
        token: u8,
    },
    Get {
        key: u8,
    },
    ForceRelease {
        key: u8,
    },
    Park {
        key: u8,
        token: u8,
    },
    Abandon {
        key: u8,
        token: u8,
    },
    /// `applied`: the value of an applied resolve, `None` for not applied.
    Resolve {
        key: u8,
        applied: Option<u8>,
    },
    Purge,
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..2;
    prop_oneof![
        4 => (key.clone(), 0u8..2).prop_map(|(key, fingerprint)| Op::Claim { key, fingerprint }),
        3 => (key.clone(), any::<u8>(), any::<u8>())
            .prop_map(|(key, token, value)| Op::Complete { key, token, value }),
        2 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Release { key, token }),
        2 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Renew { key, token }),
        2 => key.clone().prop_map(|key| Op::Get { key }),
        1 => key.clone().prop_map(|key| Op::ForceRelease { key }),
        1 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Park { key, token }),
        1 => (key.clone(), any::<u8>()).prop_map(|(key, token)| Op::Abandon { key, token }),
        1 => (key, proptest::option::of(any::<u8>()))
            .prop_map(|(key, applied)| Op::Resolve { key, applied }),
        1 => Just(Op::Purge),
        3 => (1u8..=3).prop_map(Op::Advance),
    ]
}

/// The tokens a key was issued, as (model, real) pairs, in order.
#[derive(Default)]
struct Issued(Vec<(u64, u64)>);

impl Issued {
    /// The pair an operation refers to: one of the issued tokens, or (every 8th reference, or
    /// when none was issued) a token no claim returned.
    fn pick(&self, r: u8) -> (u64, u64) {
        if self.0.is_empty() || r % 8 == 7 {
            return (3, 3);
        }
        self.0[r as usize % self.0.len()]
    }

    fn model_index(&self, token: u64) -> Option<usize> {
        self.0.iter().position(|&(m, _)| m == token)
    }

    fn real_index(&self, token: u64) -> Option<usize> {
        self.0.iter().position(|&(_, r)| r == token)
    }
}

/// What is compared of a record: status, fingerprint, the claim it belongs to, its attempt
/// number, and the value of a completed record.
type View = (Status, Digest, Option<usize>, u32, Option<Vec<u8>>);

fn view(r: &Record, index: Option<usize>) -> View {
    let value = (r.status == Status::Completed).then(|| r.value.clone().unwrap_or_default());
    (r.status, r.fingerprint, index, r.attempt, value)
}

struct Harness<'a> {
    store: &'a dyn Store,
    model: ModelStore,
    unit: Duration,
    /// Whether the store is this test's alone (purge counts are compared only then).
    exclusive: bool,
    keys: [Digest; 2],
    issued: [Issued; 2],
    /// Records purged so far, by the model and by the store.
    purged: (u64, u64),
    start: Instant,
    units: u32,
    step: i64,
    log: Vec<String>,
}

fn fingerprint(f: u8) -> Digest {
    Digest([0xf0 | f; 32])
}

impl Harness<'_> {
    fn now(&self) -> i64 {
        i64::from(self.units) * MODEL_UNIT + self.step
    }

    fn lease(&self) -> Duration {
        self.unit * 3 / 2
    }

    fn ttl(&self) -> Duration {
        self.unit * 5 / 2
    }

    /// True while the current unit's operations are still in its first half.
    fn on_time(&self) -> bool {
        self.start.elapsed() < self.unit * self.units + self.unit / 2
    }

    fn fail(&self, what: String) -> TestCaseError {
        TestCaseError::fail(format!(
            "{what}\nsequence so far:\n  {}",
            self.log.join("\n  ")
        ))
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.log.push(format!("{op:?}"));
        let now = self.now();
        self.step += 1;
        match *op {
            Op::Advance(n) => {
                self.units += u32::from(n);
                self.step = 0;
                let at = self.start + self.unit * self.units;
                tokio::time::sleep_until(at.into()).await;
            }
            Op::Claim {
                key,
                fingerprint: f,
            } => {
                let k = &self.keys[key as usize];
                let fp = fingerprint(f);
                let real = self
                    .store
                    .claim(Claim {
                        name: NAME,
                        key: k,
                        fingerprint: &fp,
                        lease: self.lease(),
                        ttl: self.ttl(),
                    })
                    .await
                    .map_err(|e| self.fail(format!("claim failed: {e}")))?;
                let model = self.model.claim(NAME, k, &fp, MODEL_LEASE, MODEL_TTL, now);
                let issued = &mut self.issued[key as usize];
                match (&model, &real) {
                    (
                        ClaimOutcome::Claimed {
                            token: m,
                            takeover: mt,
                        },
                        ClaimOutcome::Claimed {
                            token: r,
                            takeover: rt,
                        },
                    ) => {
                        issued.0.push((*m, *r));
                        // The abandoned attempt's start is on each one's own clock.
                        let (mt, rt) = (mt.map(|t| t.attempt), rt.map(|t| t.attempt));
                        if mt != rt {
                            return Err(self.fail(format!(
                                "claim took over differently: model {mt:?}, store {rt:?}"
                            )));
                        }
                    }
                    (ClaimOutcome::Existing(m), ClaimOutcome::Existing(r)) => {
                        let mv = view(m, issued.model_index(m.token));
                        let rv = view(r, issued.real_index(r.token));
                        if mv != rv {
                            return Err(self.fail(format!(
                                "claim found different records: model {mv:?}, store {rv:?}"
                            )));
                        }
                    }
                    _ => {
                        return Err(
                            self.fail(format!("claim differs: model {model:?}, store {real:?}"))
                        )
                    }
                }
            }
            Op::Complete { key, token, value } => {
                let k = self.keys[key as usize];
                let (m, r) = self.issued[key as usize].pick(token);
                let real = self
                    .store
                    .complete(Complete {
                        key: &k,
                        token: r,
                        value: &[value],
                        ttl: self.ttl(),
                        tombstone: std::time::Duration::ZERO,
                    })
                    .await
                    .map_err(|e| self.fail(format!("complete failed: {e}")))?;
                let lapsed = self.lapsed(&k, now);
                let model = self.model.complete(&k, m, &[value], MODEL_TTL, now);
                self.same_fenced("complete", &k, lapsed, model, real)?;
            }
            Op::Release { key, token } => {
                let k = self.keys[key as usize];
                let (m, r) = self.issued[key as usize].pick(token);
                let real = self
                    .store
                    .release(&k, r)
                    .await
                    .map_err(|e| self.fail(format!("release failed: {e}")))?;
                let lapsed = self.lapsed(&k, now);
                let model = self.model.release(&k, m, now);
                self.same_fenced("release", &k, lapsed, model, real)?;
            }
            Op::Renew { key, token } => {
                let k = self.keys[key as usize];
                let (m, r) = self.issued[key as usize].pick(token);
                let real = self
                    .store
                    .renew(&k, r, self.lease())
                    .await
                    .map_err(|e| self.fail(format!("renew failed: {e}")))?;
                let lapsed = self.lapsed(&k, now);
                let model = self.model.renew(&k, m, MODEL_LEASE, now);
                self.same_fenced("renew", &k, lapsed, model, real)?;
            }
            Op::Get { key } => {
                let k = self.keys[key as usize];
                let real = self
                    .store
                    .get(&k)
                    .await
                    .map_err(|e| self.fail(format!("get failed: {e}")))?;
                let model = self.model.get(&k, now);
                self.same_record("get", key, model, real)?;
            }
            Op::ForceRelease { key } => {
                let k = self.keys[key as usize];
                let real = self
                    .store
                    .force_release(&k)
                    .await
                    .map_err(|e| self.fail(format!("force_release failed: {e}")))?;
                let model = self.model.force_release(&k, now);
                // Only a live record is released, and returned as it was.
                self.same_record("force_release", key, model, real)?;
            }
            Op::Park { key, token } => {
                let k = self.keys[key as usize];
                let (m, r) = self.issued[key as usize].pick(token);
                let real = self
                    .store
                    .park(&k, r)
                    .await
                    .map_err(|e| self.fail(format!("park failed: {e}")))?;
                let lapsed = self.lapsed(&k, now);
                let model = self.model.park(&k, m, now);
                self.same_fenced("park", &k, lapsed, model, real)?;
            }
            Op::Abandon { key, token } => {
                let k = self.keys[key as usize];
                let (m, r) = self.issued[key as usize].pick(token);
                let real = self
                    .store
                    .abandon(&k, r)
                    .await
                    .map_err(|e| self.fail(format!("abandon failed: {e}")))?;
                let lapsed = self.lapsed(&k, now);
                let model = self.model.abandon(&k, m, now);
                self.same_fenced("abandon", &k, lapsed, model, real)?;
            }
            Op::Resolve { key, applied } => {
                let k = self.keys[key as usize];
                let value = applied.map(|v| [v]);
                let resolution = match &value {
                    Some(v) => Resolve::Applied {
                        value: v,
                        ttl: self.ttl(),
                    },
                    None => Resolve::NotApplied,
                };
                let real = self
                    .store
                    .resolve(&k, resolution)
                    .await
                    .map_err(|e| self.fail(format!("resolve failed: {e}")))?;
                let model =
                    self.model
                        .resolve(&k, value.as_ref().map(|v| (&v[..], MODEL_TTL)), now);
                match (model, real) {
                    (Resolved::Done(m), Resolved::Done(r)) => {
                        self.same_record("resolve", key, Some(m), Some(r))?
                    }
                    (Resolved::NotParked(m), Resolved::NotParked(r)) => {
                        self.same_record("resolve (not parked)", key, m, r)?
                    }
                    (m, r) => return Err(self.fail(format!("resolve: model {m:?}, store {r:?}"))),
                }
            }
            Op::Purge => {
                let real = self
                    .store
                    .purge_expired(1000)
                    .await
                    .map_err(|e| self.fail(format!("purge failed: {e}")))?;
                let model = self.model.purge_expired(now);
                self.purged.0 += model;
                self.purged.1 += real;
                // A store may have dropped lapsed records on its own already (the memory store
                // evicts a few on every write to a shard), and may keep one a purge later: the
                // model's steps are a millisecond apart, a real release and the purge after it
                // may fall in one millisecond, which keeps the record (`may_forget`). So the
                // store never purges more than the model, counted over the sequence.
                let (model_total, real_total) = self.purged;
                if self.exclusive && real_total > model_total {
                    return Err(self.fail(format!(
                        "purge: model {model} ({model_total} so far), store {real} \
                         ({real_total} so far)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether the model holds a record of `key` that is no longer live: a store may have
    /// evicted or expired it already (the memory store on any write to its shard, Redis by
    /// key expiry) or not yet (SQL stores until a purge).
    fn lapsed(&self, key: &Digest, now: i64) -> bool {
        matches!(self.model.raw(key), Some(r) if !idem_runtime::protocol::is_live(r.expires_at, now))
    }

    /// Compares a fenced step's answers. On a lapsed record the store may answer `false`
    /// because it no longer has the record: then the model forgets it too.
    fn same_fenced(
        &mut self,
        what: &str,
        key: &Digest,
        lapsed: bool,
        model: bool,
        real: bool,
    ) -> Result<(), TestCaseError> {
        if model == real {
            return Ok(());
        }
        if lapsed && model && !real {
            self.model.forget(key);
            self.log
                .push("  (the store had dropped the lapsed record already)".to_string());
            return Ok(());
        }
        Err(self.fail(format!("{what}: model {model}, store {real}")))
    }

    fn same_record(
        &self,
        what: &str,
        key: u8,
        model: Option<Record>,
        real: Option<Record>,
    ) -> Result<(), TestCaseError> {
        let issued = &self.issued[key as usize];
        let mv = model.map(|m| view(&m, issued.model_index(m.token)));
        let rv = real.map(|r| view(&r, issued.real_index(r.token)));
        if mv != rv {
            return Err(self.fail(format!("{what}: model {mv:?}, store {rv:?}")));
        }
        Ok(())
    }
}

/// A key no other run, case or test uses (the servers are shared).
fn unique_key(case: u32, k: u8) -> Digest {
    static RUN: once_cell_lite::Run = once_cell_lite::Run::new();
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&RUN.id().to_be_bytes());
    d[8..12].copy_from_slice(&case.to_be_bytes());
    d[12] = k;
    d[13..].copy_from_slice(&[0x5a; 19]);
    Digest(d)
}

mod once_cell_lite {
    use std::sync::OnceLock;

    /// A per-process id from the clock and the pid.
    pub struct Run(OnceLock<u64>);

    impl Run {
        pub const fn new() -> Run {
            Run(OnceLock::new())
        }

        pub fn id(&self) -> u64 {
            *self.0.get_or_init(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                nanos ^ (u64::from(std::process::id()) << 40)
            })
        }
    }
}

/// Runs `cases` random sequences, each against a store `open` gives, `unit` apart in time.
/// `exclusive`: each store `open` gives is a new, empty one (so purge counts can be compared).
fn check_store<F, Fut>(what: &str, cases: u32, unit: Duration, exclusive: bool, open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Idem>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let case_no = AtomicU32::new(0);
    let overruns = AtomicU32::new(0);
    let compared = AtomicU32::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // Shrinking replays sequences with real sleeps: bounded so a failure reports soon.
        max_shrink_iters: 64,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..28), |ops| {
        let case = case_no.fetch_add(1, Ordering::Relaxed);
        rt.block_on(async {
            let idem = open().await;
            // A first round trip opens the pool's connection before the clock starts.
            let _ = idem.store().get(&unique_key(case, 9)).await;
            let mut h = Harness {
                store: idem.store(),
                model: ModelStore::new(),
                unit,
                exclusive,
                keys: [unique_key(case, 0), unique_key(case, 1)],
                issued: [Issued::default(), Issued::default()],
                purged: (0, 0),
                start: Instant::now(),
                units: 0,
                step: 0,
                log: Vec::new(),
            };
            for op in &ops {
                if !h.on_time() {
                    overruns.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                let compared_ok = h.apply(op).await;
                if !matches!(op, Op::Advance(_)) && !h.on_time() {
                    // The step ran past the half unit: its outcome may be either, so a
                    // disagreement says nothing (a purge that ran late on a busy host may
                    // already see records the model's clock keeps).
                    overruns.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                compared_ok?;
                compared.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{what}: the store and the model disagree: {e}");
    }
    let overruns = overruns.into_inner();
    let compared = compared.into_inner();
    println!("{what}: {cases} sequences, {compared} operations compared, {overruns} cut short");
    assert!(
        overruns * 4 <= cases,
        "{what}: {overruns} of {cases} sequences overran the half unit: the machine is too busy \
         for a {unit:?} unit"
    );
}

fn memory_store_matches_the_model((): ()) {
    check_store("memory", 48, Duration::from_millis(40), true, || async {
        Idem::memory()
    });
}

fn sqlite_store_matches_the_model((): ()) {
    check_store("sqlite", 32, Duration::from_millis(60), true, || async {
        Idem::sqlite("sqlite::memory:")
            .await
            .expect("open SQLite in memory")
    });
}

#[cfg(feature = "postgres")]
fn postgres_store_matches_the_model(url: String) {
    check_store(
        "postgres",
        24,
        Duration::from_millis(150),
        false,
        || async { Idem::postgres(&url).await.expect("open PostgreSQL") },
    );
}

#[cfg(feature = "mysql")]
fn mysql_store_matches_the_model(url: String) {
    check_store("mysql", 24, Duration::from_millis(150), false, || async {
        Idem::mysql(&url).await.expect("open MySQL")
    });
}

#[cfg(feature = "redis")]
fn redis_store_matches_the_model(url: String) {
    check_store("redis", 24, Duration::from_millis(100), false, || async {
        Idem::redis(&url).await.expect("open Redis")
    });
}

#[cfg(feature = "redis")]
fn redis_cluster_store_matches_the_model(urls: String) {
    let nodes: Vec<&str> = urls.split(',').collect();
    check_store(
        "redis cluster",
        24,
        Duration::from_millis(100),
        false,
        || async {
            Idem::redis_cluster(&nodes)
                .await
                .expect("open the Redis Cluster")
        },
    );
}

idem_integration::server_tests! {
    blocking ANYWHERE => [memory_store_matches_the_model, sqlite_store_matches_the_model],
    blocking POSTGRES => [#[cfg(feature = "postgres")] postgres_store_matches_the_model],
    blocking MYSQL => [#[cfg(feature = "mysql")] mysql_store_matches_the_model],
    blocking REDIS => [#[cfg(feature = "redis")] redis_store_matches_the_model],
    blocking REDIS_CLUSTER => [#[cfg(feature = "redis")] redis_cluster_store_matches_the_model],
}
