//! Idempotent calls per second on Redis at concurrency 1, 16 and 64, fresh (`redis/fresh`) and
//! replayed (`redis/replay`), against two floors on the same `ConnectionManager`:
//! - `raw`: raw redis-rs running idem's own scripts (fresh: claim and complete; replay: the
//!   claim that finds the finished record), so the difference is idem's own work (key
//!   derivation, codec, protocol, the store's bookkeeping);
//! - `raw_minimal`: the least Redis can do for the same job, without scripts, fencing or
//!   fingerprints: `SET NX PX` + `SET PX` for a fresh call, one `GET` for a replay.
//!
//! Runs on a private redis-server on a free loopback port (nothing else's load in the numbers);
//! needs `redis-server` on the PATH. `cargo bench -p idem-benches --bench redis`.

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "../integration/tests/redis_support/mod.rs"]
mod redis_support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use redis::aio::ConnectionManager;
use redis::Script;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CLAIM: &str = include_str!("../idem-runtime/src/store/redis/claim.lua");
const COMPLETE: &str = include_str!("../idem-runtime/src/store/redis/complete.lua");

struct Raw {
    conn: ConnectionManager,
    claim: Script,
    complete: Script,
}

/// Keys the replays read, stored before they run.
const REPLAY_KEYS: u64 = 1024;
/// Replay keys live far from the fresh ones, which count up from 0.
const REPLAY_BASE: u64 = 1 << 60;

impl Raw {
    /// The claim script idem runs first on every call, with arguments of the same shape.
    async fn claim(&self, key: &str, n: u64) -> Vec<redis::Value> {
        let mut conn = self.conn.clone();
        let reply: redis::Value = self
            .claim
            .key(key)
            .arg("bench")
            .arg(&[7u8; 32][..])
            .arg("30000")
            .arg(&n.to_le_bytes()[..])
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let redis::Value::Array(items) = reply else {
            panic!("claim: {reply:?}")
        };
        items
    }

    /// A replay: the claim finds the finished record and returns it (idem's one round trip).
    async fn replay(&self, n: u64) {
        let items = self.claim(&format!("rawbench:v1:{{{n:064x}}}"), n).await;
        assert_eq!(items[0], redis::Value::Int(0), "not a replay: {items:?}");
    }

    /// The same two script calls idem makes for a fresh call, with arguments of the same shape.
    async fn call(&self, n: u64) {
        let key = format!("rawbench:v1:{{{n:064x}}}");
        let mut conn = self.conn.clone();
        let items = self.claim(&key, n).await;
        let token = match &items[1] {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("token: {other:?}"),
        };
        let done: i64 = self
            .complete
            .key(&key)
            .arg(&token)
            .arg(&b"\x01{\"ok\":1}"[..])
            .arg("600000")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(done, 1);
    }

    /// One call of a raw variant: idem's scripts (`raw`) or the minimal commands.
    async fn run(&self, variant: &str, replay: bool, n: u64) {
        match (variant, replay) {
            ("raw", true) => self.replay(n).await,
            ("raw", false) => self.call(n).await,
            (_, true) => self.minimal_replay(n).await,
            (_, false) => self.minimal_call(n).await,
        }
    }

    /// The minimal commands: claim with `SET NX PX`, complete with `SET PX`.
    async fn minimal_call(&self, n: u64) {
        let key = format!("rawmin:{{{n:064x}}}");
        let mut conn = self.conn.clone();
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("0")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(claimed.is_some(), "key {n} was taken");
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(&b"\x01{\"ok\":1}"[..])
            .arg("PX")
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// The minimal replay: one `GET`.
    async fn minimal_replay(&self, n: u64) {
        let mut conn = self.conn.clone();
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(format!("rawmin:{{{n:064x}}}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(v.is_some(), "not a replay: {n}");
    }
}

fn bench(c: &mut Criterion) {
    let server = redis_support::TempRedis::start(&[]);
    let rt = drive::runtime();
    let url = server.url();
    let idem = rt.block_on(idem::Idem::redis(&url)).unwrap();
    let raw = Arc::new(Raw {
        conn: rt
            .block_on(ConnectionManager::new(
                redis::Client::open(url.as_str()).unwrap(),
            ))
            .unwrap(),
        claim: Script::new(CLAIM),
        complete: Script::new(COMPLETE),
    });
    let next = Arc::new(AtomicU64::new(0));

    rt.block_on(async {
        for n in REPLAY_BASE..REPLAY_BASE + REPLAY_KEYS {
            drive::keyed_call(&idem, n, false).await;
            raw.call(n).await;
            raw.minimal_call(n).await;
        }
    });
    // One call of a variant (`idem`, `raw`, `raw_minimal`). A replay reads one of the stored
    // keys; a fresh call takes a new one.
    let op = |variant: &'static str, replay: bool| -> paired::Op {
        let (idem, raw, next) = (idem.clone(), raw.clone(), next.clone());
        Arc::new(move |_| {
            let (idem, raw, next) = (idem.clone(), raw.clone(), next.clone());
            Box::pin(async move {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let n = if replay {
                    REPLAY_BASE + n % REPLAY_KEYS
                } else {
                    n
                };
                match variant {
                    "idem" => drive::keyed_call(&idem, n, replay).await,
                    _ => raw.run(variant, replay, n).await,
                }
            })
        })
    };
    const VARIANTS: [&str; 3] = ["idem", "raw", "raw_minimal"];
    for (mode, replay) in [("replay", true), ("fresh", false)] {
        let mut g = c.benchmark_group(format!("redis/{mode}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Elements(1));
        for concurrency in [1u64, 16, 64] {
            for variant in VARIANTS {
                let op = op(variant, replay);
                g.bench_with_input(
                    BenchmarkId::new(variant, concurrency),
                    &concurrency,
                    |b, &concurrency| {
                        b.to_async(&rt).iter_custom(|iters| {
                            let op = op.clone();
                            drive::drive(concurrency, iters, move |i| op(i))
                        })
                    },
                );
            }
        }
        g.finish();
    }

    // The same comparisons as paired ratios (see support/paired.rs).
    let mut rows = Vec::new();
    for (mode, replay) in [("replay", true), ("fresh", false)] {
        for conc in [1u64, 16, 64] {
            let variants: Vec<_> = VARIANTS.map(|v| (v, op(v, replay))).into();
            rows.push((mode, conc, paired::paired(&rt, conc, &variants)));
        }
    }
    notes::write_note("paired-redis.md", &paired::table("Redis", &rows));
    drop(server);
}

criterion_group!(benches, bench);
criterion_main!(benches);
