//! The SQLite store beyond the conformance suite: statement counts, locks, bad paths and URLs,
//! corrupt rows, schema versions, two handles on one file.
#![cfg(feature = "sqlite")]

use idem::store::sqlite::{SqliteOptions, SqliteStore};
use idem::{Error, Idem, Outcome};
use sqlx::Connection;
use std::time::Duration;

fn temp_db(tag: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}",
        dir.path().join(format!("{tag}.db")).display()
    );
    (dir, url)
}

#[tokio::test]
async fn a_locked_file_fails_with_a_store_error_after_busy_timeout() {
    let (_dir, url) = temp_db("locked");
    let store = SqliteOptions::from_url(&url)
        .unwrap()
        .busy_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let r = idem
        .call("locked")
        .key("k")
        .run(async { Ok::<_, Error>(1u8) })
        .await;
    assert!(
        matches!(r, Err(Error::Store(ref e)) if e.backend == "sqlite"),
        "{r:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "it waited busy_timeout"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let r = idem
        .call("locked")
        .key("k")
        .run(async { Ok::<_, Error>(2u8) })
        .await;
    assert_eq!(
        r.unwrap(),
        Outcome::Fresh(2),
        "nothing was claimed by the failed call"
    );
}

#[tokio::test]
async fn a_path_that_cannot_be_created_is_a_clear_store_error_at_open() {
    // Under a regular file: no directory can be made there, not even by root.
    for url in [
        "sqlite:///etc/hostname/idem.db",
        "sqlite:///nonexistent-idem-dir/sub/idem.db",
    ] {
        match Idem::sqlite(url).await {
            Err(Error::Store(e)) => {
                assert_eq!(e.op, "open");
                assert!(e.to_string().contains(url), "{e}");
            }
            other => panic!("{url}: expected a store error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn bad_urls_and_table_names_are_config_errors() {
    assert!(matches!(
        Idem::sqlite("sqlite://x.db?mode=sideways").await,
        Err(Error::Config(_))
    ));
    for table in ["keys; DROP TABLE x", "a\"b", "1abc", ""] {
        let r = SqliteOptions::from_url("sqlite::memory:")
            .unwrap()
            .table(table)
            .connect()
            .await;
        assert!(matches!(r, Err(Error::Config(_))), "{table:?}");
    }
}

#[tokio::test]
async fn a_corrupt_stored_value_is_a_codec_error_and_the_body_does_not_run() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let pool = store.pool().clone();
    let idem = Idem::from_store(store);
    let call = |v: u32| {
        idem.call("corrupt")
            .key("k")
            .run(async move { Ok::<_, Error>(v) })
    };
    call(1).await.unwrap();
    sqlx::query("UPDATE idem_records SET value = x'0102ff00'")
        .execute(&pool)
        .await
        .unwrap();
    match call(2).await {
        Err(Error::Codec(e)) => assert_eq!(e.kind, idem::CodecErrorKind::Corrupt),
        other => panic!("expected a codec error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_database_of_a_newer_schema_is_refused() {
    let (_dir, url) = temp_db("newer");
    let store = SqliteStore::connect(&url).await.unwrap();
    sqlx::query("INSERT INTO idem_records_migrations (version, description) VALUES (99, 'x')")
        .execute(store.pool())
        .await
        .unwrap();
    drop(store);
    match Idem::sqlite(&url).await {
        Err(Error::Store(e)) => {
            assert_eq!(e.kind, idem::StoreErrorKind::SchemaNewer);
            assert!(e.to_string().contains("99"), "{e}");
        }
        other => panic!("expected a SchemaNewer store error, got {other:?}"),
    }
}

#[tokio::test]
async fn two_handles_on_one_file_share_the_keys() {
    let (_dir, url) = temp_db("shared");
    let a = Idem::sqlite(&url).await.unwrap();
    let b = Idem::sqlite(&url).await.unwrap();
    let first = a
        .call("shared")
        .key("k")
        .run(async { Ok::<_, Error>("from a".to_string()) })
        .await
        .unwrap();
    let second = b
        .call("shared")
        .key("k")
        .run(async { Ok::<_, Error>("from b".to_string()) })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    assert_eq!(second, Outcome::Replayed("from a".to_string()));
}

#[tokio::test]
async fn the_reaper_purges_expired_rows() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let pool = store.pool().clone();
    let idem = Idem::from_store(store);
    for i in 0..10 {
        idem.call("reaped")
            .key(&i)
            .ttl(Duration::from_millis(50))
            .run(async { Ok::<_, Error>(()) })
            .await
            .unwrap();
    }
    let _reaper = idem.spawn_reaper(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

/// `purge_expired(limit)` deletes up to `limit` expired rows and never a live one; a short
/// count says the expired rows are drained.
#[tokio::test]
async fn a_purge_deletes_up_to_its_limit_and_spares_live_rows() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let pool = store.pool().clone();
    // 350 expired rows (expires_at 1 ms after the epoch) and one live one.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 350) \
         INSERT INTO idem_records (key, name, fingerprint, token, status, value, created_at, expires_at) \
         SELECT zeroblob(24) || CAST(i AS BLOB) || zeroblob(8 - length(CAST(i AS BLOB))), 'old', \
                zeroblob(32), 1, 1, NULL, 0, 1 FROM n",
    )
    .execute(&pool)
    .await
    .unwrap();
    let idem = Idem::from_store(store);
    idem.call("kept")
        .key("live")
        .run(async { Ok::<_, Error>(()) })
        .await
        .unwrap();
    let store = idem.store();
    assert_eq!(store.purge_expired(250).await.unwrap(), 250);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 100);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "the live row stays");
}

/// `sqlite::memory:` survives its pooled connection being closed, as the pool does when a
/// caller drops a query future mid-statement (CI once saw "no such table" after exactly that).
#[tokio::test]
async fn an_in_memory_database_outlives_a_closed_pool_connection() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let pool = store.pool().clone();
    let idem = Idem::from_store(store);
    let call = |v: u8| {
        idem.call("memory-keeper")
            .key("k")
            .run(async move { Ok::<_, Error>(v) })
    };
    assert_eq!(call(1).await.unwrap(), Outcome::Fresh(1));
    pool.acquire().await.unwrap().close().await.unwrap();
    assert_eq!(pool.size(), 0, "the pool holds no connection now");
    assert_eq!(
        call(2).await.unwrap(),
        Outcome::Replayed(1),
        "a new pooled connection sees the same database"
    );
}

/// Many handles opening one new file at once all open it: switching a new file to WAL takes a
/// lock that SQLite's busy handler does not wait for, and migrating with a deferred transaction
/// fails at once when another handle migrated in between (CI once saw "database is locked").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handles_opening_one_new_file_together_all_open_it() {
    for round in 0..20 {
        let (_dir, url) = temp_db(&format!("together-{round}"));
        let opens: Vec<_> = (0..16)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { Idem::sqlite(&url).await })
            })
            .collect();
        let mut handles = Vec::new();
        for open in opens {
            handles.push(open.await.unwrap().expect("every handle opens the file"));
        }
        let first = handles[0]
            .call("together")
            .key("k")
            .run(async { Ok::<_, Error>(round) })
            .await
            .unwrap();
        assert_eq!(first, Outcome::Fresh(round));
        let last = handles[15]
            .call("together")
            .key("k")
            .run(async { Ok::<_, Error>(99) })
            .await
            .unwrap();
        assert_eq!(
            last,
            Outcome::Replayed(round),
            "one file, one idempotency space"
        );
    }
}

/// A file written by idem 0.1 (table `idem_keys`, its version in `idem_keys_schema`) opens with
/// the default options and keeps its keys: the finished call replays, nothing runs again. The
/// first open records the versions in `idem_keys_migrations`, the way every store records them,
/// and leaves `idem_keys_schema` for processes of the earlier version. The upgrade to schema 2
/// (abandoned attempts) reads every old row as attempt 1 kept until its end, and a claim whose
/// lease had lapsed as released, not abandoned: it meant a free key then.
#[tokio::test]
async fn a_file_of_the_earlier_schema_upgrades_in_place_and_keeps_its_keys() {
    use idem::store::{Claim, ClaimOutcome, Status};
    let (_dir, url) = temp_db("legacy");
    let digest = |key: &str| idem::testkit::digest("legacy.v1", key);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let hour = 3_600_000;
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        // The schema exactly as idem 0.1 created it.
        for ddl in [
            "CREATE TABLE IF NOT EXISTS idem_keys (key BLOB PRIMARY KEY NOT NULL, name TEXT NOT NULL, \
             fingerprint BLOB NOT NULL, token INTEGER NOT NULL, status INTEGER NOT NULL, value BLOB, \
             created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID",
            "CREATE INDEX IF NOT EXISTS idem_keys_expires ON idem_keys (expires_at)",
            "CREATE TABLE IF NOT EXISTS idem_keys_schema (version INTEGER NOT NULL)",
            "INSERT INTO idem_keys_schema (version) VALUES (1)",
        ] {
            sqlx::query(ddl).execute(&mut conn).await.unwrap();
        }
        // Rows as idem 0.1 wrote them: a finished call, a claim whose lease lapsed (a free key
        // then), a claim still live.
        let value = idem::testkit::encode_stored(&Ok::<u32, String>(7)).unwrap();
        for (key, status, value, created_at, expires_at) in [
            ("order-7", 1, Some(value), now - 1000, now + hour),
            ("order-8", 0, None, now - 10_000, now - 5000),
            ("order-9", 0, None, now - 1000, now + hour),
        ] {
            sqlx::query(
                "INSERT INTO idem_keys (key, name, fingerprint, token, status, value, \
                 created_at, expires_at) VALUES (?1, 'legacy.v1', ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .bind(digest(key).as_bytes().to_vec())
            .bind(idem::testkit::fingerprint(key).as_bytes().to_vec())
            .bind(created_at * 1000)
            .bind(status)
            .bind(value)
            .bind(created_at)
            .bind(expires_at)
            .execute(&mut conn)
            .await
            .unwrap();
        }
        conn.close().await.unwrap();
    }

    let store = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(store.table(), "idem_keys", "the file keeps its table");
    let pool = store.pool().clone();
    let live = idem::Store::get(&store, &digest("order-9"))
        .await
        .unwrap()
        .expect("the live claim");
    assert_eq!(
        (live.status, live.attempt, live.keep_until),
        (Status::InProgress, 1, now + hour)
    );
    let statuses: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT status, keep_until - expires_at FROM idem_keys ORDER BY created_at, status",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        statuses,
        [(2, 0), (0, 0), (1, 0)],
        "lapsed: released; kept until their end"
    );
    let fp = idem::testkit::fingerprint("order-8");
    let lapsed = Claim {
        name: "legacy.v1",
        key: &digest("order-8"),
        fingerprint: &fp,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
    };
    match idem::Store::claim(&store, lapsed).await.unwrap() {
        ClaimOutcome::Claimed { takeover, .. } => {
            assert_eq!(
                takeover, None,
                "a lapsed claim of 0.1 is released, not abandoned"
            )
        }
        other => panic!("the lapsed claim's key is free: {other:?}"),
    }
    let idem = Idem::from_store(store);
    let again = idem
        .call("legacy.v1")
        .key("order-7")
        .run(async { Ok::<_, Error>(8u32) })
        .await
        .unwrap();
    assert_eq!(again, Outcome::Replayed(7), "the stored result replays");
    let recorded: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_keys_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(recorded, [1, 2, 3]);
    let legacy: i64 = sqlx::query_scalar("SELECT max(version) FROM idem_keys_schema")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(legacy, 1, "the earlier version's table is left as it was");
    // A new file gets the one default table.
    let (_dir2, fresh) = temp_db("fresh");
    let store = SqliteStore::connect(&fresh).await.unwrap();
    assert_eq!(store.table(), "idem_records");
}
