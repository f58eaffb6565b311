//! Faults: the store's backends killed with `pg_terminate_backend` before, during and while
//! blocked in a call.

mod pg_common;

use idem::store::postgres::{PostgresOptions, PostgresStore};
use idem::testkit::{unique, Counter};
use idem::{Error, Idem, Outcome, Store};
use pg_common::*;
use std::time::Duration;

async fn store(url: &str, table: &str, app: &str) -> PostgresStore {
    PostgresOptions::from_url(url)
        .unwrap()
        .table(table)
        .application_name(app)
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// Terminates every backend of `app`; returns how many.
async fn terminate(admin: &sqlx::PgPool, app: &str, only_waiting: bool) -> i64 {
    let sql = if only_waiting {
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = $1 AND wait_event_type = 'Lock'"
    } else {
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1"
    };
    sqlx::query_scalar(sql)
        .bind(app)
        .fetch_one(admin)
        .await
        .unwrap()
}

/// Idle connections whose backends were killed: the next call fails with a clear
/// `Error::Store` and does not run its body; the pool replaces the dead connections and the
/// same key then runs (it was never claimed).
async fn killed_idle_backends_fail_the_next_call_cleanly(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("kill_idle"), unique_table("idem_fault"));
    let store = store(&url, &table, &app).await;
    let idem = Idem::from_store(store.clone());
    let name = unique("kill-idle");
    let c = Counter::default();
    let call = |k: u32| {
        let c = c.clone();
        idem.call(name.clone())
            .key(&k)
            .run(async move { Ok::<_, Error>(c.hit()) })
    };
    // Warm the pool: several connections open.
    let warm: Vec<_> = (0..8).map(call).collect();
    for w in warm {
        w.await.unwrap();
    }
    assert_eq!(c.get(), 8);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(terminate(&admin, &app, false).await >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let failed = call(100).await;
    match &failed {
        Err(Error::Store(e)) => {
            assert_eq!((e.backend.name(), e.op), ("postgres", "claim"));
            let text = e.to_string();
            assert!(
                text.contains("idem postgres store failed at claim"),
                "{text}"
            );
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
    assert_eq!(c.get(), 8, "the failed call's body did not run");
    // The pool drops dead connections as they fail: a bounded number of failures, then calls
    // succeed; the key of the failed call is free (its claim never reached the server).
    let mut attempts = 0;
    let out = loop {
        attempts += 1;
        match call(100).await {
            Ok(out) => break out,
            Err(Error::Store(_)) if attempts < 10 => continue,
            Err(e) => panic!("after {attempts} attempts: {e}"),
        }
    };
    assert_eq!(out, Outcome::Fresh(9));
    for k in 0..8 {
        assert!(call(k).await.unwrap().is_replayed());
    }
    assert_eq!(c.get(), 9);
    drop_table(&admin, &table).await;
}

/// Backends killed while bodies run: each completion fails on its dead connection and is
/// retried on a fresh one (recognising a completion of its own that landed), so every call
/// returns its value, each body ran once, and every key replays.
async fn killed_backends_mid_body_complete_once(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("kill_mid"), unique_table("idem_fault"));
    let store = store(&url, &table, &app).await;
    let idem = Idem::from_store(store.clone());
    let name = unique("kill-mid");
    let counters: Vec<Counter> = (0..16).map(|_| Counter::default()).collect();
    let calls: Vec<_> = (0..16)
        .map(|k| {
            let (idem, name, c) = (idem.clone(), name.clone(), counters[k].clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key(&k)
                    .lease(Duration::from_secs(3))
                    .run(async move {
                        c.hit();
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        Ok::<_, Error>(k)
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(terminate(&admin, &app, false).await >= 1);
    for (k, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), Outcome::Fresh(k));
    }
    for (k, c) in counters.iter().enumerate() {
        let again = idem
            .call(name.clone())
            .key(&k)
            .run(async { Ok::<_, Error>(usize::MAX) })
            .await
            .unwrap();
        assert_eq!(again, Outcome::Replayed(k));
        assert_eq!(c.get(), 1, "key {k} ran once");
    }
    drop_table(&admin, &table).await;
}

/// A claim killed while it waits on a row lock fails with `Error::Store`; it never committed,
/// so the key is not stuck: once the lock is gone the next call runs at once.
async fn killed_while_blocked_claim_leaves_the_key_free(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("kill_blk"), unique_table("idem_fault"));
    let store = store(&url, &table, &app).await;
    let idem = Idem::from_store(store.clone());
    let name = unique("kill-blocked");
    let c = Counter::default();
    let call = || {
        let c = c.clone();
        idem.call(name.clone())
            .key("k")
            .lease(Duration::from_secs(1))
            .ttl(Duration::from_millis(1))
            .run(async move { Ok::<_, Error>(c.hit()) })
    };
    // A record that is expired at once, then locked by another session.
    assert_eq!(call().await.unwrap(), Outcome::Fresh(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut blocker = admin.begin().await.unwrap();
    let key = idem::testkit::digest(&name, "k");
    sqlx::query(&format!(
        "SELECT 1 FROM \"{table}\" WHERE key = $1 FOR UPDATE"
    ))
    .bind(&key.0[..])
    .execute(&mut *blocker)
    .await
    .unwrap();
    let blocked = tokio::spawn(call());
    let mut killed = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        killed = terminate(&admin, &app, true).await;
        if killed > 0 {
            break;
        }
    }
    assert_eq!(killed, 1, "the claim was blocked on the lock");
    match blocked.await.unwrap() {
        Err(Error::Store(e)) => assert_eq!(e.op, "claim"),
        other => panic!("expected Error::Store, got {other:?}"),
    }
    blocker.rollback().await.unwrap();
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "no live claim left"
    );
    let mut attempts = 0;
    let out = loop {
        attempts += 1;
        match call().await {
            Ok(out) => break out,
            Err(Error::Store(_)) if attempts < 10 => continue,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(out, Outcome::Fresh(2));
    assert_eq!(c.get(), 2);
    drop_table(&admin, &table).await;
}

/// The control for the test above: with completion retries off, the same kill surfaces as
/// `Error::Store` at `complete`, and the key is in progress for no longer than its lease
/// (then a retry runs: this is the at-least-once gap the retries close).
async fn without_completion_retries_the_key_lapses_after_its_lease(url: String) {
    let admin = admin(&url).await;
    let (table, app) = (unique_table("kill_noretry"), unique_table("idem_fault"));
    let store = PostgresOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .application_name(&app)
        .complete_retry(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store.clone());
    let name = unique("kill-noretry");
    // Longer than the body by far: no renewal runs (and meets the dead connection) first.
    let lease = Duration::from_millis(1500);
    let call = |v: u8, hold: Duration| {
        idem.call(name.clone())
            .key("k")
            .lease(lease)
            .run(async move {
                tokio::time::sleep(hold).await;
                Ok::<_, Error>(v)
            })
    };
    let running = tokio::spawn(call(1, Duration::from_millis(300)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(terminate(&admin, &app, false).await >= 1);
    match running.await.unwrap() {
        Err(Error::Store(e)) => assert_eq!(e.op, "complete"),
        other => panic!("expected Error::Store at complete, got {other:?}"),
    }
    let start = std::time::Instant::now();
    let out = loop {
        match call(2, Duration::ZERO).await {
            Ok(out) => break out,
            Err(Error::InProgress { .. }) | Err(Error::Store(_)) => {
                assert!(
                    start.elapsed() < lease + Duration::from_secs(2),
                    "stuck beyond its lease"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(out, Outcome::Fresh(2));
    assert!(start.elapsed() < lease + Duration::from_secs(2));
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    POSTGRES => [
        killed_idle_backends_fail_the_next_call_cleanly,
        killed_backends_mid_body_complete_once,
        killed_while_blocked_claim_leaves_the_key_free,
        without_completion_retries_the_key_lapses_after_its_lease,
    ],
}
