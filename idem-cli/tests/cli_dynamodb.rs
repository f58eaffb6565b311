//! The `idem` tool as a process against DynamoDB Local (`IDEM_TEST_DYNAMODB_URL`): migrate,
//! list, show, stats, release and purge on `dynamodb://TABLE?region=…&endpoint=…`, in a table of
//! this test's own, with the AWS credentials in the tool's environment.

mod common;

use common::{complete, leave_stuck_claim, unique, Cli};
use std::time::Duration;

async fn list_show_release_stats_and_purge_on_dynamodb(url: String) {
    let table = unique("idemcli");
    let store_url = format!("dynamodb://{table}?region=us-east-1&endpoint={url}");
    let cli = Cli::new(&store_url)
        .env("AWS_ACCESS_KEY_ID", "idem")
        .env("AWS_SECRET_ACCESS_KEY", "idem");
    let run = |rest: &[&str]| cli.run(rest);

    // No table yet: opening creates nothing, and says to migrate.
    let missing = run(&["list"]).expect(5);
    assert!(missing.stderr.contains("idem migrate"), "{missing:#?}");
    let migrate = run(&["migrate"]).expect(0);
    assert!(migrate.stdout.contains("created"), "{migrate:#?}");

    let store = idem_integration::dynamodb::options(&url)
        .table(&table)
        .create_table(false)
        .connect()
        .await
        .unwrap();
    let app = idem::Idem::from_store(store);
    leave_stuck_claim(&app, "charges.v1", "order-1234").await;
    complete(&app, "charges.v1", "order-1", 3, Duration::from_secs(600)).await;
    complete(&app, "emails.v1", "welcome-1", 4, Duration::from_secs(600)).await;
    complete(&app, "emails.v1", "short", 5, Duration::from_millis(1)).await;
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

    let show = run(&["--json", "show", "charges.v1", "order-1234"])
        .expect(0)
        .json();
    assert_eq!(show["status"], "in-progress");
    let value = run(&["--json", "show", "emails.v1", "welcome-1", "--value"]).expect(0);
    assert_eq!(value.json()["value"]["ok"], 4);

    let stats = run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["in_progress"], 1, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 2, "{stats:#}");
    assert_eq!(stats["total"]["expired"], 1, "{stats:#}");

    run(&["release", "charges.v1", "order-1234"]).expect(3);
    run(&["release", "--force", "charges.v1", "order-1234"]).expect(0);
    run(&["show", "charges.v1", "order-1234"]).expect(1);

    tokio::time::sleep(Duration::from_millis(5)).await;
    let purge = run(&["--json", "purge", "--expired"]).expect(0).json();
    assert_eq!(purge["purged"], 2, "{purge:#}");
    let stats = run(&["--json", "stats"]).expect(0).json();
    assert_eq!(stats["total"]["expired"], 0, "{stats:#}");
    assert_eq!(stats["total"]["completed"], 2, "{stats:#}");
}

/// Without AWS credentials the tool says so (exit code 4, kind Authentication), not that the
/// server is down.
async fn missing_credentials_say_so(url: String) {
    let store_url = format!("dynamodb://idem_conformance?region=us-east-1&endpoint={url}");
    let out = Cli::new(&store_url)
        .env("AWS_ACCESS_KEY_ID", "")
        .env("AWS_SECRET_ACCESS_KEY", "")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent/idem-test")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/idem-test")
        .run(&["--json", "stats"])
        .expect(4)
        .json();
    let message = out["error"]["message"].as_str().unwrap();
    assert!(message.contains("AWS credentials"), "{out:#}");
}

/// Parked keys on DynamoDB (the listing filters a scan): `idem pending`, resolve both ways,
/// refusals (see `common::parked`), in a table of this test's own.
async fn pending_lists_parked_keys_and_resolve_decides_them(url: String) {
    let table = unique("idemcli");
    let store_url = format!("dynamodb://{table}?region=us-east-1&endpoint={url}");
    let cli = Cli::new(&store_url)
        .env("AWS_ACCESS_KEY_ID", "idem")
        .env("AWS_SECRET_ACCESS_KEY", "idem");
    cli.run(&["migrate"]).expect(0);
    let store = idem_integration::dynamodb::options(&url)
        .table(&table)
        .create_table(false)
        .connect()
        .await
        .unwrap();
    let app = idem::Idem::from_store(store);
    common::parked::parked_keys_are_listed_and_resolved(&app, "charges.v1", |args| {
        common::out(cli.run(args))
    })
    .await;
}

idem_integration::server_tests! {
    DYNAMODB => [
        list_show_release_stats_and_purge_on_dynamodb,
        missing_credentials_say_so,
        pending_lists_parked_keys_and_resolve_decides_them,
    ],
}
