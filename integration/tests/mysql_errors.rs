//! The MySQL store's typed errors against the real server (`IDEM_TEST_MYSQL_URL`): every way a
//! server can refuse idem reaches the caller as `Error::Store` with the `StoreErrorKind` that
//! says what to do, classified by the server's error number (never by its message), and no
//! body runs. Users are created with unique names and dropped after.

mod mysql_common;

use idem::store::mysql::{MysqlOptions, MysqlStore};
use idem::store::{Backend, Store};
use idem::testkit::{unique, Counter};
use idem::{Error, Idem, StoreErrorKind};
use mysql_common::*;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Executor};
use std::time::{Duration, Instant};

/// `url` with its user part (`user[:password]`) replaced.
fn with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{host}")
}

/// `url` with its database replaced.
fn with_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let query = tail.split_once('?').map(|(_, q)| format!("?{q}"));
    format!(
        "{scheme}://{authority}/{database}{}",
        query.unwrap_or_default()
    )
}

/// The database of `url`.
fn database_of(url: &str) -> String {
    let (_, rest) = url.split_once("://").expect("a URL");
    let tail = rest.split_once('/').map_or("", |(_, t)| t);
    tail.split('?').next().unwrap_or_default().to_string()
}

/// The store kind of an error, with the error shown when it is not a store error.
fn kind(e: &Error) -> StoreErrorKind {
    match e {
        Error::Store(s) => {
            assert_eq!(s.backend, Backend::Mysql, "{e}");
            s.kind
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
}

/// A user of the server with a unique name, dropped when the guard goes.
struct User {
    admin: MySqlPool,
    name: String,
    password: String,
}

impl User {
    async fn create(admin: &MySqlPool) -> User {
        // Under MySQL's 32-character limit on user names.
        let name = format!("idem_{}", &unique("u").replace('_', "")[..20]);
        let password = "idem-test-pw".to_string();
        sqlx::raw_sql(&format!(
            "CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'"
        ))
        .execute(admin)
        .await
        .expect("CREATE USER");
        User {
            admin: admin.clone(),
            name,
            password,
        }
    }

    async fn grant(&self, what: &str, on: &str) {
        sqlx::raw_sql(&format!("GRANT {what} ON {on} TO '{}'@'%'", self.name))
            .execute(&self.admin)
            .await
            .expect("GRANT");
    }

    fn url(&self, url: &str) -> String {
        with_user(url, &format!("{}:{}", self.name, self.password))
    }

    async fn drop_user(self) {
        sqlx::raw_sql(&format!("DROP USER IF EXISTS '{}'@'%'", self.name))
            .execute(&self.admin)
            .await
            .expect("DROP USER");
    }
}

async fn a_wrong_password_is_authentication(url: String) {
    let bad = with_user(&url, "nobody:wrong");
    let err = Idem::mysql(&bad).await.unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Authentication, "{err}");
    assert!(!kind(&err).is_transient());
    // An existing user with a wrong password: the same.
    let admin = admin(&url).await;
    let user = User::create(&admin).await;
    let err = Idem::mysql(&with_user(&url, &format!("{}:not-it", user.name)))
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Authentication, "{err}");
    user.drop_user().await;
}

/// A user without any privilege on the database cannot even open it; a user who may read the
/// table but not write it opens (the schema check only reads) and then cannot claim.
async fn missing_privileges_are_permission(url: String) {
    let admin = admin(&url).await;
    let database = database_of(&url);
    let table = unique_table("perm");
    let owner = store(&url, &table).await;
    let ns = unique("perm");
    Idem::from_store(owner)
        .call(ns.clone())
        .key(&1)
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();

    let user = User::create(&admin).await;
    let err = Idem::mysql(&user.url(&url)).await.unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Permission, "{err}");

    // SELECT only: the store opens, a replay is refused at the claim (an upsert), a fresh key
    // too, and neither body runs.
    user.grant("SELECT", &format!("`{database}`.`{table}`"))
        .await;
    user.grant("SELECT", &format!("`{database}`.`{table}_migrations`"))
        .await;
    let reader = MysqlOptions::from_url(&user.url(&url))
        .unwrap()
        .table(&table)
        .migrate_on_open(false)
        .connect()
        .await
        .expect("a reader opens without migrating");
    let idem = Idem::from_store(reader.clone());
    let runs = Counter::default();
    for k in [1, 2] {
        let c = runs.clone();
        let err = idem
            .call(ns.clone())
            .key(&k)
            .run(async move { Ok::<_, Error>(c.hit()) })
            .await
            .unwrap_err();
        assert_eq!(kind(&err), StoreErrorKind::Permission, "{err}");
    }
    assert_eq!(runs.get(), 0);
    // Reading is allowed: `get` answers.
    let found = reader
        .get(&idem::testkit::digest(&ns, &1))
        .await
        .expect("SELECT is granted");
    assert!(found.is_some());

    // Without CREATE, migrating a new table names the missing privilege.
    let err = MysqlOptions::from_url(&user.url(&url))
        .unwrap()
        .table(unique_table("perm_new"))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Permission, "{err}");
    assert!(err.to_string().contains("CREATE privilege"), "{err}");

    user.drop_user().await;
    drop_table(&admin, &table).await;
}

async fn a_missing_database_is_database_missing(url: String) {
    let missing = with_database(&url, &unique("idem_no_db"));
    let err = Idem::mysql(&missing).await.unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::DatabaseMissing, "{err}");
    let err = MysqlOptions::from_url(&missing)
        .unwrap()
        .migrate()
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::DatabaseMissing, "{err}");
}

/// The table dropped under an open store: every step says the schema is missing, and no body
/// runs.
async fn a_table_dropped_after_open_is_schema_missing(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("dropped");
    let store = store(&url, &table).await;
    let idem = Idem::from_store(store.clone());
    drop_table(&admin, &table).await;
    let runs = Counter::default();
    let c = runs.clone();
    let err = idem
        .call(unique("dropped"))
        .key(&1)
        .run(async move { Ok::<_, Error>(c.hit()) })
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::SchemaMissing, "{err}");
    assert!(kind(&err).is_schema());
    assert_eq!(runs.get(), 0);
    let err = store
        .get(&idem::testkit::digest("dropped", &1))
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::SchemaMissing, "{err}");
    let err = store.purge_expired(10).await.unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::SchemaMissing, "{err}");
    let version = store.schema_version().await.unwrap();
    assert_eq!(version, 0, "the version table went too");
}

/// Nothing listens: open fails at once as unreachable, and so does a store whose server goes
/// away (its pool's acquire timeout).
async fn a_closed_port_is_unreachable(url: String) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let closed = format!("mysql://root@127.0.0.1:{port}/test");
    let t = Instant::now();
    let err = Idem::mysql(&closed).await.unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Unreachable, "{err}");
    assert!(kind(&err).is_transient());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The URL's server is up: a pool on the closed port, opened lazily, fails each step as
    // unreachable too.
    let pool = MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&closed)
        .unwrap();
    let err = MysqlStore::from_pool(pool, MysqlOptions::new())
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Unreachable, "{err}");
    drop(url);
}

/// A row held by someone's open transaction past `innodb_lock_wait_timeout`: the store's own
/// claim retries once, then reports `Busy` (transient); inside a caller's transaction the
/// claim is not retried (InnoDB may have rolled the transaction back) and reports `Busy` at
/// once. The body runs in neither, and after the holder ends, the key replays.
async fn a_lock_held_past_the_wait_timeout_is_busy(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("busy");
    // The session's lock wait timeout at its minimum (1 s); the server's setting is shared.
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION innodb_lock_wait_timeout = 1")
                    .await
                    .map(drop)
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let store = MysqlStore::from_pool(pool.clone(), MysqlOptions::new().table(&table))
        .await
        .unwrap();
    let idem = Idem::from_store(store);
    let ns = unique("busy");
    idem.call(ns.clone())
        .key(&7)
        .run(async { Ok::<_, Error>(7u32) })
        .await
        .unwrap();

    // Someone holds the row.
    let mut holder = MySqlConnection::connect(&url).await.unwrap();
    holder.execute("BEGIN").await.unwrap();
    sqlx::query(&format!(
        "SELECT `key` FROM `{table}` WHERE `key` = ? FOR UPDATE"
    ))
    .bind(&idem::testkit::digest(&ns, &7).0[..])
    .fetch_one(&mut holder)
    .await
    .unwrap();

    let runs = Counter::default();
    let c = runs.clone();
    let t = Instant::now();
    let err = idem
        .call(ns.clone())
        .key(&7)
        .run(async move { Ok::<_, Error>(c.hit()) })
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Busy, "{err}");
    assert!(kind(&err).is_transient());
    // Two waits of a second: the statement ran twice.
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());

    let mut tx = pool.begin().await.unwrap();
    let c = runs.clone();
    let err = idem
        .call(ns.clone())
        .key(&7)
        .in_transaction(&mut tx, async move |_conn: &mut MySqlConnection| {
            Ok::<_, Error>(c.hit())
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&err), StoreErrorKind::Busy, "{err}");
    drop(tx);
    assert_eq!(runs.get(), 0);

    holder.execute("ROLLBACK").await.unwrap();
    let out = idem
        .call(ns.clone())
        .key(&7)
        .run(async { Ok::<_, Error>(0u32) })
        .await
        .unwrap();
    assert!(out.is_replayed());
    assert_eq!(out.into_inner(), 7);
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    MYSQL => [
        a_wrong_password_is_authentication,
        missing_privileges_are_permission,
        a_missing_database_is_database_missing,
        a_table_dropped_after_open_is_schema_missing,
        a_closed_port_is_unreachable,
        a_lock_held_past_the_wait_timeout_is_busy,
    ],
}
