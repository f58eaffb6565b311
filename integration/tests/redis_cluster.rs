//! The Redis store on a real Redis Cluster (`IDEM_TEST_REDIS_CLUSTER_URL`: the nodes' URLs,
//! comma-separated, as `.ci/redis-cluster start DIR` prints them): what opening refuses, the
//! operator's view over every primary, and four processes racing over keys in every slot.

mod redis_support;

use idem::store::redis::RedisOptions;
use idem::store::{Filter, Inspect};

use idem::{ErrorKind, StoreErrorKind};
use redis::AsyncCommands;
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const WORKERS: usize = 4;
const KEYS: usize = 300;
const IN_FLIGHT: usize = 16;

/// The nodes of `IDEM_TEST_REDIS_CLUSTER_URL` (comma-separated).
fn cluster_nodes(urls: &str) -> Vec<String> {
    urls.split(',').map(str::to_string).collect()
}

fn refs(nodes: &[String]) -> Vec<&str> {
    nodes.iter().map(String::as_str).collect()
}

async fn cluster_conn(nodes: &[String]) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(refs(nodes))
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

async fn an_empty_node_list_is_a_config_error() {
    let e = idem::Idem::redis_cluster(&[]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("at least one node"), "{e}");
}

async fn a_server_without_cluster_mode_is_named(url: String) {
    let e = idem::Idem::redis_cluster(&[&url]).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::Store(StoreErrorKind::Unsupported),
        "{e}"
    );
    assert!(e.to_string().contains("without cluster mode"), "{e}");
}

async fn a_cluster_with_unassigned_slots_is_refused_at_open() {
    // A lone node in cluster mode that serves no slot: a cluster nobody finished creating.
    let node = redis_support::TempRedis::start(&["--cluster-enabled", "yes"]);
    let url = format!("redis://127.0.0.1:{}/", node.port);
    let e = idem::Idem::redis_cluster(&[&url]).await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Store(_)),
        "a typed store error, not {e:?}"
    );
    assert!(e.to_string().contains("slot"), "names the slots: {e}");
}

async fn the_operators_view_covers_every_primary(urls: String) {
    let nodes = cluster_nodes(&urls);
    let prefix = format!("idem-test-{}", idem::testkit::unique("inspect"));
    let store = RedisOptions::cluster(&refs(&nodes))
        .unwrap()
        .key_prefix(prefix.clone())
        .connect()
        .await
        .expect("open the cluster store");
    let idem = idem::Idem::from_store(
        RedisOptions::cluster(&refs(&nodes))
            .unwrap()
            .key_prefix(prefix.clone())
            .connect()
            .await
            .unwrap(),
    );
    // 60 keys land on all three primaries (each owns a third of the slots).
    for k in 0..60u32 {
        idem.call("inspected")
            .key(&k)
            .run(async move { Ok::<_, idem::Error>(k) })
            .await
            .unwrap();
    }
    let mut con = cluster_conn(&nodes).await;
    let mut owners = std::collections::BTreeSet::new();
    let listed = store.list(&Filter::default()).await.unwrap();
    for info in &listed {
        let key = format!("{prefix}:v1:{{{}}}", info.key.to_hex());
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        owners.insert(slot / 5462);
    }
    assert_eq!(listed.len(), 60, "every key listed, on every primary");
    assert_eq!(
        owners.len(),
        3,
        "the keys span the three primaries' slot ranges"
    );
    let stats = store.stats().await.unwrap();
    let total: u64 = stats
        .iter()
        .filter(|s| s.state == idem::store::State::Completed)
        .map(|s| s.count)
        .sum();
    assert_eq!(total, 60, "{stats:?}");
}

/// A duplicate that waits is told of the completion on the shard that owns the key: while it
/// waits, its key's channel is a shard channel (`PUBSUB SHARDCHANNELS`) on exactly one node, no
/// plain channel exists, and it replays the value as soon as the first call completes, long
/// before the 5 s after which a waiter looks again on its own.
async fn a_waiter_is_told_on_its_shard(urls: String) {
    let nodes = cluster_nodes(&urls);
    let prefix = format!("idem-test-{}", idem::testkit::unique("shard"));
    let open = || async {
        idem::Idem::from_store(
            RedisOptions::cluster(&refs(&nodes))
                .unwrap()
                .key_prefix(prefix.clone())
                .connect()
                .await
                .unwrap(),
        )
    };
    let (first, second) = (open().await, open().await);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        first
            .call("shard")
            .key("k")
            .run(async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, idem::Error>(42u32)
            })
            .await
            .unwrap()
    });
    started_rx.await.unwrap();
    let waiter = tokio::spawn(async move {
        let out = second
            .call("shard")
            .key("k")
            .wait(Duration::from_secs(30))
            .run(async { Ok::<_, idem::Error>(0u32) })
            .await
            .unwrap();
        (
            out.is_replayed(),
            out.into_inner(),
            std::time::Instant::now(),
        )
    });
    // Wait until the waiter has subscribed, counting its shard channel on every node.
    let pattern = format!("{prefix}:*");
    let mut shard_channels = 0;
    for _ in 0..200 {
        shard_channels = 0;
        let mut plain_channels = 0;
        for node in &nodes {
            let con = redis::Client::open(node.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let channels = |kind: &'static str| {
                let pattern = pattern.clone();
                let mut con = con.clone();
                async move {
                    let names: Vec<String> = redis::cmd("PUBSUB")
                        .arg(kind)
                        .arg(&pattern)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    names.len()
                }
            };
            let (shard, plain) = (channels("SHARDCHANNELS").await, channels("CHANNELS").await);
            shard_channels += shard;
            plain_channels += plain;
        }
        assert_eq!(plain_channels, 0, "no plain channel on a cluster");
        if shard_channels == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(shard_channels, 1, "the waiter's shard channel, on one node");
    let completed_at = std::time::Instant::now();
    finish_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().into_inner(), 42);
    let (replayed, value, woke_at) = waiter.await.unwrap();
    assert!(replayed);
    assert_eq!(value, 42);
    let after = woke_at.duration_since(completed_at);
    assert!(
        after < Duration::from_secs(3),
        "told by the shard, not by its own 5 s look: woke {after:?} after the completion"
    );
}

/// Four OS processes race over 300 keys spread over every slot: each key's side effect (an
/// `INCR` of a counter of its own) happens exactly once, and every process gets that one
/// execution's value back. The test spawns `current_exe()` four times with
/// `IDEM_CLUSTER_MP_WORKER` set; in a worker, the same test runs the worker's part instead.
fn four_processes_race_over_keys_in_every_slot(urls: String) {
    let nodes = cluster_nodes(&urls);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(worker) = std::env::var("IDEM_CLUSTER_MP_WORKER") {
        let run = std::env::var("IDEM_CLUSTER_MP_RUN").expect("run id");
        rt.block_on(worker_part(&nodes, &run, worker.parse().unwrap()));
        return;
    }

    let run = idem::testkit::unique("cmp");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|w| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "four_processes_race_over_keys_in_every_slot",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEM_CLUSTER_MP_WORKER", w.to_string())
                .env("IDEM_CLUSTER_MP_RUN", &run)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut seen: Vec<HashMap<usize, u64>> = Vec::new();
    for (w, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "worker {w} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: HashMap<usize, u64> = stdout
            .lines()
            // libtest's own "test … " may start the first line: find the marker anywhere.
            .filter_map(|l| l.split_once("idem-cmp ").map(|(_, rest)| rest))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.parse().unwrap(), v.trim().parse().unwrap())
            })
            .collect();
        assert_eq!(got.len(), KEYS, "worker {w} did not finish every key");
        seen.push(got);
    }

    rt.block_on(async {
        let mut con = cluster_conn(&nodes).await;
        for k in 0..KEYS {
            let runs: u64 = con.get(counter(&run, k)).await.unwrap();
            assert_eq!(runs, 1, "key {k} ran {runs} times");
            for (w, got) in seen.iter().enumerate() {
                assert_eq!(got[&k], k as u64 * 1000 + 1, "worker {w}, key {k}");
            }
            let _: i64 = con.del(counter(&run, k)).await.unwrap();
        }
    });
}

/// The side-effect counter of key `k`: no hash tag, so the counters spread over every slot.
fn counter(run: &str, k: usize) -> String {
    format!("idem-test:cmp:{run}:{k}")
}

/// One worker: every key once, in an order of its own, 16 in flight; a duplicate in flight is
/// waited for, and asked again until it has the value.
async fn worker_part(nodes: &[String], run: &str, worker: usize) {
    let idem = idem::Idem::redis_cluster(&refs(nodes)).await.expect("open");
    let con = cluster_conn(nodes).await;
    let name = format!("{run}-ns");
    let sem = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let order: Vec<usize> = if worker % 2 == 0 {
        (0..KEYS)
            .map(|i| (i + worker * KEYS / WORKERS) % KEYS)
            .collect()
    } else {
        (0..KEYS).rev().collect()
    };
    for k in order {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let (idem, con, name, run) = (idem.clone(), con.clone(), name.clone(), run.to_string());
        tasks.spawn(async move {
            let _permit = permit;
            loop {
                let mut body_con = con.clone();
                let counter = counter(&run, k);
                let out = idem
                    .call(name.clone())
                    .key(&k)
                    .ttl(Duration::from_secs(600))
                    .wait(Duration::from_secs(10))
                    .run(async move {
                        let n: u64 = body_con
                            .incr(&counter, 1)
                            .await
                            .map_err(|e| idem::Error::store("redis", "body", e))?;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, idem::Error>(k as u64 * 1000 + n)
                    })
                    .await;
                match out {
                    Ok(o) => return (k, o.into_inner()),
                    Err(e) if e.is_in_progress() => continue,
                    Err(e) => panic!("key {k}: {e}"),
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (k, value) = done.unwrap();
        println!("idem-cmp {k}={value}");
    }
}

idem_integration::server_tests! {
    ANYWHERE => [an_empty_node_list_is_a_config_error],
    REDIS => [a_server_without_cluster_mode_is_named],
    REDIS_SERVER => [a_cluster_with_unassigned_slots_is_refused_at_open],
    REDIS_CLUSTER => [the_operators_view_covers_every_primary, a_waiter_is_told_on_its_shard],
    blocking REDIS_CLUSTER => [four_processes_race_over_keys_in_every_slot],
}
