//! The `idem` tool as a process against PostgreSQL: the stuck-key scenario of the README's
//! "Operating idem" section, step by step, plus a table never migrated, missing privileges, and
//! purge / stats. Each test works in a table of its own and drops it.

mod common;

use common::{complete, idem, leave_stuck_claim, unique, Cli};
use idem::postgres::sqlx::{self, PgPool};
use idem::postgres::PostgresOptions;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A table of this test's own, dropped (with its version table) when the guard goes.
struct Table {
    name: String,
    admin: PgPool,
}

impl Table {
    async fn new(url: &str) -> Table {
        Table {
            name: unique("idem_cli"),
            admin: PgPool::connect(url).await.expect("admin connection"),
        }
    }

    async fn drop_all(&self) {
        for t in [self.name.clone(), format!("{}_migrations", self.name)] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
                .execute(&self.admin)
                .await
                .unwrap();
        }
    }
}

async fn open(url: &str, table: &str) -> idem::Idem {
    let store = PostgresOptions::from_url(url)
        .unwrap()
        .table(table)
        .connect()
        .await
        .expect("PostgreSQL store");
    idem::Idem::from_store(store)
}

/// The README's "A stuck key, from a customer's order id", step by step: a worker claims the charge of order 1234 and dies; the
/// operator finds the stuck key from the order id, sees why it is stuck, releases it (refused
/// first, then with --force), and the customer's retry runs the charge.
async fn an_operator_finds_explains_and_releases_a_stuck_key(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url).with("--table", t);
    let app = open(&url, t).await;
    leave_stuck_claim(&app, "charges.v1", "order-1234").await;
    complete(
        &app,
        "charges.v1",
        "order-1000",
        5,
        Duration::from_secs(3600),
    )
    .await;
    let digest = idem::testkit::digest("charges.v1", "order-1234").to_hex();

    // 1. What is stuck in charges.v1?
    let list = cli
        .run(&["list", "--status", "in-progress", "--name", "charges.v1"])
        .expect(0);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a header and the one stuck key:\n{}",
        list.stdout
    );
    assert!(lines[0].starts_with("NAME") && lines[0].contains("DIGEST"));
    assert!(lines[1].starts_with("charges.v1"), "{}", lines[1]);
    assert!(lines[1].contains("in-progress") && lines[1].contains(&digest));

    // Claimed just now: not older than ten minutes.
    let old = cli
        .run(&["--json", "list", "--older-than", "10m"])
        .expect(0);
    assert_eq!(old.json().as_array().unwrap().len(), 0);

    // 2. Is it order 1234, and why is it stuck?
    let show = cli.run(&["show", "charges.v1", "order-1234"]).expect(0);
    assert!(
        show.stdout.contains(&format!("digest       {digest}")),
        "{show:#?}"
    );
    assert!(
        show.stdout.contains("status       in-progress"),
        "{show:#?}"
    );
    assert!(show.stdout.contains("lease left   59m"), "{show:#?}");
    assert!(show.stdout.contains("has not finished"), "{show:#?}");
    assert!(show.stdout.contains("idem release --force"), "{show:#?}");
    let doc = cli.run(&["--json", "show", "charges.v1", "order-1234"]);
    let doc = doc.expect(0).json();
    assert_eq!(doc["status"], "in-progress");
    assert!(
        doc["lease_left_ms"].as_i64().unwrap() > 3_500_000,
        "{doc:#}"
    );
    assert!(doc["age_ms"].as_i64().unwrap() < 60_000, "{doc:#}");
    assert_eq!(doc["value_size"], serde_json::Value::Null);

    // The customer's retry is refused while the claim is live.
    let retry = app
        .call("charges.v1")
        .key("order-1234")
        .run(async { Ok::<_, idem::Error>(1u32) })
        .await;
    assert!(
        matches!(retry, Err(idem::Error::InProgress { .. })),
        "{retry:?}"
    );

    // 3. Release without --force: refused, nothing changed.
    let refused = cli.run(&["release", "charges.v1", "order-1234"]);
    let refused = refused.expect(3);
    assert!(refused.stderr.contains("refused"), "{refused:#?}");
    assert!(refused.stderr.contains("--force"), "{refused:#?}");
    assert!(
        refused.stderr.contains("Nothing was changed"),
        "{refused:#?}"
    );
    cli.run(&["show", "charges.v1", "order-1234"]).expect(0);

    // 4. With --force: done, and it says what it released.
    let released = cli
        .run(&["release", "--force", "charges.v1", "order-1234"])
        .expect(0);
    assert!(
        released
            .stdout
            .contains("released charges.v1 order-1234: ended the in-progress claim"),
        "{released:#?}"
    );
    cli.run(&["show", "charges.v1", "order-1234"]).expect(1);

    // 5. The retry now runs the charge, once.
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let out = app
        .call("charges.v1")
        .key("order-1234")
        .run(async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, idem::Error>(42u32)
        })
        .await
        .expect("the retry runs");
    assert!(!out.is_replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let doc = cli
        .run(&["--json", "show", "charges.v1", "order-1234", "--value"])
        .expect(0)
        .json();
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["value"]["ok"], 42);
    table.drop_all().await;
}

async fn a_table_never_migrated_says_run_migrate_and_migrate_creates_it(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url).with("--table", t);
    for cmd in [
        &["show", "charges.v1", "order-1"][..],
        &["list"],
        &["stats"],
    ] {
        let run = cli.run(cmd).expect(5);
        assert!(
            run.stderr.contains(&format!("no idem table {t}")),
            "{run:#?}"
        );
        assert!(run.stderr.contains("run `idem migrate`"), "{run:#?}");
    }
    // Nothing was created by looking.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(t)
        .fetch_one(&table.admin)
        .await
        .unwrap();
    assert!(!exists);

    let run = cli.run(&["migrate"]).expect(0);
    assert!(
        run.stdout.contains("created the schema (version 5)"),
        "{run:#?}"
    );
    let run = cli.run(&["migrate"]).expect(0);
    assert!(
        run.stdout.contains("schema is current (version 5)"),
        "{run:#?}"
    );
    cli.run(&["stats"]).expect(0);
    table.drop_all().await;
}

async fn connection_and_permission_errors_say_what_to_do(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url).with("--table", t);
    let app = open(&url, t).await;
    complete(&app, "charges.v1", "order-1", 1, Duration::from_secs(600)).await;

    // A role with no privileges on the idem tables.
    let role = unique("idem_cli_ro");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&table.admin)
        .await
        .unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let as_role = format!("{scheme}://{role}@{host}");

    let as_role = Cli::new(&as_role).with("--table", t);
    let run = as_role.run(&["list"]).expect(4);
    assert!(run.stderr.contains("permission denied"), "{run:#?}");
    assert!(
        run.stderr.contains("needs the SELECT privilege"),
        "{run:#?}"
    );
    assert!(
        run.stderr
            .contains(&format!("GRANT SELECT ON {t} TO {role}")),
        "{run:#?}"
    );

    for grant in [
        format!("GRANT SELECT ON \"{t}\" TO {role}"),
        format!("GRANT SELECT ON \"{t}_migrations\" TO {role}"),
    ] {
        sqlx::query(&grant).execute(&table.admin).await.unwrap();
    }
    let list = as_role.run(&["--json", "list"]).expect(0);
    assert_eq!(list.json().as_array().unwrap().len(), 1);
    let run = as_role
        .run(&["release", "--force", "charges.v1", "order-1"])
        .expect(4);
    assert!(
        run.stderr.contains("needs the SELECT and UPDATE privilege"),
        "{run:#?}"
    );
    assert!(run.stderr.contains("GRANT SELECT, UPDATE ON"), "{run:#?}");
    cli.run(&["show", "charges.v1", "order-1"]).expect(0);

    // A server that is not there: exit 4, the address, and no password in the message.
    let run = idem(&["--url", "postgres://app:s3cret@127.0.0.1:1/db", "list"]).expect(4);
    assert!(run.stderr.contains("cannot reach the server"), "{run:#?}");
    assert!(!run.stderr.contains("s3cret"), "{run:#?}");
    // A database that does not exist.
    let (server, _) = rest.rsplit_once('/').unwrap();
    let no_db = format!("{scheme}://{server}/no_such_db_idem");
    let run = Cli::new(&no_db).run(&["list"]).expect(4);
    assert!(run.stderr.contains("does not exist"), "{run:#?}");

    table.drop_all().await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&table.admin)
        .await
        .unwrap();
}

async fn stats_count_and_purge_deletes_expired_records(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url).with("--table", t);
    let app = open(&url, t).await;
    for i in 0..5 {
        complete(
            &app,
            "emails.v1",
            &format!("gone-{i}"),
            1,
            Duration::from_millis(1),
        )
        .await;
    }
    complete(&app, "emails.v1", "kept", 1, Duration::from_secs(600)).await;
    leave_stuck_claim(&app, "charges.v1", "order-9").await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    let names = stats["names"].as_array().unwrap();
    assert_eq!(names.len(), 2, "{stats:#}");
    assert_eq!(names[0]["name"], "charges.v1");
    assert_eq!(names[0]["in_progress"], 1);
    assert_eq!(names[1]["name"], "emails.v1");
    assert_eq!(names[1]["completed"], 1);
    assert_eq!(names[1]["expired"], 5);
    let text = cli.run(&["stats"]).expect(0);
    let total = text.stdout.lines().last().unwrap().to_string();
    assert_eq!(
        total.split_whitespace().collect::<Vec<_>>(),
        ["(total)", "1", "1", "5", "0", "0", "0"]
    );

    let purge = cli.run(&["purge", "--expired", "--batch", "2"]);
    assert!(purge.expect(0).stdout.contains("purged 5 expired records"));
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["expired"], 0, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 1, "{stats:#}");
    table.drop_all().await;
}

/// Parked keys: listed by `idem pending`, resolved both ways, refusals (see `common::parked`).
async fn pending_lists_parked_keys_and_resolve_decides_them(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url).with("--table", t);
    let app = open(&url, t).await;
    common::parked::parked_keys_are_listed_and_resolved(&app, "charges.v1", |args| {
        common::out(cli.run(args))
    })
    .await;
    table.drop_all().await;
}

idem_integration::server_tests! {
    POSTGRES => [
        pending_lists_parked_keys_and_resolve_decides_them,
        an_operator_finds_explains_and_releases_a_stuck_key,
        a_table_never_migrated_says_run_migrate_and_migrate_creates_it,
        connection_and_permission_errors_say_what_to_do,
        stats_count_and_purge_deletes_expired_records,
    ],
}
