//! A completion must not outlive its own lease: with every backend of the store killed about
//! every 200 ms, calls whose body (300 ms) is well inside their lease (1.5 s) finish without
//! `LeaseLost`, although their completions fail over dead connections and are retried.
//!
//! Before the engine kept renewing the lease while a completion was being retried, a completion
//! could take seconds (each retry finding another dead pooled connection), the lease lapsed
//! meanwhile, a duplicate took the key over and ran the body again, and the first attempt's
//! completion was then refused with `LeaseLost`.

mod pg_common;

use idem::store::postgres::PostgresOptions;
use idem::testkit::unique;
use idem::{Error, Idem};
use pg_common::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_millis(1500);
const BODY: Duration = Duration::from_millis(300);
const KILL_EVERY: Duration = Duration::from_millis(200);
/// Keys, each called by two concurrent clients (so a lapsed lease would run a key twice);
/// `IDEM_LEASE_FAULT_KEYS` sets another count for a longer measurement.
fn keys() -> usize {
    std::env::var("IDEM_LEASE_FAULT_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}
/// Keys in flight at once.
const LANES: usize = 6;
/// Attempts and time one client spends on one key, at most.
const MAX_TRIES: usize = 200;
const KEY_DEADLINE: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Tally {
    runs: HashMap<usize, usize>,
    lease_lost: usize,
    store_errors: usize,
    in_progress: usize,
    unfinished: usize,
}

/// One client's calls for key `k` until it has the value (or its bounds run out).
async fn client(idem: Idem, name: String, k: usize, tally: Arc<Mutex<Tally>>) {
    let deadline = Instant::now() + KEY_DEADLINE;
    for _ in 0..MAX_TRIES {
        if Instant::now() >= deadline {
            break;
        }
        let t = tally.clone();
        let out = idem
            .call(name.clone())
            .key(&k)
            .lease(LEASE)
            .run(async move {
                *t.lock().unwrap().runs.entry(k).or_default() += 1;
                tokio::time::sleep(BODY).await;
                Ok::<_, Error>(k)
            })
            .await;
        {
            let mut t = tally.lock().unwrap();
            match out {
                Ok(v) => {
                    assert_eq!(v.into_inner(), k);
                    return;
                }
                Err(Error::LeaseLost { .. }) => {
                    t.lease_lost += 1;
                    return;
                }
                Err(Error::InProgress { .. }) => t.in_progress += 1,
                Err(Error::Store(_)) => t.store_errors += 1,
                Err(e) => panic!("unexpected error for key {k}: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tally.lock().unwrap().unfinished += 1;
}

async fn no_lease_lost_for_a_body_inside_its_lease_while_backends_are_killed(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("lease_kill"), unique_table("idem_lease"));
    let store = PostgresOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .application_name(&app)
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let name = unique("lease-kill");

    let killing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let killer = {
        let (admin, app, killing) = (admin.clone(), app.clone(), killing.clone());
        tokio::spawn(async move {
            let mut kills = 0i64;
            while killing.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(KILL_EVERY).await;
                kills += sqlx::query_scalar::<_, i64>(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1",
                )
                .bind(&app)
                .fetch_one(&admin)
                .await
                .unwrap_or(0);
            }
            kills
        })
    };

    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    for lane in (0..keys()).collect::<Vec<_>>().chunks(LANES) {
        let mut clients = Vec::new();
        for &k in lane {
            for _ in 0..2 {
                clients.push(tokio::spawn(client(
                    idem.clone(),
                    name.clone(),
                    k,
                    tally.clone(),
                )));
            }
        }
        for c in clients {
            c.await.unwrap();
        }
    }
    killing.store(false, std::sync::atomic::Ordering::Relaxed);
    let kills = killer.await.unwrap();

    {
        let t = tally.lock().unwrap();
        let twice = t.runs.values().filter(|&&n| n > 1).count();
        eprintln!(
            "lease faults: {} keys x 2 clients in {:?}, {kills} backends killed; \
             LeaseLost {}, keys run twice {twice}, store errors {}, in progress {}, unfinished {}",
            keys(),
            started.elapsed(),
            t.lease_lost,
            t.store_errors,
            t.in_progress,
            t.unfinished,
        );
        assert!(kills > 0, "the killer found the store's backends");
        assert_eq!(t.lease_lost, 0, "no attempt outlived its lease");
        assert_eq!(twice, 0, "no key ran twice");
        assert_eq!(t.unfinished, 0, "every key finished within its bounds");
    }
    drop_table(&admin, &table).await;
}

/// The mechanism, made certain: the body ends by killing every backend of its store, so the
/// completion meets a pool of dead connections and its retries (each taking, testing and
/// dropping one, with a growing backoff) outlast the lease left. A duplicate on another pool
/// asks every 50 ms. The lease stays renewed while the completion is retried, so the duplicate
/// never takes over, the body runs once, and the completion lands.
async fn a_completion_retried_over_dead_connections_keeps_its_lease(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("lease_dead"), unique_table("idem_dead"));
    let open = |app: String| {
        let (url, table) = (url.clone(), table.clone());
        async move {
            PostgresOptions::from_url(&url)
                .unwrap()
                .table(&table)
                .application_name(app)
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap()
        }
    };
    let idem = Idem::from_store(open(app.clone()).await);
    let other = Idem::from_store(open(unique_table("idem_dup")).await);
    let name = unique("lease-dead");
    // Eight connections open, then idle in the pool.
    let warm: Vec<_> = (0..8u32)
        .map(|k| {
            idem.call(format!("{name}-warm")).key(&k).run(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, Error>(())
            })
        })
        .collect();
    let warm: Vec<_> = warm.into_iter().map(tokio::spawn).collect();
    for w in warm {
        w.await.unwrap().unwrap();
    }

    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let body = |kill: bool| {
        let (runs, admin, app) = (runs.clone(), admin.clone(), app.clone());
        async move {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(BODY).await;
            if kill {
                sqlx::query(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1",
                )
                .bind(&app)
                .execute(&admin)
                .await
                .unwrap();
            }
            Ok::<_, Error>(1u8)
        }
    };
    let started = Instant::now();
    let first = {
        let (idem, name, body) = (idem.clone(), name.clone(), body(true));
        tokio::spawn(async move { idem.call(name).key("k").lease(LEASE).run(body).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut duplicate = None;
    for _ in 0..100 {
        match other
            .call(name.clone())
            .key("k")
            .lease(LEASE)
            .run(body(false))
            .await
        {
            Err(Error::InProgress { .. }) => {}
            out => {
                duplicate = Some(out);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.await.unwrap();
    eprintln!(
        "dead connections: first attempt {first:?} after {:?}; duplicate {duplicate:?}; body ran {}",
        started.elapsed(),
        runs.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(
        !matches!(first, Err(Error::LeaseLost { .. })),
        "the completion outlived its lease: {first:?}"
    );
    assert_eq!(first.unwrap().into_inner(), 1);
    assert!(
        matches!(duplicate, Some(Ok(ref o)) if o.is_replayed()),
        "{duplicate:?}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    POSTGRES => [
        no_lease_lost_for_a_body_inside_its_lease_while_backends_are_killed,
        a_completion_retried_over_dead_connections_keeps_its_lease,
    ],
}
