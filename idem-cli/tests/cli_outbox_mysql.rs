//! `idem outbox …` as a process against MySQL / MariaDB (`IDEM_TEST_MYSQL_URL`), the outbox
//! chosen by the `mysql://` URL: a table never migrated says which migration to run; `migrate`
//! creates it; with a delivered message, a dead letter and a pending one, `stats` and `list`
//! (by state, topic, key) say what is there, and `retry` and `purge` do what they say. The
//! test works in an outbox table of its own and drops it.

mod common;
mod outbox_common;

use common::{idem, unique, Cli};
use idem::outbox::{Outbox, Relay, RelayOptions};
use idem::postgres::sqlx::{self, MySqlPool};
use outbox_common::{enqueue, RefusesSome};

async fn drop_tables(admin: &MySqlPool, t: &str) {
    for t in [t.to_string(), format!("{t}_migrations")] {
        sqlx::query(&format!("DROP TABLE IF EXISTS `{t}`"))
            .execute(admin)
            .await
            .unwrap();
    }
}

async fn an_operator_lists_and_counts_mysql_outbox_messages(url: String) {
    let admin = MySqlPool::connect(&url).await.expect("admin connection");
    let t = unique("idem_cli_myobx");
    let cli = Cli::new(&url).with("--outbox-table", &t);

    // Never migrated: exit 5, the migration named, nothing created by looking.
    for cmd in [&["outbox", "list"][..], &["outbox", "stats"]] {
        let run = cli.run(cmd).expect(5);
        assert!(
            run.stderr.contains(&format!("no outbox table {t}")),
            "{run:#?}"
        );
        assert!(run.stderr.contains("outbox migration 1"), "{run:#?}");
    }
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(&t)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(exists, 0);
    let run = cli.run(&["outbox", "migrate"]).expect(0);
    assert!(run.stdout.contains("created (version 1)"), "{run:#?}");
    let run = cli.run(&["outbox", "migrate"]).expect(0);
    assert!(run.stdout.contains("schema is current"), "{run:#?}");

    // One message delivered, one dead (max_attempts 1), one pending.
    let outbox = Outbox::mysql_with_table(admin.clone(), &t).unwrap();
    enqueue(&outbox, &admin, "m-ok", "order.placed", "order-1").await;
    enqueue(&outbox, &admin, "m-dead", "refused", "order-2").await;
    let options = RelayOptions::default().max_attempts(1);
    let handled = Relay::deliver_once(&outbox, &RefusesSome, &options)
        .await
        .unwrap();
    assert_eq!(handled, 2);
    enqueue(&outbox, &admin, "m-wait", "order.placed", "order-3").await;

    let stats = cli.run(&["--json", "outbox", "stats"]).expect(0).json();
    assert_eq!(stats["pending"], 1, "{stats:#}");
    assert_eq!(stats["dead"], 1, "{stats:#}");
    assert_eq!(stats["delivered"], 1, "{stats:#}");
    let oldest = stats["oldest_pending_ms"].as_u64().expect("a pending age");
    assert!(oldest < 60_000, "{stats:#}");
    let text = cli.run(&["outbox", "stats"]).expect(0).stdout;
    assert!(
        text.contains("pending     1 (the oldest waiting for"),
        "{text}"
    );
    assert!(text.contains("dead        1"), "{text}");

    // list: by default pending and dead, oldest first, with the dead letter's error.
    let list = cli.run(&["outbox", "list"]).expect(0).stdout;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two messages:\n{list}");
    assert!(lines[1].starts_with("m-dead") && lines[1].contains("dead"));
    assert!(lines[1].contains("HTTP 503 from the consumer"), "{list}");
    assert!(lines[2].starts_with("m-wait") && lines[2].contains("pending"));
    let dead = cli
        .run(&["--json", "outbox", "list", "--state", "dead"])
        .expect(0)
        .json();
    assert_eq!(dead.as_array().unwrap().len(), 1, "{dead:#}");
    assert_eq!(dead[0]["id"], "m-dead");
    assert_eq!(dead[0]["attempts"], 1);
    assert_eq!(dead[0]["ordering_key"], "order-2");
    assert_eq!(dead[0]["last_error"], "HTTP 503 from the consumer");
    assert_eq!(dead[0]["payload_len"], 2);
    let delivered = cli
        .run(&["--json", "outbox", "list", "--state", "delivered"])
        .expect(0)
        .json();
    assert_eq!(delivered.as_array().unwrap().len(), 1, "{delivered:#}");
    assert_eq!(delivered[0]["id"], "m-ok");
    let by_topic = cli
        .run(&["--json", "outbox", "list", "--topic", "order.placed"])
        .expect(0)
        .json();
    assert_eq!(by_topic.as_array().unwrap().len(), 1, "{by_topic:#}");
    assert_eq!(by_topic[0]["id"], "m-wait");
    let by_key = cli
        .run(&["--json", "outbox", "list", "--ordering-key", "order-2"])
        .expect(0)
        .json();
    assert_eq!(by_key[0]["id"], "m-dead", "{by_key:#}");

    // retry and purge on MySQL too.
    let run = cli.run(&["outbox", "retry", "m-wait"]).expect(1);
    assert!(run.stderr.contains("is pending, not dead"), "{run:#?}");
    cli.run(&["outbox", "retry", "m-dead"]).expect(0);
    let stats = cli.run(&["--json", "outbox", "stats"]).expect(0).json();
    assert_eq!(
        (stats["pending"].as_u64(), stats["dead"].as_u64()),
        (Some(2), Some(0))
    );
    let run = cli
        .run(&["outbox", "purge", "--delivered-older-than", "0s"])
        .expect(0);
    assert!(
        run.stdout.contains("purged 1 delivered messages"),
        "{run:#?}"
    );

    // A MySQL server that is not there: exit 4, no password shown.
    let run = idem(&[
        "--url",
        "mysql://app:s3cret@127.0.0.1:1/db",
        "outbox",
        "stats",
    ])
    .expect(4);
    assert!(!run.stderr.contains("s3cret"), "{run:#?}");

    drop_tables(&admin, &t).await;
}

idem_integration::server_tests! {
    MYSQL => [
        an_operator_lists_and_counts_mysql_outbox_messages,
    ],
}
