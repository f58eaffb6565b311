//! `idem outbox …` as a process against PostgreSQL: a table never migrated says which migration
//! to run; `migrate` creates it; with a delivered message, a dead letter and a pending one,
//! `stats`, `list` (by state), `retry` (one id, a wrong id, --all) and `purge` say and do what
//! they should. Each test works in an outbox table of its own and drops it.

mod common;
mod outbox_common;

use common::{idem, unique, Cli};
use idem::outbox::{Outbox, Relay, RelayOptions};
use idem::postgres::sqlx::{self, PgPool};
use outbox_common::{enqueue, RefusesSome};

async fn drop_tables(admin: &PgPool, t: &str) {
    for t in [t.to_string(), format!("{t}_migrations")] {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
            .execute(admin)
            .await
            .unwrap();
    }
}

async fn an_operator_lists_retries_and_purges_outbox_messages(url: String) {
    let admin = PgPool::connect(&url).await.expect("admin connection");
    let t = unique("idem_cli_outbox");
    let cli = Cli::new(&url).with("--outbox-table", &t);

    // Never migrated: exit 5, the migration named, nothing created by looking.
    for cmd in [&["outbox", "list"][..], &["outbox", "stats"]] {
        let mut args = vec!["--url", url.as_str()];
        args.extend_from_slice(cmd);
        args.extend_from_slice(&["--outbox-table", &t]);
        let run = idem(&args).expect(5);
        assert!(
            run.stderr.contains(&format!("no outbox table {t}")),
            "{run:#?}"
        );
        assert!(run.stderr.contains("outbox migration 1"), "{run:#?}");
        assert!(
            run.stderr
                .contains(&format!("idem outbox --outbox-table {t} migrate")),
            "{run:#?}"
        );
    }
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&t)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(!exists);
    let run = cli.run(&["outbox", "migrate"]).expect(0);
    assert!(run.stdout.contains("created (version 1)"), "{run:#?}");
    let run = cli.run(&["outbox", "migrate"]).expect(0);
    assert!(run.stdout.contains("schema is current"), "{run:#?}");

    // One message delivered, one dead (its publisher refuses it, max_attempts 1), and one
    // pending (enqueued after the relay's round).
    let outbox = Outbox::with_table(admin.clone(), &t).unwrap();
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
    assert!(text.contains("idem outbox retry"), "{text}");

    // list: by default pending and dead, oldest first, with the dead letter's error.
    let list = cli.run(&["outbox", "list"]).expect(0).stdout;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two messages:\n{list}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("LAST ERROR"));
    assert!(lines[1].starts_with("m-dead") && lines[1].contains("dead"));
    assert!(lines[1].contains("HTTP 503 from the consumer"), "{list}");
    assert!(lines[1].contains("order-2") && lines[1].contains("refused"));
    assert!(lines[2].starts_with("m-wait") && lines[2].contains("pending"));
    let dead = cli
        .run(&["--json", "outbox", "list", "--state", "dead"])
        .expect(0)
        .json();
    let dead = dead.as_array().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["id"], "m-dead");
    assert_eq!(dead[0]["attempts"], 1);
    assert_eq!(dead[0]["ordering_key"], "order-2");
    assert_eq!(dead[0]["last_error"], "HTTP 503 from the consumer");
    let delivered = cli
        .run(&["--json", "outbox", "list", "--state", "delivered"])
        .expect(0)
        .json();
    assert_eq!(delivered[0]["id"], "m-ok");
    assert_eq!(delivered.as_array().unwrap().len(), 1);
    let by_topic = cli
        .run(&["--json", "outbox", "list", "--topic", "order.placed"])
        .expect(0)
        .json();
    assert_eq!(by_topic.as_array().unwrap().len(), 1, "{by_topic:#}");
    assert_eq!(by_topic[0]["id"], "m-wait");

    // retry: a wrong id and a pending one are refused (exit 1, nothing changed); the dead one
    // goes back to pending with its attempts reset.
    let run = cli.run(&["outbox", "retry", "no-such-id"]).expect(1);
    assert!(
        run.stderr.contains("no message with id no-such-id"),
        "{run:#?}"
    );
    let run = cli.run(&["outbox", "retry", "m-wait"]).expect(1);
    assert!(run.stderr.contains("is pending, not dead"), "{run:#?}");
    cli.run(&["outbox", "retry"]).expect(2);
    let run = cli.run(&["outbox", "retry", "m-dead"]).expect(0);
    assert!(
        run.stdout.contains("re-queued dead letter m-dead"),
        "{run:#?}"
    );
    let stats = cli.run(&["--json", "outbox", "stats"]).expect(0).json();
    assert_eq!(
        (stats["pending"].as_u64(), stats["dead"].as_u64()),
        (Some(2), Some(0))
    );
    let retried = cli
        .run(&["--json", "outbox", "list", "--ordering-key", "order-2"])
        .expect(0)
        .json();
    assert_eq!(retried[0]["state"], "pending");
    assert_eq!(retried[0]["attempts"], 0);
    assert_eq!(retried[0]["last_error"], serde_json::Value::Null);
    let run = cli.run(&["outbox", "retry", "--all"]).expect(0);
    assert!(run.stdout.contains("no dead letters"), "{run:#?}");

    // Dead-letter it again, then --all re-queues it.
    Relay::deliver_once(&outbox, &RefusesSome, &options)
        .await
        .unwrap();
    let all = cli
        .run(&["--json", "outbox", "retry", "--all"])
        .expect(0)
        .json();
    assert_eq!(all["retried"], 1, "{all:#}");

    // purge: a retention longer than the message's age deletes nothing; 0s deletes the
    // delivered messages (m-ok and, now, m-wait), never a pending one.
    let run = cli
        .run(&["outbox", "purge", "--delivered-older-than", "1h"])
        .expect(0);
    assert!(
        run.stdout.contains("purged 0 delivered messages"),
        "{run:#?}"
    );
    let stats = cli.run(&["--json", "outbox", "stats"]).expect(0).json();
    let delivered = stats["delivered"].as_u64().unwrap();
    assert_eq!(delivered, 2, "m-ok and m-wait: {stats:#}");
    let run = cli
        .run(&["outbox", "purge", "--delivered-older-than", "0s"])
        .expect(0);
    assert!(
        run.stdout.contains("purged 2 delivered messages"),
        "{run:#?}"
    );
    let stats = cli.run(&["--json", "outbox", "stats"]).expect(0).json();
    assert_eq!(stats["delivered"], 0, "{stats:#}");
    assert_eq!(stats["pending"], 1, "m-dead, re-queued: {stats:#}");
    cli.run(&["outbox", "purge"]).expect(2);

    drop_tables(&admin, &t).await;
}

async fn the_outbox_commands_refuse_what_they_cannot_do(url: String) {
    let admin = PgPool::connect(&url).await.expect("admin connection");
    let t = unique("idem_cli_outbox");
    let cli = Cli::new(&url).with("--outbox-table", &t);
    cli.run(&["outbox", "migrate"]).expect(0);

    // Not PostgreSQL: a usage error, exit 2.
    let run = idem(&["--url", "sqlite://x.db", "outbox", "list"]).expect(2);
    assert!(
        run.stderr.contains("the outbox is on PostgreSQL"),
        "{run:#?}"
    );
    // A bad table name: a usage error.
    Cli::new(&url)
        .with("--outbox-table", "bad name;")
        .run(&["outbox", "list"])
        .expect(2);
    // A server that is not there: exit 4, no password shown; --json gives the error document.
    let run = idem(&[
        "--json",
        "--url",
        "postgres://app:s3cret@127.0.0.1:1/db",
        "outbox",
        "stats",
    ])
    .expect(4);
    assert!(run.stderr.contains("cannot reach the server"), "{run:#?}");
    assert!(!run.stderr.contains("s3cret"), "{run:#?}");
    assert_eq!(run.json()["error"]["exit_code"], 4);

    // A role without privileges: exit 4 and the GRANT to run.
    let role = unique("idem_cli_ob_ro");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&admin)
        .await
        .unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let as_role = Cli::new(&format!("{scheme}://{role}@{host}")).with("--outbox-table", &t);
    let run = as_role.run(&["outbox", "purge", "--delivered-older-than", "1d"]);
    let run = run.expect(4);
    assert!(run.stderr.contains("permission denied"), "{run:#?}");
    assert!(
        run.stderr
            .contains(&format!("GRANT SELECT, DELETE ON {t} TO {role}")),
        "{run:#?}"
    );
    drop_tables(&admin, &t).await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&admin)
        .await
        .unwrap();
}

idem_integration::server_tests! {
    POSTGRES => [
        an_operator_lists_retries_and_purges_outbox_messages,
        the_outbox_commands_refuse_what_they_cannot_do,
    ],
}
