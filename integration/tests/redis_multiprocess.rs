//! Four OS processes race over the same 500 keys on one Redis server: every key's side effect
//! (an `RPUSH` onto a list of its own) happens exactly once, and every process gets that one
//! execution's value back, fresh or replayed.
//!
//! The test spawns `current_exe()` four times with `IDEM_REDIS_MP_WORKER` set; in a worker, the
//! same test function runs the worker's part instead.

use redis::AsyncCommands;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const WORKERS: usize = 4;
const KEYS: usize = 500;
const IN_FLIGHT: usize = 16;

fn effects_list(run: &str, k: usize) -> String {
    format!("idem-test:mp:{run}:effects:{k}")
}

fn seen_hash(run: &str, worker: usize) -> String {
    format!("idem-test:mp:{run}:seen:{worker}")
}

fn four_processes_race_over_the_same_500_keys(url: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(worker) = std::env::var("IDEM_REDIS_MP_WORKER") {
        let run = std::env::var("IDEM_REDIS_MP_RUN").expect("run id");
        rt.block_on(worker_part(&url, &run, worker.parse().unwrap()));
        return;
    }

    let run = idem::testkit::unique("mp");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|w| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "four_processes_race_over_the_same_500_keys",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEM_REDIS_MP_WORKER", w.to_string())
                .env("IDEM_REDIS_MP_RUN", &run)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut fresh_total = 0;
    for (w, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "worker {w} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fresh: usize = stdout
            .lines()
            .find_map(|l| l.split_once("idem-mp-fresh=").map(|(_, n)| n))
            .unwrap_or_else(|| panic!("worker {w} reported nothing: {stdout}"))
            .trim()
            .parse()
            .unwrap();
        fresh_total += fresh;
    }

    rt.block_on(async {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let mut seen = Vec::new();
        for w in 0..WORKERS {
            let m: std::collections::HashMap<usize, String> =
                con.hgetall(seen_hash(&run, w)).await.unwrap();
            assert_eq!(m.len(), KEYS, "worker {w} did not finish every key");
            seen.push(m);
        }
        for k in 0..KEYS {
            let effects: Vec<String> = con.lrange(effects_list(&run, k), 0, -1).await.unwrap();
            assert_eq!(
                effects.len(),
                1,
                "key {k} ran {} times: {effects:?}",
                effects.len()
            );
            for (w, m) in seen.iter().enumerate() {
                assert_eq!(
                    m[&k], effects[0],
                    "worker {w} got another value for key {k}"
                );
            }
        }
        assert_eq!(fresh_total, KEYS, "fresh outcomes over all workers");
        let mut cleanup = redis::pipe();
        for k in 0..KEYS {
            cleanup.del(effects_list(&run, k));
        }
        for w in 0..WORKERS {
            cleanup.del(seen_hash(&run, w));
        }
        let () = cleanup.query_async(&mut con).await.unwrap();
    });
}

/// One worker: every key once, in an order of its own, 16 in flight; a duplicate in flight is
/// waited for and retried until it has the value.
async fn worker_part(url: &str, run: &str, worker: usize) {
    let idem = idem::Idem::redis(url).await.expect("open");
    let client = redis::Client::open(url).unwrap();
    let con = client.get_multiplexed_async_connection().await.unwrap();
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
                let list = effects_list(&run, k);
                let out = idem
                    .call(name.clone())
                    .key(&k)
                    .ttl(Duration::from_secs(600))
                    .wait(Duration::from_secs(10))
                    .run(async move {
                        let tag = format!("w{worker}");
                        let _: i64 = body_con
                            .rpush(&list, &tag)
                            .await
                            .map_err(|e| idem::Error::Config(e.to_string()))?;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, idem::Error>(tag)
                    })
                    .await;
                match out {
                    Ok(o) => return (k, o.is_replayed(), o.into_inner()),
                    Err(e) if e.is_in_progress() => continue,
                    Err(e) => panic!("key {k}: {e}"),
                }
            }
        });
    }
    let mut fresh = 0;
    let mut con = con;
    while let Some(done) = tasks.join_next().await {
        let (k, replayed, value) = done.unwrap();
        fresh += usize::from(!replayed);
        let _: i64 = con.hset(seen_hash(run, worker), k, value).await.unwrap();
    }
    println!("\nidem-mp-fresh={fresh}");
}

idem_integration::server_tests! {
    blocking REDIS => [
        four_processes_race_over_the_same_500_keys,
    ],
}
