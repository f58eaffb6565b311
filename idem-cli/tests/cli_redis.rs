//! The `idem` tool as a process against Redis: list (a SCAN of the store's key prefix), show,
//! release, stats and purge, under a key prefix of this test's own.

mod common;

use common::{complete, idem, leave_stuck_claim, unique, Cli};
use idem::store::redis::RedisOptions;
use std::time::Duration;

async fn list_show_release_stats_and_purge_on_redis(url: String) {
    let prefix = unique("idemcli");
    let store = RedisOptions::from_url(&url)
        .unwrap()
        .key_prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let app = idem::Idem::from_store(store);
    leave_stuck_claim(&app, "charges.v1", "order-1234").await;
    complete(&app, "charges.v1", "order-1", 3, Duration::from_secs(600)).await;
    complete(&app, "emails.v1", "welcome-1", 4, Duration::from_secs(600)).await;
    let cli = Cli::new(&url).with("--prefix", &prefix);
    let run = |rest: &[&str]| cli.run(rest);
    let digest = idem::testkit::digest("charges.v1", "order-1234").to_hex();

    let stuck = run(&["list", "--status", "in-progress", "--name", "charges.v1"]).expect(0);
    assert_eq!(stuck.stdout.lines().count(), 2, "{stuck:#?}");
    assert!(stuck.stdout.contains(&digest), "{stuck:#?}");
    let all = run(&["--json", "list"]).expect(0).json();
    assert_eq!(all.as_array().unwrap().len(), 3, "{all:#}");
    let completed = run(&["--json", "list", "--status", "completed"])
        .expect(0)
        .json();
    assert_eq!(completed.as_array().unwrap().len(), 2, "{completed:#}");
    assert!(completed[0]["value_size"].as_u64().unwrap() >= 3);
    // Another prefix on the same server sees none of these.
    let elsewhere = Cli::new(&url).with("--prefix", &unique("idemcli"));
    let other = elsewhere.run(&["--json", "list"]);
    assert_eq!(other.expect(0).json().as_array().unwrap().len(), 0);

    let show = run(&["--json", "show", "charges.v1", "order-1234"])
        .expect(0)
        .json();
    assert_eq!(show["status"], "in-progress");
    assert!(
        show["lease_left_ms"].as_i64().unwrap() > 3_500_000,
        "{show:#}"
    );
    let value = run(&["--json", "show", "emails.v1", "welcome-1", "--value"]).expect(0);
    assert_eq!(value.json()["value"]["ok"], 4);

    let stats = run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["in_progress"], 1, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 2, "{stats:#}");

    run(&["release", "charges.v1", "order-1234"]).expect(3);
    let forced = run(&["release", "--force", "charges.v1", "order-1234"]).expect(0);
    assert!(
        forced.stdout.contains("ended the in-progress claim"),
        "{forced:#?}"
    );
    run(&["show", "charges.v1", "order-1234"]).expect(1);

    let purge = run(&["purge", "--expired"]).expect(0);
    assert!(purge.stdout.contains("nothing to purge"), "{purge:#?}");
    let migrate = run(&["migrate"]).expect(0);
    assert!(migrate.stdout.contains("needs no schema"), "{migrate:#?}");

    // Clean up what is left under this prefix.
    for (name, key) in [("charges.v1", "order-1"), ("emails.v1", "welcome-1")] {
        let gone = app
            .store()
            .force_release(&idem::testkit::digest(name, key))
            .await
            .unwrap();
        assert!(gone.is_some());
    }
    let empty = run(&["--json", "list"]).expect(0).json();
    assert_eq!(empty.as_array().unwrap().len(), 0);

    // A server that is not there: exit 4 and a hint.
    let run = idem(&["--url", "redis://127.0.0.1:1/", "stats"]).expect(4);
    assert!(run.stderr.contains("redis"), "{run:#?}");
}

/// Parked keys on Redis (the listing filters a SCAN): `idem pending`, resolve both ways,
/// refusals (see `common::parked`). Every key it leaves has an expiry.
async fn pending_lists_parked_keys_and_resolve_decides_them(url: String) {
    let prefix = unique("idemcli");
    let store = RedisOptions::from_url(&url)
        .unwrap()
        .key_prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let app = idem::Idem::from_store(store);
    let cli = Cli::new(&url).with("--prefix", &prefix);
    common::parked::parked_keys_are_listed_and_resolved(&app, "charges.v1", |args| {
        common::out(cli.run(args))
    })
    .await;
}

idem_integration::server_tests! {
    REDIS => [
        list_show_release_stats_and_purge_on_redis,
        pending_lists_parked_keys_and_resolve_decides_them,
    ],
}
