//! A Redis Cluster primary killed (SIGKILL) while 16 tasks make fresh calls, on a six-node
//! cluster this test starts on loopback ports of its own: with `wait_for_replicas` off and on.
//!
//! Redis replicates asynchronously, so a claim the dying primary acknowledged may never reach the
//! replica that takes over; a retry then finds no claim and runs the body again. The test reports
//! what happened (executions doubled, errors by kind, how long after the kill errors stopped, the
//! longest call) and asserts what idem promises: every call ends, in a result or a typed error,
//! within the lease plus the failover; and with `wait_for_replicas(1, …)` no body runs twice.

mod redis_support;

use idem::store::redis::RedisOptions;
use redis_support::TempCluster;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TASKS: usize = 16;
const LEASE: Duration = Duration::from_secs(2);
/// A call must end within its lease and the failover (node timeout 1 s, election, slot refresh).
const LONGEST_CALL: Duration = Duration::from_secs(20);

#[derive(Debug, Default)]
struct Report {
    calls: usize,
    doubled: usize,
    errors: BTreeMap<String, usize>,
    errors_stopped_after: Duration,
    longest_call: Duration,
}

async fn failover_under_load(wait_for_replicas: bool) -> Report {
    let cluster = tokio::task::spawn_blocking(TempCluster::start)
        .await
        .unwrap();
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut options = RedisOptions::cluster(&nodes).unwrap();
    if wait_for_replicas {
        options = options.wait_for_replicas(1, Duration::from_millis(500));
    }
    let idem = idem::Idem::from_store(options.connect().await.expect("open the cluster"));

    let executions: Arc<Mutex<HashMap<(usize, usize), u32>>> = Arc::default();
    let errors: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let name = idem::testkit::unique("failover");
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (idem, executions, errors, stop, name) = (
            idem.clone(),
            executions.clone(),
            errors.clone(),
            stop.clone(),
            name.clone(),
        );
        tasks.spawn(async move {
            let (mut calls, mut longest) = (0usize, Duration::ZERO);
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // One key until it succeeds, as a client retries one request.
                let key = (task, i);
                let started = Instant::now();
                let executions = executions.clone();
                let out = idem
                    .call(name.clone())
                    .key(&key)
                    .lease(LEASE)
                    .run(async move {
                        *executions.lock().unwrap().entry(key).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, idem::Error>(key.1)
                    })
                    .await;
                calls += 1;
                longest = longest.max(started.elapsed());
                match out {
                    Ok(_) => i += 1,
                    Err(e) => {
                        {
                            let mut errors = errors.lock().unwrap();
                            if errors.len() < 3 {
                                eprintln!("redis failover: error {e}");
                            }
                            errors.push((Instant::now(), format!("{:?}", e.kind())));
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            (calls, longest)
        });
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut cluster = cluster;
    let victim = cluster.a_primary();
    let killed_at = Instant::now();
    cluster.nodes[victim].kill();
    let alive: Vec<usize> = (0..6).filter(|&n| n != victim).collect();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_ok(&alive);
        cluster
    })
    .await
    .unwrap();
    // Calls keep going for a while on the healed cluster.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    let mut report = Report::default();
    let deadline = Instant::now() + LONGEST_CALL;
    while let Some(done) =
        tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), tasks.join_next())
            .await
            .expect("every call ends within the lease plus the failover")
    {
        let (calls, longest) = done.unwrap();
        report.calls += calls;
        report.longest_call = report.longest_call.max(longest);
    }
    report.doubled = executions
        .lock()
        .unwrap()
        .values()
        .filter(|&&n| n > 1)
        .count();
    for (at, kind) in errors.lock().unwrap().iter() {
        *report.errors.entry(kind.clone()).or_default() += 1;
        report.errors_stopped_after = report
            .errors_stopped_after
            .max(at.saturating_duration_since(killed_at));
    }
    drop(cluster);
    report
}

async fn a_primary_killed_under_load() {
    for wait in [false, true] {
        let r = failover_under_load(wait).await;
        println!(
            "redis failover (wait_for_replicas {}): {} calls, {} executions doubled, errors {:?}, \
             errors stopped {} ms after the kill, longest call {} ms",
            if wait { "on" } else { "off" },
            r.calls,
            r.doubled,
            r.errors,
            r.errors_stopped_after.as_millis(),
            r.longest_call.as_millis(),
        );
        assert!(r.longest_call < LONGEST_CALL, "{r:?}");
        for kind in r.errors.keys() {
            assert!(
                kind.starts_with("Store(") || kind == "InProgress" || kind == "LeaseLost",
                "only typed store, in-progress or lease-lost errors: {r:?}"
            );
        }
        if wait {
            assert_eq!(
                r.doubled, 0,
                "with wait_for_replicas no body runs twice: {r:?}"
            );
        }
    }
}

/// On a server without replicas, `wait_for_replicas(1, …)` refuses every claim before its body
/// runs, and releases it: the same key runs at once on a handle without the option.
async fn too_few_replicas_refuse_the_claim_before_the_body(url: String) {
    let strict = idem::Idem::from_store(
        RedisOptions::from_url(&url)
            .unwrap()
            .wait_for_replicas(1, Duration::from_millis(50))
            .connect()
            .await
            .unwrap(),
    );
    let plain = idem::Idem::redis(&url).await.unwrap();
    let name = idem::testkit::unique("replicas");
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let body = |ran: Arc<std::sync::atomic::AtomicUsize>| async move {
        ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<_, idem::Error>(7u8)
    };
    let e = strict
        .call(name.clone())
        .key("k")
        .run(body(ran.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        idem::ErrorKind::Store(idem::StoreErrorKind::Timeout),
        "{e}"
    );
    assert!(e.to_string().contains("0 of 1 replicas"), "{e}");
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the body did not run"
    );
    let out = plain
        .call(name)
        .key("k")
        .run(body(ran.clone()))
        .await
        .expect("the refused claim was released");
    assert!(!out.is_replayed());
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}

async fn wait_for_replicas_needs_a_replica_and_a_timeout_under_the_response_timeout() {
    for (n, timeout) in [
        (0, Duration::from_millis(100)),
        (1, Duration::ZERO),
        (1, Duration::from_secs(5)),
    ] {
        let opened = RedisOptions::new()
            .response_timeout(Duration::from_secs(2))
            .wait_for_replicas(n, timeout)
            .connect()
            .await;
        let e = opened.expect_err("refused before connecting");
        assert_eq!(e.kind(), idem::ErrorKind::Config, "{e}");
    }
}

idem_integration::server_tests! {
    ANYWHERE => [wait_for_replicas_needs_a_replica_and_a_timeout_under_the_response_timeout],
    REDIS => [too_few_replicas_refuse_the_claim_before_the_body],
    // The cluster is the test's own: six redis-server processes on free ports.
    REDIS_SERVER => [a_primary_killed_under_load],
}
