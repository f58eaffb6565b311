//! The `idem` tool as a process against a SQLite file: migrate, show, list, release, purge,
//! stats, JSON output, structured keys, and the exit codes of its errors.

mod common;

use common::{complete, idem, leave_stuck_claim, Cli};
use serde::Serialize;
use std::time::Duration;

struct Db {
    _dir: tempfile::TempDir,
    url: String,
}

fn db() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("keys.db").display());
    Db { _dir: dir, url }
}

#[test]
fn a_missing_database_says_run_migrate_and_migrate_creates_it_once() {
    let db = db();
    let cli = Cli::new(&db.url);
    let run = cli.run(&["show", "charges.v1", "order-1"]).expect(5);
    assert!(run.stderr.contains("idem migrate"), "{run:#?}");
    assert!(run.stderr.contains("no SQLite database file"), "{run:#?}");
    cli.run(&["list"]).expect(5);

    let run = cli.run(&["migrate"]).expect(0);
    assert!(
        run.stdout.contains("created the schema (version 3)"),
        "{run:#?}"
    );
    let run = cli.run(&["migrate"]).expect(0);
    assert!(run.stdout.contains("schema is current"), "{run:#?}");
    let doc = cli.run(&["--json", "migrate"]).expect(0).json();
    assert_eq!(doc["changed"], false);
    assert_eq!(doc["to"], 3);

    // A database file that exists but has no idem table is "not migrated" too.
    let other = cli.run(&["--table", "other_keys", "stats"]).expect(5);
    assert!(other.stderr.contains("`other_keys`"), "{other:#?}");
    assert!(other.stderr.contains("idem migrate"), "{other:#?}");
}

#[test]
fn usage_errors_exit_2_and_say_what_to_pass() {
    let mem = Cli::new("sqlite::memory:");
    let run = idem(&["list"]).expect(2);
    assert!(run.stderr.contains("--url"), "{run:#?}");
    let run = idem(&["--url", "mongodb://127.0.0.1/x", "list"]).expect(2);
    assert!(
        run.stderr
            .contains("unsupported store URL scheme `mongodb`"),
        "{run:#?}"
    );
    let run = mem.run(&["show", "--digest", "abc"]).expect(2);
    assert!(run.stderr.contains("64 hex digits"), "{run:#?}");
    // clap's own usage errors use the same code.
    mem.run(&["show"]).expect(2);
    mem.run(&["purge"]).expect(2);
    mem.run(&["list", "--older-than", "10 minutes"]).expect(2);
    let run = mem.run(&["show", "n", "--json-key", r#"{"a":null}"#]);
    let run = run.expect(2);
    assert!(run.stderr.contains("null"), "{run:#?}");
    let run = mem.run(&["--json", "list", "--limit", "x"]).expect(2);
    assert_eq!(run.json()["error"]["kind"], "usage", "{run:#?}");
    assert!(run.stderr.contains("--limit"), "{run:#?}");
}

#[test]
fn the_help_documents_the_exit_codes() {
    let run = idem(&["--help"]).expect(0);
    for line in [
        "0  done",
        "1  not found",
        "2  usage",
        "3  refused",
        "4  store error",
        "5  schema missing",
    ] {
        assert!(
            run.stdout.contains(line),
            "{line} missing from:\n{}",
            run.stdout
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_list_release_purge_and_stats_on_a_file() {
    let db = db();
    let cli = Cli::new(&db.url);
    cli.run(&["migrate"]).expect(0);
    let store = idem::Idem::sqlite(&db.url).await.unwrap();
    leave_stuck_claim(&store, "charges.v1", "order-1234").await;
    complete(
        &store,
        "charges.v1",
        "order-1",
        7,
        Duration::from_secs(3600),
    )
    .await;
    complete(
        &store,
        "emails.v1",
        "welcome-9",
        1,
        Duration::from_secs(3600),
    )
    .await;
    // Two results that expire at once: stored, no longer live, waiting for a purge.
    complete(&store, "emails.v1", "gone-1", 1, Duration::from_millis(1)).await;
    complete(&store, "emails.v1", "gone-2", 1, Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    // list: live records only, filters compose, oldest claim first.
    let all = cli.run(&["--json", "list"]).expect(0).json();
    assert_eq!(all.as_array().unwrap().len(), 3, "{all:#}");
    assert_eq!(all[0]["status"], "in-progress");
    let stuck = cli.run(&["list", "--status", "in-progress"]).expect(0);
    let digest = idem::testkit::digest("charges.v1", "order-1234").to_hex();
    assert!(stuck.stdout.contains(&digest), "{stuck:#?}");
    assert!(stuck.stdout.starts_with("NAME"), "{stuck:#?}");
    assert_eq!(stuck.stdout.lines().count(), 2, "{stuck:#?}");
    let emails = cli
        .run(&["--json", "list", "--name", "emails.v1"])
        .expect(0);
    let emails = emails.json();
    assert_eq!(emails.as_array().unwrap().len(), 1);
    assert_eq!(emails[0]["value_size"].as_u64().unwrap(), 3, "b\"\\x01o1\"");
    let old = cli.run(&["--json", "list", "--older-than", "1h"]).expect(0);
    assert_eq!(old.json().as_array().unwrap().len(), 0);
    let limited = cli.run(&["list", "--limit", "1"]).expect(0);
    assert!(limited.stdout.contains("raise --limit"), "{limited:#?}");

    // show, by name and key or by digest.
    let show = cli.run(&["show", "charges.v1", "order-1234"]).expect(0);
    assert!(show.stdout.contains("in-progress"), "{show:#?}");
    assert!(show.stdout.contains("lease left   59m"), "{show:#?}");
    let by_digest = cli.run(&["--json", "show", "--digest", &digest]).expect(0);
    let by_digest = by_digest.json();
    assert_eq!(by_digest["name"], "charges.v1");
    assert!(by_digest["lease_left_ms"].as_i64().unwrap() > 3_500_000);
    assert!(by_digest["ttl_left_ms"].is_null());
    let done = cli.run(&["--json", "show", "charges.v1", "order-1", "--value"]);
    let done = done.expect(0).json();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["value"]["ok"], 7);
    assert_eq!(done["value_size"], 3);
    let text = cli
        .run(&["show", "charges.v1", "order-1", "--value"])
        .expect(0);
    assert!(text.stdout.contains("Ok(7)"), "{text:#?}");
    let missing = cli
        .run(&["--json", "show", "charges.v1", "order-2"])
        .expect(1);
    assert_eq!(missing.json()["error"]["kind"], "not-found");

    // stats: counts by name and state, expired ones included.
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["in_progress"], 1, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 2, "{stats:#}");
    assert_eq!(stats["total"]["expired"], 2, "{stats:#}");
    let table = cli.run(&["stats"]).expect(0);
    assert!(table.stdout.contains("emails.v1"), "{table:#?}");

    // release: a completed result is refused without --force, and the refusal says why.
    let refused = cli.run(&["release", "charges.v1", "order-1"]).expect(3);
    assert!(
        refused.stderr.contains("runs the body again"),
        "{refused:#?}"
    );
    let forced = cli.run(&["release", "--force", "charges.v1", "order-1"]);
    let forced = forced.expect(0);
    assert!(
        forced.stdout.contains("ended the completed result"),
        "{forced:#?}"
    );
    cli.run(&["release", "--force", "charges.v1", "order-1"])
        .expect(1);
    complete(&store, "charges.v1", "order-1", 8, Duration::from_secs(60)).await;

    // purge: deletes the two expired records, in batches of one.
    let purge = cli.run(&["purge", "--expired", "--batch", "1"]).expect(0);
    assert!(
        purge.stdout.contains("purged 2 expired records"),
        "{purge:#?}"
    );
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["expired"], 0, "{stats:#}");
    let purge = cli.run(&["--json", "purge", "--expired"]).expect(0);
    assert_eq!(purge.json()["purged"], 0);
}

#[derive(Serialize)]
struct Order {
    id: u64,
    customer: String,
    lines: Vec<u32>,
    meta: Meta,
}

#[derive(Serialize)]
struct Meta {
    vip: bool,
    region: &'static str,
}

#[derive(Serialize)]
struct OrderId(u64);

/// `--json-key` finds keys that calls made with typed Rust values: structs (any field order),
/// newtypes, integers, tuples; and `--scope` finds scoped keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_keys_give_the_digest_of_the_typed_key() {
    let db = db();
    let cli = Cli::new(&db.url);
    let store = idem::Idem::sqlite(&db.url).await.unwrap();
    let order = Order {
        id: 1234,
        customer: "c-9".into(),
        lines: vec![1, 2],
        meta: Meta {
            vip: true,
            region: "eu",
        },
    };
    let put = |name: &'static str| store.call(name).ttl(Duration::from_secs(600));
    put("orders.v1")
        .key(&order)
        .run(async { Ok::<_, idem::Error>(1u8) })
        .await
        .unwrap();
    put("ids.v1")
        .key(&OrderId(77))
        .run(async { Ok::<_, idem::Error>(2u8) })
        .await
        .unwrap();
    put("invoices.v1")
        .key(&(17u32, "2026-11"))
        .run(async { Ok::<_, idem::Error>(3u8) })
        .await
        .unwrap();
    put("charges.v1")
        .key("order-5")
        .scope("tenant-7")
        .run(async { Ok::<_, idem::Error>(4u8) })
        .await
        .unwrap();

    let json_key =
        r#"{"meta":{"region":"eu","vip":true},"lines":[1,2],"customer":"c-9","id":1234}"#;
    let found = [
        ("orders.v1", json_key, "1"),
        ("ids.v1", "77", "2"),
        ("invoices.v1", r#"[17,"2026-11"]"#, "3"),
    ];
    for (name, key, value) in found {
        let run = cli.run(&["--json", "show", name, "--json-key", key, "--value"]);
        let doc = run.expect(0).json();
        assert_eq!(doc["value"]["ok"].to_string(), value, "{name} {key}");
    }
    // The string "77" is another key than the number 77.
    cli.run(&["show", "ids.v1", "77"]).expect(1);
    // Scoped: found with the scope, not without.
    cli.run(&["show", "charges.v1", "order-5", "--scope", "tenant-7"])
        .expect(0);
    let run = cli.run(&["show", "charges.v1", "order-5"]).expect(1);
    assert!(run.stderr.contains("--scope"), "{run:#?}");
    cli.run(&[
        "show",
        "charges.v1",
        "order-5",
        "--json-scope",
        r#""tenant-7""#,
    ])
    .expect(0);
}

/// `idem show NAME --digest HEX` (the README's form) with the digest an application logged from
/// `idem::current_key()`: the record is found and NAME is checked against its namespace, also
/// by `release`; a digest that is not 64 hex digits is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_release_by_name_and_digest() {
    let db = db();
    let cli = Cli::new(&db.url);
    let store = idem::Idem::sqlite(&db.url).await.unwrap();
    let logged = store
        .call("refunds.v1")
        .key("refund-88")
        .ttl(Duration::from_secs(3600))
        .run(async { Ok::<_, idem::Error>(idem::current_key().expect("inside a call")) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        logged,
        idem::testkit::digest("refunds.v1", "refund-88").to_hex()
    );

    let show = cli
        .run(&["show", "refunds.v1", "--digest", &logged, "--value"])
        .expect(0);
    assert!(show.stdout.contains("name         refunds.v1"), "{show:#?}");
    assert!(
        show.stdout.contains(&format!("digest       {logged}")),
        "{show:#?}"
    );
    assert!(show.stdout.contains("status       completed"), "{show:#?}");
    assert!(
        show.stdout.contains(&format!("Ok(\"{logged}\")")),
        "{show:#?}"
    );
    let doc = cli
        .run(&["--json", "show", "refunds.v1", "--digest", &logged])
        .expect(0)
        .json();
    assert_eq!(doc["name"], "refunds.v1");
    assert_eq!(doc["digest"], logged.as_str());
    // The digest's own case and surrounding blanks do not matter.
    let upper = format!(" {} ", logged.to_uppercase());
    cli.run(&["show", "refunds.v1", "--digest", &upper])
        .expect(0);

    // NAME is checked: the record with that digest is in another namespace.
    let other = cli
        .run(&["show", "charges.v1", "--digest", &logged])
        .expect(1);
    assert!(
        other.stderr.contains("namespace `refunds.v1`"),
        "{other:#?}"
    );
    let other = cli
        .run(&["release", "--force", "charges.v1", "--digest", &logged])
        .expect(1);
    assert!(other.stderr.contains("Nothing was changed"), "{other:#?}");
    cli.run(&["show", "--digest", &logged]).expect(0);

    // Bad digests: a usage error that says what a digest looks like, before any store is opened.
    for bad in [
        "abc",
        "zz",
        &logged[..63],
        &format!("{logged}0"),
        &"g".repeat(64),
    ] {
        let run = cli.run(&["show", "refunds.v1", "--digest", bad]).expect(2);
        assert!(run.stderr.contains("64 hex digits"), "{bad}: {run:#?}");
        let run = cli
            .run(&["--json", "show", "refunds.v1", "--digest", bad])
            .expect(2);
        assert_eq!(run.json()["error"]["kind"], "usage", "{run:#?}");
    }
    // --digest names the key: a KEY or a scope beside it is refused.
    cli.run(&["show", "refunds.v1", "refund-88", "--digest", &logged])
        .expect(2);
    cli.run(&["show", "refunds.v1", "--digest", &logged, "--scope", "s"])
        .expect(2);

    // release by NAME and digest: refused while live, then forced.
    let refused = cli
        .run(&["release", "refunds.v1", "--digest", &logged])
        .expect(3);
    assert!(refused.stderr.contains("completed"), "{refused:#?}");
    let forced = cli
        .run(&["release", "--force", "refunds.v1", "--digest", &logged])
        .expect(0);
    assert!(
        forced.stdout.contains("ended the completed result"),
        "{forced:#?}"
    );
    cli.run(&["show", "refunds.v1", "--digest", &logged])
        .expect(1);
}

/// `show --value` of an encrypted result: "encrypted" (with its key id) without the keyring,
/// the value with `--keyring`; a bad keyring is a usage error.
#[test]
fn show_value_decrypts_with_the_keyring() {
    let db = db();
    let key = "42".repeat(32);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ring = idem::Keyring::parse(&format!("k1:{key}")).unwrap();
        let idem = idem::Idem::sqlite(&db.url)
            .await
            .unwrap()
            .with_encryption(ring);
        complete(
            &idem,
            "charges.v1",
            "order-9",
            4242,
            Duration::from_secs(3600),
        )
        .await;
    });
    let cli = Cli::new(&db.url);
    let sealed = cli
        .run(&["show", "charges.v1", "order-9", "--value"])
        .expect(0);
    assert!(sealed.stdout.contains("encrypted"), "{sealed:#?}");
    assert!(sealed.stdout.contains("`k1`"), "{sealed:#?}");
    assert!(!sealed.stdout.contains("4242"), "{sealed:#?}");
    let doc = cli
        .run(&["--json", "show", "charges.v1", "order-9", "--value"])
        .expect(0)
        .json();
    assert!(doc["value"]["encrypted"].is_string(), "{doc:#}");
    let ring = format!("k1:{key}");
    let open = cli
        .run(&[
            "--json",
            "show",
            "charges.v1",
            "order-9",
            "--value",
            "--keyring",
            &ring,
        ])
        .expect(0)
        .json();
    assert_eq!(open["value"]["ok"], 4242);
    let wrong = format!("k1:{}", "00".repeat(32));
    let text = cli
        .run(&[
            "show",
            "charges.v1",
            "order-9",
            "--value",
            "--keyring",
            &wrong,
        ])
        .expect(0);
    assert!(text.stdout.contains("does not decrypt"), "{text:#?}");
    cli.run(&[
        "show",
        "charges.v1",
        "order-9",
        "--value",
        "--keyring",
        "k1:zz",
    ])
    .expect(2);
}

/// A store written with keyed digests: KEY finds its record only under `--digest-secret` (or
/// `IDEM_DIGEST_SECRET`), as the application's calls do; a secret that is not hex, or too short,
/// is a usage error.
#[test]
fn keys_of_a_store_with_keyed_digests_need_the_secret() {
    let db = db();
    let secret = "5a".repeat(32);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let idem = idem::Idem::sqlite(&db.url)
            .await
            .unwrap()
            .with_digest_secret(idem::key::DigestSecret::from_hex(&secret).unwrap());
        complete(
            &idem,
            "charges.v1",
            "order-7",
            77,
            Duration::from_secs(3600),
        )
        .await;
    });
    let cli = Cli::new(&db.url);
    let unkeyed = cli.run(&["show", "charges.v1", "order-7"]).expect(1);
    assert!(unkeyed.stderr.contains("no live record"), "{unkeyed:#?}");
    let keyed = cli
        .run(&[
            "--json",
            "show",
            "charges.v1",
            "order-7",
            "--value",
            "--digest-secret",
            &secret,
        ])
        .expect(0)
        .json();
    assert_eq!(keyed["status"], "completed", "{keyed:#}");
    assert_eq!(keyed["value"]["ok"], 77, "{keyed:#}");
    let other = "a5".repeat(32);
    cli.run(&["show", "charges.v1", "order-7", "--digest-secret", &other])
        .expect(1);
    let bad = cli
        .run(&["show", "charges.v1", "order-7", "--digest-secret", "xyz"])
        .expect(2);
    assert!(bad.stderr.contains("--digest-secret"), "{bad:#?}");
    cli.run(&["show", "charges.v1", "order-7", "--digest-secret", "abcd"])
        .expect(2);
}

/// Parked keys: `idem pending` lists the keys parked by real calls, `idem resolve` decides them
/// both ways, and refuses a key that is not parked (see `common::parked`).
#[test]
fn pending_lists_parked_keys_and_resolve_decides_them() {
    let db = db();
    let cli = Cli::new(&db.url);
    cli.run(&["migrate"]).expect(0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let app = idem::Idem::sqlite(&db.url).await.unwrap();
        common::parked::parked_keys_are_listed_and_resolved(&app, "charges.v1", |args| {
            common::out(cli.run(args))
        })
        .await;
    });
}

/// Tombstones (`tombstone = …`): counted apart by `stats`, listed by `list --tombstones` (and
/// not by `list`), kept by `purge`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_list_show_tombstones_and_purge_keeps_them() {
    let db = db();
    let cli = Cli::new(&db.url);
    cli.run(&["migrate"]).expect(0);
    let store = idem::Idem::sqlite(&db.url).await.unwrap();
    for (key, tombstone) in [("paid-1", 3600), ("paid-2", 0)] {
        store
            .call("charges.v1")
            .key(key)
            .ttl(Duration::from_millis(1))
            .tombstone(Duration::from_secs(tombstone))
            .run(async { Ok::<_, idem::Error>(1u8) })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["tombstones"], 1, "{stats:#}");
    assert_eq!(stats["total"]["expired"], 1, "{stats:#}");
    let table = cli.run(&["stats"]).expect(0);
    assert!(table.stdout.contains("TOMBSTONES"), "{table:#?}");
    let live = cli.run(&["--json", "list"]).expect(0).json();
    assert_eq!(live.as_array().unwrap().len(), 0, "{live:#}");
    let tombs = cli
        .run(&["--json", "list", "--tombstones"])
        .expect(0)
        .json();
    assert_eq!(tombs.as_array().unwrap().len(), 1, "{tombs:#}");
    let digest = idem::testkit::digest("charges.v1", "paid-1").to_hex();
    assert_eq!(tombs[0]["digest"], digest.as_str(), "{tombs:#}");
    assert!(tombs[0]["kept_until"].is_string(), "{tombs:#}");
    let purge = cli.run(&["--json", "purge", "--expired"]).expect(0);
    assert_eq!(
        purge.json()["purged"],
        1,
        "only the record without a tombstone"
    );
    let stats = cli.run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["tombstones"], 1, "{stats:#}");
}
