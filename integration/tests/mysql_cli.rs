//! The `idem` tool as a process against MySQL / MariaDB (`IDEM_TEST_MYSQL_URL`): the stuck-key
//! scenario of the README's "Operating idem" section (list, show, release), a table never
//! migrated, stats and purge, and the errors an operator meets. Each test works in a table of
//! its own and drops it.
//!
//! The binary is the `idem-cli` package's: this package cannot name another package's binary
//! (`CARGO_BIN_EXE_*` is per package), so the first test builds it with the cargo that runs
//! the tests, in the same target directory and profile (a no-op when it is up to date).

mod mysql_common;
#[path = "../../idem-cli/tests/common/parked.rs"]
mod parked;

use idem::testkit::{unique, Counter};
use idem::Idem;
use mysql_common::*;
use sqlx::mysql::MySqlPool;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The `idem` binary, built once per test process.
fn idem_bin() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile dir>/deps/<this test>: build the tool in the same profile.
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .and_then(|p| p.file_name())
            .and_then(|p| p.to_str())
            .unwrap_or("debug")
            .to_string();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--quiet", "-p", "idem-cli", "--bin", "idem"])
            .arg("--message-format=json-render-diagnostics");
        if profile_dir == "release" {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("cargo runs");
        assert!(
            out.status.success(),
            "building the idem tool failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "idem")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported the idem executable")
    })
}

/// What one run of the tool produced.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn expect(self, code: i32) -> Run {
        assert_eq!(self.code, code, "exit code of idem; it said:\n{self:#?}");
        self
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{self:#?}"))
    }
}

/// `idem --url <url> [--table <table>] <args>`, with no IDEM_* variable leaking in.
struct Cli {
    flags: Vec<String>,
}

impl Cli {
    fn new(url: &str, table: Option<&str>) -> Cli {
        // Built before the test makes its records: a lease the test claims must not tick while
        // cargo builds the tool (a minute on a busy host).
        idem_bin();
        let mut flags = vec!["--url".to_string(), url.to_string()];
        if let Some(t) = table {
            flags.extend(["--table".to_string(), t.to_string()]);
        }
        Cli { flags }
    }

    fn run(&self, rest: &[&str]) -> Run {
        let out = Command::new(idem_bin())
            .args(&self.flags)
            .args(rest)
            .env_remove("IDEM_URL")
            .env_remove("IDEM_TABLE")
            .env_remove("IDEM_REDIS_PREFIX")
            .env_remove("IDEM_KEYRING")
            .output()
            .expect("the idem binary runs");
        Run {
            code: out.status.code().expect("idem exited by itself"),
            stdout: String::from_utf8(out.stdout).expect("UTF-8"),
            stderr: String::from_utf8(out.stderr).expect("UTF-8"),
        }
    }
}

/// A table of this test's own, dropped (with its version table) at the end.
struct Table {
    name: String,
    admin: MySqlPool,
}

impl Table {
    async fn new(url: &str) -> Table {
        Table {
            name: unique_table("cli"),
            admin: admin(url).await,
        }
    }

    async fn open(&self, url: &str) -> Idem {
        Idem::from_store(store(url, &self.name).await)
    }

    async fn drop_all(&self) {
        drop_table(&self.admin, &self.name).await;
    }
}

/// Claims `key` with a one-hour lease and "dies": the future is dropped mid-body, so nothing
/// renews or releases the claim (the stuck key an operator finds after a crash).
async fn leave_stuck_claim(idem: &Idem, name: &str, key: &str) {
    let (claimed, started) = tokio::sync::oneshot::channel::<()>();
    let call = idem
        .call(name.to_string())
        .key(key)
        .lease(Duration::from_secs(3600))
        .run(async move {
            let _ = claimed.send(());
            std::future::pending::<()>().await;
            Ok::<u32, idem::Error>(0)
        });
    let task = tokio::spawn(call);
    started.await.expect("the body started");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

async fn complete(idem: &Idem, name: &str, key: &str, value: u32, ttl: Duration) {
    let out = idem
        .call(name.to_string())
        .key(key)
        .ttl(ttl)
        .run(async move { Ok::<_, idem::Error>(value) })
        .await
        .expect("the call succeeds");
    assert!(!out.is_replayed());
}

/// A worker claims the charge of order 1234 and dies; the operator finds the stuck key, sees
/// why it is stuck, releases it (refused first, then with --force), and the retry runs once.
async fn an_operator_finds_explains_and_releases_a_stuck_key(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let cli = Cli::new(&url, Some(t));
    let app = table.open(&url).await;
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

    let list = cli
        .run(&["list", "--status", "in-progress", "--name", "charges.v1"])
        .expect(0);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a header and the stuck key:\n{}",
        list.stdout
    );
    assert!(lines[0].starts_with("NAME") && lines[0].contains("DIGEST"));
    assert!(lines[1].starts_with("charges.v1"), "{}", lines[1]);
    assert!(lines[1].contains("in-progress") && lines[1].contains(&digest));
    // Both records, oldest claim first, with the completed one's value size.
    let all = cli.run(&["--json", "list"]).expect(0).json();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 2, "{all:#?}");
    assert_eq!(all[0]["status"], "in-progress");
    assert_eq!(all[1]["status"], "completed");
    assert!(all[1]["value_size"].as_u64().unwrap() > 0, "{all:#?}");
    let old = cli
        .run(&["--json", "list", "--older-than", "10m"])
        .expect(0);
    assert_eq!(old.json().as_array().unwrap().len(), 0);
    let other = cli
        .run(&["--json", "list", "--name", "refunds.v1"])
        .expect(0);
    assert_eq!(other.json().as_array().unwrap().len(), 0);

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
    assert!(show.stdout.contains("idem release --force"), "{show:#?}");
    let doc = cli
        .run(&["--json", "show", "charges.v1", "order-1234"])
        .expect(0)
        .json();
    assert_eq!(doc["status"], "in-progress");
    assert!(
        doc["lease_left_ms"].as_i64().unwrap() > 3_500_000,
        "{doc:#}"
    );

    let refused = cli.run(&["release", "charges.v1", "order-1234"]).expect(3);
    assert!(refused.stderr.contains("--force"), "{refused:#?}");
    assert!(
        refused.stderr.contains("Nothing was changed"),
        "{refused:#?}"
    );
    cli.run(&["show", "charges.v1", "order-1234"]).expect(0);

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

    let runs = Counter::default();
    let c = runs.clone();
    let out = app
        .call("charges.v1")
        .key("order-1234")
        .run(async move {
            c.hit();
            Ok::<_, idem::Error>(42u32)
        })
        .await
        .expect("the retry runs");
    assert!(!out.is_replayed());
    assert_eq!(runs.get(), 1);
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
    let cli = Cli::new(&url, Some(t));
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
    // Looking created nothing.
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(t)
    .fetch_one(&table.admin)
    .await
    .unwrap();
    assert_eq!(exists, 0);

    let run = cli.run(&["migrate"]).expect(0);
    assert!(
        run.stdout
            .contains(&format!("mysql table {t}: created the schema (version 3)")),
        "{run:#?}"
    );
    let run = cli.run(&["--json", "migrate"]).expect(0).json();
    assert_eq!(run["backend"], "mysql");
    assert_eq!(run["changed"], false);
    cli.run(&["stats"]).expect(0);
    // The other scheme sqlx accepts for the same server.
    let mariadb = url.replacen("mysql://", "mariadb://", 1);
    Cli::new(&mariadb, Some(t)).run(&["list"]).expect(0);
    table.drop_all().await;
}

async fn stats_count_and_purge_deletes_expired_records(url: String) {
    let table = Table::new(&url).await;
    let cli = Cli::new(&url, Some(&table.name));
    let app = table.open(&url).await;
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
    // Expired records are not listed.
    let listed = cli.run(&["--json", "list"]).expect(0).json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed:#}");

    let purge = cli.run(&["purge", "--expired", "--batch", "2"]);
    assert!(purge.expect(0).stdout.contains("purged 5 expired records"));
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["expired"], 0, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 1, "{stats:#}");
    assert_eq!(stats["total"]["in_progress"], 1, "{stats:#}");
    table.drop_all().await;
}

/// Refused credentials, a missing database, no privileges and no server: each a store failure
/// (exit 4) whose message says which, and no password in it.
async fn connection_and_permission_errors_say_what_to_do(url: String) {
    let table = Table::new(&url).await;
    let t = table.name.as_str();
    let app = table.open(&url).await;
    complete(&app, "charges.v1", "order-1", 1, Duration::from_secs(600)).await;
    let (scheme, rest) = url.split_once("://").unwrap();
    let host_db = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let (host, _) = host_db.split_once('/').unwrap();

    let run = Cli::new(&format!("{scheme}://nobody:s3cret@{host_db}"), Some(t))
        .run(&["list"])
        .expect(4);
    assert!(run.stderr.contains("authentication failed"), "{run:#?}");
    assert!(!run.stderr.contains("s3cret"), "{run:#?}");

    let run = Cli::new(&format!("{scheme}://root@{host}/idem_no_such_db"), Some(t))
        .run(&["list"])
        .expect(4);
    assert!(
        run.stderr.contains("database in the URL does not exist"),
        "{run:#?}"
    );

    let user = format!("idem_{}", &unique("c").replace('_', "")[..20]);
    sqlx::raw_sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
        .execute(&table.admin)
        .await
        .unwrap();
    let as_user = Cli::new(&format!("{scheme}://{user}:pw@{host_db}"), Some(t));
    let run = as_user.run(&["list"]).expect(4);
    assert!(run.stderr.contains("denied"), "{run:#?}");
    // SELECT only: list works, a forced release does not, and changes nothing.
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&table.admin)
        .await
        .unwrap();
    for on in [t.to_string(), format!("{t}_migrations")] {
        sqlx::raw_sql(&format!(
            "GRANT SELECT ON `{database}`.`{on}` TO '{user}'@'%'"
        ))
        .execute(&table.admin)
        .await
        .unwrap();
    }
    let list = as_user.run(&["--json", "list"]).expect(0);
    assert_eq!(list.json().as_array().unwrap().len(), 1);
    let run = as_user
        .run(&["release", "--force", "charges.v1", "order-1"])
        .expect(4);
    assert!(run.stderr.contains("denied"), "{run:#?}");
    Cli::new(&url, Some(t))
        .run(&["show", "charges.v1", "order-1"])
        .expect(0);
    sqlx::raw_sql(&format!("DROP USER '{user}'@'%'"))
        .execute(&table.admin)
        .await
        .unwrap();

    let run = Cli::new("mysql://app:s3cret@127.0.0.1:1/db", None)
        .run(&["list"])
        .expect(4);
    assert!(run.stderr.contains("cannot reach the server"), "{run:#?}");
    assert!(!run.stderr.contains("s3cret"), "{run:#?}");
    table.drop_all().await;
}

/// Parked keys: listed by `idem pending`, resolved both ways, refusals (the CLI's own scenario,
/// `idem-cli/tests/common/parked.rs`).
async fn pending_lists_parked_keys_and_resolve_decides_them(url: String) {
    let table = Table::new(&url).await;
    let cli = Cli::new(&url, Some(&table.name));
    let app = table.open(&url).await;
    parked::parked_keys_are_listed_and_resolved(&app, "charges.v1", |args| {
        let run = cli.run(args);
        parked::Out {
            code: run.code,
            stdout: run.stdout,
            stderr: run.stderr,
        }
    })
    .await;
    table.drop_all().await;
}

idem_integration::server_tests! {
    MYSQL => [
        pending_lists_parked_keys_and_resolve_decides_them,
        an_operator_finds_explains_and_releases_a_stuck_key,
        a_table_never_migrated_says_run_migrate_and_migrate_creates_it,
        stats_count_and_purge_deletes_expired_records,
        connection_and_permission_errors_say_what_to_do,
    ],
}
