//! The MySQL store against the real server (`IDEM_TEST_MYSQL_URL`): the claim under heavy
//! duplication and churn (InnoDB deadlocks retried, never surfaced), a connection killed
//! mid-call, the schema and its migrations, and typed errors for a server that cannot be used.

mod mysql_common;

use idem::store::mysql::{MysqlOptions, MysqlStore, SCHEMA_VERSION};
use idem::store::{Backend, Claim, ClaimOutcome, Complete, Status, Store};
use idem::testkit::{digest, fingerprint, unique, Counter};
use idem::{Error, Idem, StoreErrorKind};
use mysql_common::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn claim<'a>(
    name: &'a str,
    key: &'a idem::key::Digest,
    fp: &'a idem::key::Digest,
    lease: Duration,
) -> Claim<'a> {
    Claim {
        name,
        key,
        fingerprint: fp,
        lease,
        ttl: Duration::ZERO,
    }
}

/// 64 concurrent duplicates of one call: the body runs once, every caller gets its value, and
/// no lock conflict reaches a caller.
async fn sixty_four_concurrent_duplicates_run_once(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("dup64");
    let store = MysqlOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .max_connections(64)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    for round in 0..5 {
        let ns = unique("dup64");
        let counter = Counter::default();
        let start = Arc::new(tokio::sync::Barrier::new(64));
        let calls: Vec<_> = (0..64)
            .map(|_| {
                let (idem, ns, counter, start) =
                    (idem.clone(), ns.clone(), counter.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    idem.call(ns)
                        .key(&"one key")
                        .wait(Duration::from_secs(30))
                        .run(async move {
                            counter.hit();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, Error>(round)
                        })
                        .await
                })
            })
            .collect();
        for c in calls {
            let out = c.await.unwrap().expect("no duplicate sees an error");
            assert_eq!(out.into_inner(), round);
        }
        assert_eq!(counter.get(), 1, "round {round}: the body ran once");
    }
    drop_table(&admin, &table).await;
}

/// 64 tasks fight over one key for two seconds: whoever claims it holds it for a moment and
/// releases it (an `UPDATE` that ends the row; it was a `DELETE`, the shape of InnoDB's
/// duplicate-key deadlock, until releases kept the token), while the others retry their claims. Never two holders at once, never an error; the deadlocks InnoDB reports
/// meanwhile were all retried inside the store.
async fn churn_on_one_key_never_overlaps_nor_fails(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("churn");
    let store = MysqlOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .max_connections(64)
        .connect()
        .await
        .unwrap();
    let store = Arc::new(store);
    let deadlocks_before = global_status(&admin, "Innodb_deadlocks").await;
    let name = unique("churn");
    let key = digest(&name, &"k");
    let fp = fingerprint(&"k");
    let held = Arc::new(AtomicBool::new(false));
    let (claims, existing) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (store, name, held, claims, existing) = (
                store.clone(),
                name.clone(),
                held.clone(),
                claims.clone(),
                existing.clone(),
            );
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    let lease = Duration::from_secs(30);
                    match store.claim(claim(&name, &key, &fp, lease)).await {
                        Ok(ClaimOutcome::Claimed { token, .. }) => {
                            assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                            claims.fetch_add(1, Ordering::Relaxed);
                            if i % 2 == 0 {
                                tokio::task::yield_now().await;
                            }
                            held.store(false, Ordering::SeqCst);
                            assert!(store.release(&key, token).await.unwrap());
                        }
                        Ok(ClaimOutcome::Existing(r)) => {
                            assert_eq!(r.status, Status::InProgress);
                            existing.fetch_add(1, Ordering::Relaxed);
                            // A caller told "in progress" comes back a little later.
                            tokio::time::sleep(Duration::from_millis(1 + i as u64 % 4)).await;
                        }
                        Err(e) => panic!("a claim failed: {e}"),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let deadlocks = global_status(&admin, "Innodb_deadlocks").await - deadlocks_before;
    let claims = claims.load(Ordering::Relaxed);
    eprintln!(
        "churn: {claims} claims, {} duplicates answered, {deadlocks} InnoDB deadlocks retried",
        existing.load(Ordering::Relaxed)
    );
    assert!(claims >= 5, "the key changed hands: {claims}");
    drop_table(&admin, &table).await;
}

/// The textbook InnoDB deadlock: a transaction holds a freshly inserted row of the key, 16
/// claims queue behind its lock, and it rolls back; the waiters then race for the record. One
/// claims the key, the others find its claim; the deadlocks among them never surface.
async fn claims_queued_behind_a_rolled_back_insert_never_fail(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("rollback");
    let store = Arc::new(
        MysqlOptions::from_url(&url)
            .unwrap()
            .table(&table)
            .max_connections(32)
            .connect()
            .await
            .unwrap(),
    );
    let deadlocks_before = global_status(&admin, "Innodb_deadlocks").await;
    for round in 0..10 {
        let name = unique("rollback");
        let key = digest(&name, &round);
        let fp = fingerprint(&round);
        let mut tx = admin.begin().await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO `{table}` (`key`, name, fingerprint, token, status, created_at, expires_at) \
             VALUES (?, ?, ?, 1, 0, 0, 9000000000000)"
        ))
        .bind(&key.0[..])
        .bind(&name)
        .bind(&fp.0[..])
        .execute(&mut *tx)
        .await
        .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, name) = (store.clone(), name.clone());
                tokio::spawn(async move {
                    store
                        .claim(claim(&name, &key, &fp, Duration::from_secs(30)))
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.rollback().await.unwrap();
        let mut claimed = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(ClaimOutcome::Claimed { .. }) => claimed += 1,
                Ok(ClaimOutcome::Existing(r)) => assert_eq!(r.status, Status::InProgress),
                Err(e) => panic!("round {round}: a claim failed: {e}"),
            }
        }
        assert_eq!(claimed, 1, "round {round}");
    }
    let deadlocks = global_status(&admin, "Innodb_deadlocks").await - deadlocks_before;
    eprintln!("rollback: {deadlocks} InnoDB deadlocks retried over 10 rounds of 16 claims");
    drop_table(&admin, &table).await;
}

/// A lapsed claim is taken over by exactly one of 64 concurrent claims, with a larger token;
/// the old holder's completion is then refused.
async fn one_of_64_takes_a_lapsed_claim_over(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("takeover");
    let store = Arc::new(store(&url, &table).await);
    let name = unique("takeover");
    let key = digest(&name, &"k");
    let fp = fingerprint(&"k");
    let old = match store
        .claim(claim(&name, &key, &fp, Duration::from_millis(50)))
        .await
        .unwrap()
    {
        ClaimOutcome::Claimed { token, .. } => token,
        other => panic!("{other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(120)).await;
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, name) = (store.clone(), name.clone());
            tokio::spawn(async move {
                store
                    .claim(claim(&name, &key, &fp, Duration::from_secs(30)))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in tasks {
        if let ClaimOutcome::Claimed { token, .. } = t.await.unwrap() {
            tokens.push(token);
        }
    }
    assert_eq!(tokens.len(), 1, "exactly one takeover");
    assert!(tokens[0] > old);
    let done = Complete {
        key: &key,
        token: old,
        value: b"late",
        ttl: Duration::from_secs(60),
        tombstone: std::time::Duration::ZERO,
    };
    assert!(
        !store.complete(done).await.unwrap(),
        "the old holder is fenced"
    );
    drop_table(&admin, &table).await;
}

/// The store's connection is killed (`KILL CONNECTION`) while the body runs: the completion
/// goes through on a fresh connection, and the result replays. The body ran once.
async fn a_connection_killed_mid_call_completes_on_another(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("kill");
    let store = MysqlOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let pool = store.pool().clone();
    let idem = Idem::from_store(store);
    let ns = unique("kill");
    let counter = Counter::default();
    for round in 0..2 {
        let (pool, admin, counter) = (pool.clone(), admin.clone(), counter.clone());
        let out = idem
            .call(ns.clone())
            .key(&"k")
            .run(async move {
                counter.hit();
                // The pool's only connection: the one the claim ran on, and the completion
                // will run on.
                let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                sqlx::query(&format!("KILL CONNECTION {id}"))
                    .execute(&admin)
                    .await
                    .unwrap();
                Ok::<_, Error>(7u32)
            })
            .await
            .expect("the call completes despite the killed connection");
        assert_eq!(out.is_replayed(), round == 1);
        assert_eq!(out.into_inner(), 7);
    }
    assert_eq!(counter.get(), 1);
    drop_table(&admin, &table).await;
}

/// Opening creates the table and its version table at the current version; eight processes'
/// worth of concurrent opens of a fresh table all succeed (the named lock serializes them).
async fn schema_is_created_once_under_concurrent_opens(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("schema");
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let (url, table) = (url.clone(), table.clone());
            tokio::spawn(async move { store(&url, &table).await })
        })
        .collect();
    for o in opens {
        let s = o.await.unwrap();
        assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    }
    let rows: Vec<(i32, String)> = sqlx::query_as(&format!(
        "SELECT version, description FROM `{table}_migrations` ORDER BY version"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(
        rows.len(),
        SCHEMA_VERSION as usize,
        "each migration recorded once: {rows:?}"
    );
    let migrations = MysqlStore::migrations(&table).unwrap();
    assert_eq!(migrations.len(), SCHEMA_VERSION as usize);
    assert!(migrations[0].sql.contains("BINARY(32)"));
    drop_table(&admin, &table).await;
}

/// Without `migrate_on_open`, a missing schema is an error that says what to run; a schema
/// newer than the code is refused; `migrate` then creates what was missing.
async fn schema_checks_refuse_missing_and_newer(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("check");
    let opts = || MysqlOptions::from_url(&url).unwrap().table(&table);
    let err = opts().migrate_on_open(false).connect().await.unwrap_err();
    assert_eq!(
        err.store_error_kind(),
        Some(StoreErrorKind::SchemaMissing),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("no idem table {table}"))
            && err.to_string().contains("migrate"),
        "{err}"
    );
    let first = opts().migrate().await.unwrap();
    assert_eq!(
        (first.backend, first.from, first.to),
        (Backend::Mysql, 0, SCHEMA_VERSION)
    );
    assert!(first.changed());
    let again = opts().migrate().await.unwrap();
    assert_eq!((again.from, again.to), (SCHEMA_VERSION, SCHEMA_VERSION));
    assert_eq!(again.location, format!("table {table}"));
    opts().migrate_on_open(false).connect().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO `{table}_migrations` (version, description) VALUES (?, 'from the future')"
    ))
    .bind(SCHEMA_VERSION + 1)
    .execute(&admin)
    .await
    .unwrap();
    let err = opts().connect().await.unwrap_err();
    assert_eq!(
        err.store_error_kind(),
        Some(StoreErrorKind::SchemaNewer),
        "{err}"
    );
    assert!(err.to_string().contains("newer"), "{err}");
    drop_table(&admin, &table).await;
}

/// The caller's own pool, and the stored columns as the docs describe them.
async fn from_pool_and_stored_columns(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("pool");
    let store = MysqlStore::from_pool(admin.clone(), MysqlOptions::new().table(&table))
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let ns = unique("pool");
    idem.call(ns.clone())
        .key(&1)
        .run(async { Ok::<_, Error>("stored".to_string()) })
        .await
        .unwrap();
    let (key_len, fp_len, status, token, created, expires, now): (
        i64,
        i64,
        i8,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(&format!(
        "SELECT LENGTH(`key`), LENGTH(fingerprint), status, token, created_at, expires_at, \
             CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) FROM `{table}` WHERE name = ?"
    ))
    .bind(&ns)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!((key_len, fp_len, status), (32, 32, 1));
    // Times are the server's milliseconds; the first token of a key is its claim time in µs.
    assert!(
        (now - created).abs() < 10_000,
        "created_at {created} vs now {now}"
    );
    assert!(expires - created >= 24 * 3600 * 1000 - 10_000);
    assert!(token >= created * 1000 && token < (created + 10_000) * 1000);
    drop_table(&admin, &table).await;
}

/// What cannot be used says so with a typed error, never a panic or a hang.
async fn unusable_servers_are_typed_errors(url: String) {
    // Nothing listens on port 1.
    let err = Idem::mysql("mysql://root@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Store(s) if s.op == "open"), "{err}");
    // A user the server does not know.
    let bad_user = url.replacen("mysql://root@", "mysql://idem_no_such_user:wrong@", 1);
    let err = Idem::mysql(&bad_user).await.unwrap_err();
    assert!(
        matches!(&err, Error::Store(s) if s.op == "open" && err.to_string().contains("Access denied")),
        "{err}"
    );
    // A database that does not exist.
    let err = Idem::mysql("mysql://root@127.0.0.1:3306/idem_no_such_database")
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Store(s) if s.op == "open"), "{err}");
    for bad in [
        "postgres://root@127.0.0.1/test",
        "mysql://root@127.0.0.1:notaport/test",
    ] {
        let err = Idem::mysql(bad).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
    }
    let err = MysqlOptions::from_url(&url)
        .unwrap()
        .table("x`; DROP TABLE y")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

idem_integration::server_tests! {
    MYSQL => [
        sixty_four_concurrent_duplicates_run_once,
        churn_on_one_key_never_overlaps_nor_fails,
        claims_queued_behind_a_rolled_back_insert_never_fail,
        one_of_64_takes_a_lapsed_claim_over,
        a_connection_killed_mid_call_completes_on_another,
        schema_is_created_once_under_concurrent_opens,
        schema_checks_refuse_missing_and_newer,
        from_pool_and_stored_columns,
        unusable_servers_are_typed_errors,
    ],
}
