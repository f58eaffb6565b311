//! The MySQL store's statements per step, counted by the server (`Com_stmt_execute`, the
//! prepared statements it ran): what docs/mysql.md states. One test in its own binary, so no
//! other test of this process runs statements meanwhile.

mod mysql_common;

use idem::store::mysql::MysqlOptions;
use idem::store::{Claim, ClaimOutcome, Complete, Store};
use idem::testkit::{digest, fingerprint, unique};
use mysql_common::*;
use std::time::Duration;

async fn statements_per_step(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("rt");
    let store = MysqlOptions::from_url(&url)
        .unwrap()
        .table(&table)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let name = unique("rt");
    let fp = fingerprint(&"f");
    let claim = |key| Claim {
        name: &name,
        key,
        fingerprint: &fp,
        lease: Duration::from_secs(30),
        ttl: Duration::ZERO,
    };
    // Warm the connection and its statement cache (a first use prepares each statement).
    let warm = digest(&name, &"warm");
    let ClaimOutcome::Claimed { token, .. } = store.claim(claim(&warm)).await.unwrap() else {
        panic!("a new key is claimed")
    };
    store.claim(claim(&warm)).await.unwrap();
    let done = |key, token| Complete {
        key,
        token,
        value: b"v",
        ttl: Duration::from_secs(60),
        tombstone: std::time::Duration::ZERO,
    };
    assert!(store.complete(done(&warm, token)).await.unwrap());

    let executed = || global_status(&admin, "Com_stmt_execute");
    let mut counts = Vec::new();
    let key = digest(&name, &"k");
    let before = executed().await;
    let ClaimOutcome::Claimed { token, .. } = store.claim(claim(&key)).await.unwrap() else {
        panic!("a new key is claimed")
    };
    counts.push(("fresh claim", executed().await - before, 1));
    let before = executed().await;
    assert!(matches!(
        store.claim(claim(&key)).await.unwrap(),
        ClaimOutcome::Existing(_)
    ));
    counts.push(("claim of a live record", executed().await - before, 2));
    let before = executed().await;
    assert!(store.complete(done(&key, token)).await.unwrap());
    counts.push(("complete", executed().await - before, 1));
    let before = executed().await;
    assert!(store.get(&key).await.unwrap().is_some());
    counts.push(("get", executed().await - before, 1));
    eprintln!("{counts:?}");
    for (step, got, want) in counts {
        assert_eq!(got, want, "{step}");
    }
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    MYSQL => [
        statements_per_step,
    ],
}
