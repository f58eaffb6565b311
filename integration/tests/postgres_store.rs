//! The PostgreSQL store beyond the conformance suite: round trips per step, bad input, the
//! schema and its migrations, the transactional mode, the reaper, notifications.

mod pg_common;

use idem::__private::transaction_needs_the_postgres_or_mysql_feature as tx_mode;
use idem::store::postgres::{PostgresOptions, PostgresStore, SCHEMA_VERSION};
use idem::store::{Claim, ClaimOutcome};
use idem::testkit::{digest, fingerprint, unique, Counter};
use idem::{Error, Idem, Outcome, Store, StoreErrorKind};
use pg_common::*;
use sqlx::Row;
use std::time::Duration;

type R<T> = Result<T, Error>;

fn opts(table: &str) -> PostgresOptions {
    PostgresOptions::new().table(table)
}

fn opts_at(url: &str, table: &str) -> PostgresOptions {
    PostgresOptions::from_url(url).unwrap().table(table)
}

/// A fresh call costs two round trips (claim, complete) and a replay one (claim), counted on
/// the wire by a proxy that parses the protocol: a round trip is each `Sync`/`Query` the client
/// sends before it waits for the server. Counted after the connection's statement cache is
/// warm (the first use of a statement on a connection also prepares it: one more round trip).
async fn fresh_call_is_two_round_trips_and_replay_one(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("rt");
    let proxy = Proxy::start(server_addr(&url)).await;
    let store = opts_at(&url_via(&url, proxy.addr), &table)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store.clone());
    let name = unique("rt");
    let call = |k: u32| {
        idem.call(name.clone())
            .key(&k)
            .run(async move { Ok::<_, Error>(k * 2) })
    };
    for k in 0..3 {
        call(k).await.unwrap();
        call(k).await.unwrap();
    }
    // Let the pool's background release of the last connection finish before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = proxy.seen();
    assert_eq!(call(100).await.unwrap(), Outcome::Fresh(200));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = proxy.seen() - before;

    let before = proxy.seen();
    assert_eq!(call(100).await.unwrap(), Outcome::Replayed(200));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let replay = proxy.seen() - before;

    eprintln!("round trips: fresh {fresh:?}, replay {replay:?}");
    assert_eq!(
        (fresh.statements, fresh.prepares, fresh.simple),
        (2, 0, 0),
        "{fresh:?}"
    );
    assert_eq!(
        (replay.statements, replay.prepares, replay.simple),
        (1, 0, 0),
        "{replay:?}"
    );
    // sqlx's pool pings a connection when it goes back to the pool, in a background task after
    // the caller has its answer; at most one per statement, never on the caller's path.
    assert!(
        fresh.pings <= 2 && replay.pings <= 1,
        "{fresh:?} {replay:?}"
    );

    // The transactional mode: BEGIN and COMMIT are the caller's; idem adds claim + complete.
    // Its completion is a statement of its own (the row lock is its lease), so one call first
    // warms the cache.
    let mut tx = store.pool().begin().await.unwrap();
    idem.call(name.clone())
        .key(&6u32)
        .in_transaction(&mut tx, async |_| Ok::<_, Error>(1u8))
        .await
        .unwrap();
    let before = proxy.seen();
    let out = idem
        .call(name.clone())
        .key(&7u32)
        .in_transaction(&mut tx, async |_| Ok::<_, Error>(1u8))
        .await
        .unwrap();
    let txd = proxy.seen() - before;
    tx.commit().await.unwrap();
    assert_eq!(out, Outcome::Fresh(1));
    eprintln!("transactional fresh call inside BEGIN/COMMIT: {txd:?}");
    assert_eq!(txd.statements + txd.prepares, 2, "{txd:?}");
    drop_table(&admin, &table).await;
}

async fn bad_table_names_are_config_errors() {
    // No server needed: the name is refused before anything connects.
    for bad in [
        "idem\"; DROP TABLE x; --",
        "a;b",
        "it's",
        "a b",
        "1x",
        "a.b.c",
        "",
    ] {
        let r = opts_at("postgres://u@127.0.0.1:1/db", bad).connect().await;
        assert!(matches!(r, Err(Error::Config(_))), "{bad:?}: {r:?}");
        assert!(matches!(
            PostgresStore::migrations(bad),
            Err(Error::Config(_))
        ));
    }
    let m = PostgresStore::migrations("app.idem_keys").unwrap();
    assert_eq!(m.len() as i32, SCHEMA_VERSION);
    assert!(m[0].sql.contains("\"app\".\"idem_keys\""), "{}", m[0].sql);
}

async fn bad_urls_are_config_errors() {
    for bad in [
        "not a url",
        "postgres://user@127.0.0.1:notaport/db",
        "mysql://127.0.0.1/db",
    ] {
        let r = PostgresStore::connect(bad).await;
        match r {
            Err(Error::Config(m)) => assert!(m.contains("URL"), "{m}"),
            other => panic!("{bad:?}: expected Error::Config, got {other:?}"),
        }
        assert!(matches!(Idem::postgres(bad).await, Err(Error::Config(_))));
    }
}

async fn server_down_at_open_is_a_store_error() {
    let started = std::time::Instant::now();
    let r = PostgresOptions::from_url("postgres://postgres@127.0.0.1:1/test")
        .unwrap()
        .acquire_timeout(Duration::from_secs(2))
        .connect()
        .await;
    match r {
        Err(Error::Store(e)) => {
            assert_eq!((e.backend.name(), e.op), ("postgres", "open"));
            let text = e.to_string();
            assert!(text.to_lowercase().contains("refused"), "{text}");
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
}

async fn server_down_at_call_time_is_a_store_error(url: String) {
    let table = unique_table("down");
    let proxy = Proxy::start(server_addr(&url)).await;
    let store = opts_at(&url_via(&url, proxy.addr), &table)
        .acquire_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store.clone());
    let name = unique("down");
    let c = Counter::default();
    let call = |k: &'static str| {
        let c = c.clone();
        idem.call(name.clone())
            .key(k)
            .run(async move { Ok::<_, Error>(c.hit()) })
    };
    call("a").await.unwrap();
    proxy.stop(); // established connections reset, new ones refused
    for k in ["a", "b"] {
        match call(k).await {
            Err(Error::Store(e)) => assert_eq!(e.backend, "postgres"),
            other => panic!("expected Error::Store, got {other:?}"),
        }
    }
    assert_eq!(c.get(), 1, "no body runs without a claim");
    drop_table(&admin(&url).await, &table).await;
}

/// A role without the CREATE privilege cannot create the schema: the error names the
/// privilege. Once a privileged role created it and granted the rows, the same role opens.
async fn missing_create_privilege_is_named(url: String) {
    let admin = admin(&url).await;
    let role = unique_table("idem_noddl");
    let table = unique_table("priv");
    sqlx::query(&format!("CREATE ROLE \"{role}\" LOGIN"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(&format!("REVOKE CREATE ON SCHEMA public FROM \"{role}\""))
        .execute(&admin)
        .await
        .unwrap();
    let role_url = {
        let (_, rest) = url.rsplit_once('@').unwrap();
        format!("postgres://{role}@{rest}")
    };
    let r = opts_at(&role_url, &table).connect().await;
    let text = match r {
        Err(Error::Store(e)) => e.to_string(),
        other => panic!("expected Error::Store, got {other:?}"),
    };
    assert!(text.contains("CREATE privilege"), "{text}");
    assert!(text.contains(&role), "{text}");
    assert!(text.contains("permission denied"), "{text}");

    // A privileged role migrates; the unprivileged one then opens and works.
    let admin_store = opts_at(&url, &table).connect().await.unwrap();
    for t in [table.clone(), format!("{table}_migrations")] {
        sqlx::query(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON \"{t}\" TO \"{role}\""
        ))
        .execute(&admin)
        .await
        .unwrap();
    }
    let store = opts_at(&role_url, &table)
        .migrate_on_open(false)
        .connect()
        .await
        .unwrap();
    let out = Idem::from_store(store.clone())
        .call(unique("priv"))
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh(1));
    drop(store);
    drop(admin_store);
    drop_table(&admin, &table).await;
    let _ = sqlx::query(&format!("DROP ROLE \"{role}\""))
        .execute(&admin)
        .await;
}

async fn schema_newer_than_the_code_is_refused(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("newer");
    opts_at(&url, &table).connect().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO \"{table}_migrations\" (version, description) VALUES (99, 'from the future')"
    ))
    .execute(&admin)
    .await
    .unwrap();
    match opts_at(&url, &table).connect().await {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind, StoreErrorKind::SchemaNewer);
            let m = e.to_string();
            assert!(m.contains("99") && m.contains("newer"), "{m}");
        }
        other => panic!("expected a SchemaNewer store error, got {other:?}"),
    }
    drop_table(&admin, &table).await;
}

/// A record whose status this version does not know (written by a newer schema version) is
/// refused clearly, not guessed at.
async fn row_from_a_newer_schema_version_is_refused(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("rowver");
    let store = opts_at(&url, &table).connect().await.unwrap();
    let name = unique("rowver");
    let key = digest(&name, "k");
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" (key, name, fingerprint, token, status, value, created_at, expires_at) \
         VALUES ($1, $2, $3, 1, 7, NULL, 0, 9000000000000)"
    ))
    .bind(&key.0[..])
    .bind(&name)
    .bind(&fingerprint("k").0[..])
    .execute(&admin)
    .await
    .unwrap();
    let r = Idem::from_store(store.clone())
        .call(name)
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await;
    match r {
        Err(Error::Store(e)) => {
            let t = e.to_string();
            assert!(
                t.contains("status 7") && t.contains("newer schema version"),
                "{t}"
            );
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
    assert!(matches!(store.get(&key).await, Err(Error::Store(_))));
    drop_table(&admin, &table).await;
}

/// A version-1 schema is upgraded on open; eight processes' worth of concurrent opens of a new
/// table apply each migration once (the advisory lock serializes them).
async fn migrations_upgrade_and_concurrent_opens_do_not_race(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("mig");
    assert_eq!(
        PostgresStore::migrate_to(&admin, &table, 1).await.unwrap(),
        0
    );
    let index = |t: String, which: &'static str| {
        let admin = admin.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2",
            )
            .bind(t.clone())
            .bind(format!("{t}_{which}_idx"))
            .fetch_one(&admin)
            .await
            .unwrap()
        }
    };
    assert_eq!(index(table.clone(), "expires").await, 0);
    let store = opts_at(&url, &table).connect().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    // Version 2 added the expiry index (the operators' pages read it); version 4 added
    // `keep_until`'s, which the purge reads.
    assert_eq!(index(table.clone(), "expires").await, 1);
    assert_eq!(index(table.clone(), "keep").await, 1);
    assert_eq!(
        store.migrate().await.unwrap().from,
        SCHEMA_VERSION,
        "migrate is idempotent"
    );

    // A table nobody created yet, opened eight times at once.
    let fresh = unique_table("migrace");
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let (url, fresh) = (url.clone(), fresh.clone());
            tokio::spawn(async move { opts_at(&url, &fresh).connect().await })
        })
        .collect();
    for o in opens {
        o.await.unwrap().expect("every concurrent open succeeds");
    }
    let versions: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM \"{fresh}_migrations\" ORDER BY version"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());

    // Without migrate_on_open, a missing schema is a clear error, not a DDL attempt.
    let absent = unique_table("nomig");
    match opts_at(&url, &absent)
        .migrate_on_open(false)
        .connect()
        .await
    {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind, StoreErrorKind::SchemaMissing);
            assert!(e.to_string().contains("migrate"), "{e}");
        }
        other => panic!("expected a SchemaMissing store error, got {other:?}"),
    }
    for t in [table, fresh] {
        drop_table(&admin, &t).await;
    }
}

/// A store built on the caller's pool shares the keys of one opened from a URL.
async fn from_pool_sees_the_same_keys(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("pool");
    let a = Idem::from_store(opts_at(&url, &table).connect().await.unwrap());
    let b = Idem::from_store(
        PostgresStore::from_pool(admin.clone(), opts(&table))
            .await
            .unwrap(),
    );
    let name = unique("pool");
    let first = a
        .call(name.clone())
        .key("k")
        .run(async { Ok::<_, Error>(1u8) });
    assert_eq!(first.await.unwrap(), Outcome::Fresh(1));
    let again = b.call(name).key("k").run(async { Ok::<_, Error>(2u8) });
    assert_eq!(again.await.unwrap(), Outcome::Replayed(1));
    drop_table(&admin, &table).await;
}

fn insert_row<'c>(
    conn: &'c mut sqlx::PgConnection,
    sql: String,
    k: &'static str,
) -> idem::store::BoxFuture<'c, R<String>> {
    Box::pin(async move {
        sqlx::query(&sql)
            .bind(k)
            .execute(&mut *conn)
            .await
            .map_err(|e| Error::store("postgres", "body", e))?;
        assert_eq!(idem::current_key().map(|s| s.len()), Some(64));
        Ok(format!("done {k}"))
    })
}

/// Every future of the public API is `Send`, so it can be `tokio::spawn`ed.
async fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let url = "postgres://u@127.0.0.1:1/db";
    send(&PostgresStore::connect(url));
    send(&PostgresOptions::from_url(url).unwrap().connect());
    send(&Idem::postgres(url));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy(url)
        .unwrap_or_else(|_| unreachable!());
    send(&PostgresStore::from_pool(
        pool.clone(),
        PostgresOptions::new(),
    ));
    send(&PostgresStore::migrate_to(&pool, "t", 1));
    async fn in_tx(store: PostgresStore, mut tx: sqlx::Transaction<'static, sqlx::Postgres>) {
        let idem = Idem::from_store(store);
        let _ = idem
            .call("n")
            .key("k")
            .in_transaction(&mut tx, async |_| Ok::<_, Error>(1u8))
            .await;
        let policy = idem::ReleaseErrors;
        if let tx_mode::Step::Run(c) =
            tx_mode::claim::<u8, Error, _>(idem.call("n").key("k"), &mut tx, &policy).await
        {
            let result = tx_mode::scope(&c, async { Ok::<_, Error>(1u8) }).await;
            let _ = tx_mode::finish(c, &mut tx, &policy, result).await;
        }
        tx.commit().await.unwrap();
    }
    fn spawnable<F: std::future::Future + Send + 'static>(
        _: fn(PostgresStore, sqlx::Transaction<'static, sqlx::Postgres>) -> F,
    ) {
    }
    spawnable(in_tx);
}

async fn side_table(admin: &sqlx::PgPool) -> String {
    let side = unique_table("side");
    sqlx::query(&format!("CREATE TABLE \"{side}\" (k text NOT NULL)"))
        .execute(admin)
        .await
        .unwrap();
    side
}

async fn side_rows(admin: &sqlx::PgPool, side: &str, k: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{side}\" WHERE k = $1"))
        .bind(k)
        .fetch_one(admin)
        .await
        .unwrap()
}

/// The transactional mode: the handler's writes and the record commit or roll back together.
async fn transactional_mode_commits_and_rolls_back_with_the_handler(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("tx");
    let store = opts_at(&url, &table).connect().await.unwrap();
    let idem = Idem::from_store(store.clone());
    let side = side_table(&admin).await;
    let name = unique("tx");
    let sql = format!("INSERT INTO \"{side}\" (k) VALUES ($1)");

    // Rolled back: neither the row nor the claim remains.
    let mut tx = store.pool().begin().await.unwrap();
    let out = idem
        .call(name.clone())
        .key("a")
        .in_transaction(&mut tx, async |conn| {
            insert_row(conn, sql.clone(), "a").await
        })
        .await
        .unwrap();
    assert_eq!(out, Outcome::Fresh("done a".to_string()));
    tx.rollback().await.unwrap();
    assert_eq!(side_rows(&admin, &side, "a").await, 0);
    assert_eq!(store.get(&digest(&name, "a")).await.unwrap(), None);

    // Committed: both; a repeat replays without writing.
    for expect_fresh in [true, false, false] {
        let mut tx = store.pool().begin().await.unwrap();
        let out = idem
            .call(name.clone())
            .key("a")
            .in_transaction(&mut tx, async |conn| {
                insert_row(conn, sql.clone(), "a").await
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(out.is_replayed(), !expect_fresh);
        assert_eq!(out.into_inner(), "done a");
    }
    assert_eq!(side_rows(&admin, &side, "a").await, 1);
    // An ordinary call with the same key replays the transactional result.
    let plain = idem
        .call(name.clone())
        .key("a")
        .run(async { Ok::<_, Error>("ordinary".to_string()) })
        .await
        .unwrap();
    assert_eq!(plain, Outcome::Replayed("done a".to_string()));

    // A body error releases the key inside the transaction, even if the caller commits.
    let mut tx = store.pool().begin().await.unwrap();
    let failed = idem
        .call(name.clone())
        .key("b")
        .in_transaction(&mut tx, async |_| {
            Err::<u8, _>(Error::Config("declined".into()))
        })
        .await;
    assert!(matches!(failed, Err(Error::Config(_))));
    tx.commit().await.unwrap();
    assert_eq!(store.get(&digest(&name, "b")).await.unwrap(), None);

    // The two-phase form, as generated code uses it.
    let policy = idem::ReleaseErrors;
    let mut tx = store.pool().begin().await.unwrap();
    let step =
        tx_mode::claim::<u32, Error, _>(idem.call(name.clone()).key("c"), &mut tx, &policy).await;
    let tx_mode::Step::Run(claim) = step else {
        panic!("a new key runs")
    };
    let result: Result<u32, Error> = tx_mode::scope(&claim, async { Ok(5) }).await;
    let v = tx_mode::finish(claim, &mut tx, &policy, result)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(v, 5);
    let mut tx = store.pool().begin().await.unwrap();
    match tx_mode::claim::<u32, Error, _>(idem.call(name.clone()).key("c"), &mut tx, &policy).await
    {
        tx_mode::Step::Done(replayed) => assert_eq!(replayed.unwrap(), 5),
        tx_mode::Step::Run(_) => panic!("a committed key replays"),
    }
    tx.rollback().await.unwrap();

    // Outside a transaction: refused.
    let mut conn = store.pool().acquire().await.unwrap();
    let r = idem
        .call(name)
        .key("d")
        .in_transaction(&mut conn, async |_| Ok::<_, Error>(1u8))
        .await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    drop(conn);
    drop_table(&admin, &table).await;
    drop_table(&admin, &side).await;
}

/// In the transactional mode a concurrent duplicate waits on the first transaction's row lock:
/// it replays when that transaction commits and runs when it rolls back. It never sees
/// `InProgress`.
async fn transactional_duplicate_waits_for_the_first_transaction(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("txdup");
    let store = opts_at(&url, &table).connect().await.unwrap();
    let name = unique("txdup");
    for commit in [true, false] {
        let key = format!("k-{commit}");
        let mut tx1 = store.pool().begin().await.unwrap();
        let first = Idem::from_store(store.clone())
            .call(name.clone())
            .key(&key)
            .in_transaction(&mut tx1, async |_| Ok::<_, Error>(1u8))
            .await
            .unwrap();
        assert_eq!(first, Outcome::Fresh(1));
        let dup = {
            let (store, name, key) = (store.clone(), name.clone(), key.clone());
            tokio::spawn(async move {
                let mut tx2 = store.pool().begin().await.unwrap();
                let out = Idem::from_store(store.clone())
                    .call(name)
                    .key(&key)
                    .in_transaction(&mut tx2, async |_| Ok::<_, Error>(2u8))
                    .await;
                tx2.commit().await.unwrap();
                out
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!dup.is_finished(), "the duplicate waits on the row lock");
        // While it waits, the blocked claim is visible as a lock wait on the server.
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&admin)
        .await
        .unwrap();
        assert!(waiting >= 1);
        if commit {
            tx1.commit().await.unwrap();
            assert_eq!(dup.await.unwrap().unwrap(), Outcome::Replayed(1));
        } else {
            tx1.rollback().await.unwrap();
            assert_eq!(dup.await.unwrap().unwrap(), Outcome::Fresh(2));
        }
    }
    drop_table(&admin, &table).await;
}

/// `purge_expired` deletes in bounded batches, on the expiry index, and leaves live rows; a
/// batch with nothing (or less than a batch) to delete reads no live row.
async fn purge_is_bounded_and_drains(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("purge");
    let store = opts_at(&url, &table).connect().await.unwrap();
    // 5000 expired rows and 20 000 live ones, written directly: enough live rows that the
    // planner prefers the expiry index, as it does on a real table.
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" (key, name, fingerprint, token, status, value, created_at, expires_at, \
                                  keep_until) \
         SELECT sha256(i::text::bytea), 'purge', sha256(i::text::bytea), i, 1, NULL, 0, e, e \
         FROM generate_series(1, 25000) AS i, \
              LATERAL (SELECT CASE WHEN i <= 5000 THEN 1 ELSE 9000000000000000 END AS e) AS x"
    ))
    .execute(&admin)
    .await
    .unwrap();
    assert_eq!(store.purge_expired(1000).await.unwrap(), 1000);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 1000);
    let idem = Idem::from_store(store.clone());
    assert_eq!(idem.purge_expired(700).await.unwrap(), 3000);
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{table}\""))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(left, 20_000);
    // Statistics of a drained table, as a reaper tick on a clean table meets them.
    sqlx::query(&format!("ANALYZE \"{table}\""))
        .execute(&admin)
        .await
        .unwrap();
    // The store's own batch statement, run on the drained table. Every scan of the expiry
    // index must be bounded by the clock (an `Index Cond`): a clock the planner cannot use as
    // a bound (it once sat behind a CTE) only filters, and when fewer than a batch of rows
    // have expired such a scan walks every live row (1.6 s at 2 M rows).
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {}",
        store.statement_text("purge").unwrap()
    ))
    .bind(1000i64)
    .fetch_all(&admin)
    .await
    .unwrap();
    let index = format!("Index Scan using {table}_keep_idx");
    let scans: Vec<usize> = (0..plan.len())
        .filter(|&i| plan[i].contains(&index))
        .collect();
    assert!(!scans.is_empty(), "{plan:#?}");
    for i in scans {
        let next = plan.get(i + 1).map(|l| l.trim_start()).unwrap_or_default();
        assert!(
            next.starts_with("Index Cond: (keep_until <"),
            "an unbounded scan of the expiry index: {plan:#?}"
        );
    }
    // And it read no live row.
    let rows_read = |l: &String| -> u64 {
        let Some(at) = l.find("actual rows=") else {
            return 0;
        };
        let n = &l[at + "actual rows=".len()..];
        n[..n.find(' ').unwrap_or(n.len())].parse().unwrap()
    };
    let on_table = format!(" on {table}");
    assert!(
        !plan
            .iter()
            .any(|l| l.contains("Rows Removed") || (l.contains(&on_table) && rows_read(l) > 0)),
        "the purge read live rows: {plan:#?}"
    );
    drop_table(&admin, &table).await;
}

/// Completion and release of a key that someone waits for send a notification (key as hex) on
/// the table's channel; a key nobody waits for completes without one. The store keeps exactly
/// one listener connection however many callers wait.
async fn completions_notify_one_shared_listener(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("notify");
    let app = unique_table("idemnotify");
    let store = opts_at(&url, &table)
        .application_name(&app)
        .connect()
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    listener.listen(&format!("idem_{table}")).await.unwrap();

    let idem = Idem::from_store(store.clone());
    let name = unique("notify");
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let (idem, name) = (idem.clone(), name.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("k")
                .run(async move {
                    go_rx.await.unwrap();
                    Ok::<_, Error>(1u8)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (idem, name) = (idem.clone(), name.clone());
            tokio::spawn(async move {
                idem.call(name)
                    .key("k")
                    .wait(Duration::from_secs(20))
                    .run(async { Ok::<_, Error>(2u8) })
                    .await
            })
        })
        .collect();
    let listening = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    // One listener for 20 waiters: never two at once, and one once they have subscribed. Polled,
    // twice, because on a loaded machine subscribing (or a listener's reconnect) takes a while.
    let one_listener = || async {
        let started = std::time::Instant::now();
        loop {
            let n = listening().await;
            assert!(n <= 1, "{n} listener connections for one store");
            if n == 1 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no listener connection after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    one_listener().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    one_listener().await;
    go_tx.send(()).unwrap();
    assert_eq!(slow.await.unwrap().unwrap(), Outcome::Fresh(1));
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap(), Outcome::Replayed(1));
    }
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(note.payload(), digest(&name, "k").to_hex());

    // Nobody waits for "quiet": it completes without a notification, so the next one the
    // listener gets is the release of "r" below.
    idem.call(name.clone())
        .key("quiet")
        .run(async { Ok::<_, Error>(3u8) })
        .await
        .unwrap();

    // release notifies a waiter too.
    let key = digest(&name, "r");
    let fp = fingerprint("r");
    let claim = Claim {
        name: &name,
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_secs(30),
        ttl: Duration::ZERO,
    };
    let ClaimOutcome::Claimed { token, .. } = store.claim(claim).await.unwrap() else {
        panic!()
    };
    let waiter = {
        let (store, key) = (store.clone(), key);
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            // The listener is up, so one `changed` lasts at most the fallback interval (200
            // ms) unless a notification ends it.
            store.changed(&key, Duration::from_secs(30)).await;
            started.elapsed()
        })
    };
    let started = std::time::Instant::now();
    while !waiters_flag(&admin, &table, &key).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never marked the row"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(store.release(&key, token).await.unwrap());
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(
        note.payload(),
        key.to_hex(),
        "\"quiet\" must not have notified"
    );
    waiter.await.unwrap();
    drop_table(&admin, &table).await;
}

/// The `waiters` mark of `key`'s row.
async fn waiters_flag(admin: &sqlx::PgPool, table: &str, key: &idem::key::Digest) -> bool {
    sqlx::query_scalar(&format!("SELECT waiters FROM \"{table}\" WHERE key = $1"))
        .bind(&key.0[..])
        .fetch_one(admin)
        .await
        .unwrap()
}

/// A waiter's mark answers "not in progress" at once for a key that is completed, released or
/// lapsed, so the caller reads again instead of waiting for a notification that never comes.
async fn a_waiter_on_a_finished_key_returns_at_once(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("markdone");
    let store = opts_at(&url, &table).connect().await.unwrap();
    let name = unique("markdone");
    Idem::from_store(store.clone())
        .call(name.clone())
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    let key = digest(&name, "k");
    // A 30 s timeout: returning within the test's 10 s bound means the mark said "done".
    tokio::time::timeout(
        Duration::from_secs(10),
        store.changed(&key, Duration::from_secs(30)),
    )
    .await
    .expect("changed() on a completed key returns without waiting for a notification");
    assert!(
        !waiters_flag(&admin, &table, &key).await,
        "a completed row is not marked"
    );
    drop_table(&admin, &table).await;
}

/// A table at schema version 2 (before `waiters`) is upgraded on open, and its rows replay.
async fn a_version_2_table_gains_the_waiters_column_and_keeps_its_rows(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("mig2");
    PostgresStore::migrate_to(&admin, &table, 2).await.unwrap();
    let name = unique("mig2");
    let key = digest(&name, "k");
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" (key, name, fingerprint, token, status, value, created_at, \
         expires_at) VALUES ($1, $2, $3, 7, 1, '\\x01', 0, 9000000000000)"
    ))
    .bind(&key.0[..])
    .bind(&name)
    .bind(&fingerprint("k").0[..])
    .execute(&admin)
    .await
    .unwrap();
    let store = opts_at(&url, &table).connect().await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    let r = store
        .get(&key)
        .await
        .unwrap()
        .expect("the v2 row is still there");
    assert_eq!(r.token, 7);
    assert_eq!(r.value.as_deref(), Some(&[1u8][..]));
    drop_table(&admin, &table).await;
}

/// Record times are the server's clock: `now` in a record is the database's, not ours.
async fn record_times_come_from_the_server_clock(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("clock");
    let store = opts_at(&url, &table).connect().await.unwrap();
    let name = unique("clock");
    Idem::from_store(store.clone())
        .call(name.clone())
        .key("k")
        .ttl(Duration::from_secs(60))
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    let r = store.get(&digest(&name, "k")).await.unwrap().unwrap();
    let row = sqlx::query("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        .fetch_one(&admin)
        .await
        .unwrap();
    let server_now: i64 = row.get(0);
    assert!(
        (server_now - r.now).abs() < 5_000,
        "{server_now} vs {}",
        r.now
    );
    assert!((r.expires_at - r.now - 60_000).abs() < 5_000);
    assert!(r.token >= (r.created_at as u64) * 1000);
    drop_table(&admin, &table).await;
}

/// An operator's release on one instance reaches another instance's local cache (NOTIFY on the
/// releases channel): two handles on separate pools, both caching for an hour. `a` replays `k`
/// from its cache (the stored value is changed underneath, without a notification, so a replay
/// from the store would say otherwise), `b` force-releases `k`, and `a`'s next calls run the
/// body again within seconds instead of replaying the released result for the cache's hour.
#[cfg(feature = "cache")]
async fn a_release_elsewhere_reaches_this_handles_cache(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("released");
    let open = || async {
        let store = opts_at(&url, &table).connect().await.unwrap();
        Idem::from_store(store)
            .with_cache(idem::CacheOptions::new().max_age(Duration::from_secs(3600)))
    };
    let (a, b) = (open().await, open().await);
    for idem in [&a, &b] {
        assert!(idem.cache_follows_releases(Duration::from_secs(10)).await);
    }
    let name = unique("released");
    let k = digest(&name, "k");
    let runs = Counter::default();
    let call = |idem: &Idem| {
        let runs = runs.clone();
        idem.call(name.clone())
            .key("k")
            .ttl(Duration::from_secs(3600))
            .run(async move { Ok::<_, Error>(runs.hit() as u32) })
    };
    assert_eq!(call(&a).await.unwrap(), Outcome::Fresh(1));

    // The stored value becomes another result's (999), behind the handles' backs.
    let other = unique("other");
    a.call(other.clone())
        .key("k")
        .run(async { Ok::<_, Error>(999u32) })
        .await
        .unwrap();
    let value = a
        .store()
        .get(&digest(&other, "k"))
        .await
        .unwrap()
        .unwrap()
        .value;
    let changed = sqlx::query(&format!("UPDATE \"{table}\" SET value = $1 WHERE key = $2"))
        .bind(value)
        .bind(&k.0[..])
        .execute(&admin)
        .await
        .unwrap();
    assert_eq!(changed.rows_affected(), 1);
    assert_eq!(
        call(&b).await.unwrap(),
        Outcome::Replayed(999),
        "b reads the store"
    );
    assert_eq!(
        call(&a).await.unwrap(),
        Outcome::Replayed(1),
        "a replays its cache"
    );

    assert!(b.force_release(&k).await.unwrap().is_some(), "b releases k");
    let released = std::time::Instant::now();
    loop {
        match call(&a).await.unwrap() {
            Outcome::Fresh(n) => {
                assert_eq!(n, 2);
                break;
            }
            Outcome::Replayed(v) => {
                assert_eq!(v, 1);
                assert!(
                    released.elapsed() < Duration::from_secs(5),
                    "a still replays from its cache 5 s after b released the key"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    eprintln!("a saw b's release after {:?}", released.elapsed());
    assert_eq!(runs.get(), 2);
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    POSTGRES => [
        fresh_call_is_two_round_trips_and_replay_one,
        server_down_at_call_time_is_a_store_error,
        missing_create_privilege_is_named,
        schema_newer_than_the_code_is_refused,
        row_from_a_newer_schema_version_is_refused,
        migrations_upgrade_and_concurrent_opens_do_not_race,
        from_pool_sees_the_same_keys,
        transactional_mode_commits_and_rolls_back_with_the_handler,
        transactional_duplicate_waits_for_the_first_transaction,
        purge_is_bounded_and_drains,
        completions_notify_one_shared_listener,
        a_waiter_on_a_finished_key_returns_at_once,
        a_version_2_table_gains_the_waiters_column_and_keeps_its_rows,
        record_times_come_from_the_server_clock,
        #[cfg(feature = "cache")]
        a_release_elsewhere_reaches_this_handles_cache,
    ],
    ANYWHERE => [
        bad_table_names_are_config_errors,
        bad_urls_are_config_errors,
        server_down_at_open_is_a_store_error,
        futures_are_send,
    ],
}
