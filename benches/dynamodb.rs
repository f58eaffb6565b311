//! Calls per second of the DynamoDB store at concurrency 1, 16 and 64, fresh and replay, on the
//! same emulator as the raw SDK making the same requests (`raw`: a conditional `PutItem` claim,
//! then for a fresh call a conditional `UpdateItem` completion; for a replay the claim's failed
//! write returning the item) and the least DynamoDB can do for the job without fencing or
//! fingerprints (`raw_minimal`: one `PutItem` of the result for a fresh call, one strongly
//! consistent `GetItem` for a replay).
//!
//! `IDEM_TEST_DYNAMODB_URL` names the endpoint (DynamoDB Local: `.ci/dynamodb-local start DIR`);
//! without it the bench does nothing. Every side uses one SDK client built the same way (the
//! store's). The bench's table is its own and is deleted at the end.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use criterion::{criterion_group, criterion_main, Criterion};
use idem::store::dynamodb::DynamoDbOptions;
use idem::Idem;
use std::sync::Arc;

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "support/sql.rs"]
mod sql;
use sql::{idem_call, key_number, raw_key, Mode, REPLAY_KEYS};

const TABLE: &str = "idem_bench_dynamodb";
/// What each group compares, idem first: see the module docs.
const VARIANTS: [&str; 3] = ["idem", "raw", "raw_minimal"];

struct Setup {
    idem: Idem,
    client: Client,
}

fn b(bytes: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(bytes))
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The store's requests, written out: a claim conditional on the key being new (its failure
/// returning the item), then a completion conditional on the token.
async fn raw(s: &Setup, mode: Mode, i: u64) {
    let k = key_number(mode, i);
    let key = raw_key(k);
    let claimed = s
        .client
        .put_item()
        .table_name(TABLE)
        .item("pk", b(&key))
        .item("name", AttributeValue::S("bench".into()))
        .item("fingerprint", b(&key))
        .item("token", n(1))
        .item("status", n(0))
        .item("created_at", n(0))
        .item("expires_at", n(9_000_000_000_000i64))
        .item("ttl", n(9_000_000_000i64))
        .condition_expression("attribute_not_exists(#pk)")
        .expression_attribute_names("#pk", "pk")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    match claimed {
        Ok(_) => {
            s.client
                .update_item()
                .table_name(TABLE)
                .key("pk", b(&key))
                .update_expression("SET #s = :done, #v = :v, #z = :z, #e = :exp, #ttl = :ttl")
                .condition_expression("#t = :t AND #s = :running AND #e > :now")
                .expression_attribute_names("#s", "status")
                .expression_attribute_names("#v", "value")
                .expression_attribute_names("#z", "value_size")
                .expression_attribute_names("#e", "expires_at")
                .expression_attribute_names("#ttl", "ttl")
                .expression_attribute_names("#t", "token")
                .expression_attribute_values(":done", n(1))
                .expression_attribute_values(":v", b(&k.to_be_bytes()))
                .expression_attribute_values(":z", n(8))
                .expression_attribute_values(":exp", n(9_000_000_000_000i64))
                .expression_attribute_values(":ttl", n(9_000_000_000i64))
                .expression_attribute_values(":t", n(1))
                .expression_attribute_values(":running", n(0))
                .expression_attribute_values(":now", n(1))
                .send()
                .await
                .unwrap();
        }
        Err(e) => {
            let item = e
                .as_service_error()
                .and_then(|s| match s {
                    aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => c.item().cloned(),
                    _ => None,
                });
            debug_assert!(item.is_some(), "{e:?}");
        }
    }
}

async fn raw_minimal(s: &Setup, mode: Mode, i: u64) {
    match mode {
        Mode::Fresh => {
            let k = key_number(Mode::Fresh, i);
            s.client
                .put_item()
                .table_name(TABLE)
                .item("pk", b(&raw_key(k)))
                .item("value", b(&k.to_be_bytes()))
                .send()
                .await
                .unwrap();
        }
        Mode::Replay => {
            let key = raw_key(key_number(Mode::Replay, i));
            let out = s
                .client
                .get_item()
                .table_name(TABLE)
                .key("pk", b(&key))
                .consistent_read(true)
                .send()
                .await
                .unwrap();
            debug_assert!(out.item().is_some());
        }
    }
}

fn bench(c: &mut Criterion) {
    let Ok(url) = std::env::var("IDEM_TEST_DYNAMODB_URL") else {
        eprintln!("skipped: the dynamodb bench needs IDEM_TEST_DYNAMODB_URL");
        return;
    };
    let rt = drive::runtime();
    let setup = rt.block_on(async {
        let options = DynamoDbOptions::new()
            .endpoint(&url)
            .region("us-east-1")
            .credentials("idem", "idem")
            .table(TABLE);
        let client = options.client().await.unwrap();
        // A table of the bench's alone, new for each run.
        let _ = client.delete_table().table_name(TABLE).send().await;
        let store = idem::store::dynamodb::DynamoDbStore::from_client(client.clone(), options)
            .await
            .unwrap();
        let setup = Setup {
            idem: Idem::from_store(store),
            client,
        };
        // The keys replays read: stored by idem, and the same keys' raw twins.
        for k in 0..REPLAY_KEYS {
            setup
                .idem
                .call("bench")
                .key(&k)
                .run(async move { Ok::<_, idem::Error>(k) })
                .await
                .unwrap();
            raw(&setup, Mode::Replay, k).await;
        }
        Arc::new(setup)
    });

    // Replays first, then fresh calls (see support/sql.rs).
    sql::compare(
        c,
        &rt,
        "dynamodb",
        "DynamoDB Local",
        VARIANTS,
        |mode, variant| op(&setup, mode, variant),
    );

    rt.block_on(async {
        let _ = setup.client.delete_table().table_name(TABLE).send().await;
    });
}

/// One call of `variant` (`idem`, `raw` or `raw_minimal`).
fn op(setup: &Arc<Setup>, mode: Mode, variant: &'static str) -> paired::Op {
    let setup = setup.clone();
    Arc::new(move |i| {
        let s = setup.clone();
        Box::pin(async move {
            match variant {
                "idem" => idem_call(&s.idem, mode, i).await,
                "raw" => raw(&s, mode, i).await,
                _ => raw_minimal(&s, mode, i).await,
            }
        })
    })
}

criterion_group!(benches, bench);
criterion_main!(benches);
