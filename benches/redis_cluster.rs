//! A Redis Cluster beside one Redis server, and what `wait_for_replicas` costs: idempotent
//! calls, fresh (`redis_cluster/fresh`) and replayed (`redis_cluster/replay`), at concurrency 1,
//! 16 and 64, as paired ratios (support/paired.rs) of three variants measured in alternation:
//! - `cluster`: `Idem::redis_cluster` on three primaries with a replica each;
//! - `single`: `Idem::redis` on one server started the same way (no persistence);
//! - `cluster_wait`: the same cluster with `wait_for_replicas(1, 500 ms)`, so every claim and
//!   every completion waits for a replica's acknowledgement (a replay writes nothing and waits
//!   for none).
//!
//! Every server is this bench's own, on free loopback ports: seven `redis-server` processes and
//! `redis-cli` for `--cluster create`, both needed on the PATH. All of them share this host's
//! cores with the client, so "does a cluster scale" is answered for one host only: see
//! docs/redis.md. `cargo bench -p idem-benches --bench redis_cluster`.

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "../integration/tests/redis_support/mod.rs"]
mod redis_support;

use idem::store::redis::RedisOptions;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Keys the replays read, stored before they run.
const REPLAY_KEYS: u64 = 1024;
/// Replay keys live far from the fresh ones, which count up from 0.
const REPLAY_BASE: u64 = 1 << 60;

fn main() {
    let cluster = redis_support::TempCluster::start();
    let single = redis_support::TempRedis::start(&[]);
    let rt = drive::runtime();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let handles: Vec<(&'static str, idem::Idem)> = rt.block_on(async {
        let waiting = RedisOptions::cluster(&nodes)
            .unwrap()
            .wait_for_replicas(1, Duration::from_millis(500))
            .connect()
            .await
            .unwrap();
        vec![
            ("cluster", idem::Idem::redis_cluster(&nodes).await.unwrap()),
            ("single", idem::Idem::redis(&single.url()).await.unwrap()),
            ("cluster_wait", idem::Idem::from_store(waiting)),
        ]
    });
    // Each handle its own fresh keys: the cluster and its waiting twin share a keyspace.
    let next: Vec<Arc<AtomicU64>> = (0..handles.len() as u64)
        .map(|h| Arc::new(AtomicU64::new(h << 48)))
        .collect();
    rt.block_on(async {
        for n in REPLAY_BASE..REPLAY_BASE + REPLAY_KEYS {
            drive::keyed_call(&handles[0].1, n, false).await;
            drive::keyed_call(&handles[1].1, n, false).await;
        }
    });
    let op = |h: usize, replay: bool| -> paired::Op {
        let (idem, next) = (handles[h].1.clone(), next[h].clone());
        Arc::new(move |_| {
            let (idem, next) = (idem.clone(), next.clone());
            Box::pin(async move {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if replay {
                    drive::keyed_call(&idem, REPLAY_BASE + n % REPLAY_KEYS, true).await
                } else {
                    drive::keyed_call(&idem, n, false).await
                }
            })
        })
    };
    let mut rows = Vec::new();
    for (mode, replay) in [("replay", true), ("fresh", false)] {
        for conc in [1u64, 16, 64] {
            let variants: Vec<_> = (0..handles.len())
                .map(|h| (handles[h].0, op(h, replay)))
                .collect();
            rows.push((mode, conc, paired::paired(&rt, conc, &variants)));
        }
    }
    notes::write_note(
        "paired-redis-cluster.md",
        &paired::table("Redis Cluster", &rows),
    );
    drop(handles);
    drop(rt);
    drop((cluster, single));
}
