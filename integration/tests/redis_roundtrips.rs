//! Round trips per call, counted by the server (`INFO commandstats` deltas) on a private
//! redis-server where nothing else runs: a fresh call is 2 (claim, complete), a replay is 1.

mod redis_support;
use redis_support::{commandstats, raw, TempRedis};
use std::collections::HashMap;

/// Commands that only run inside idem's scripts, never sent by a client.
const INSIDE_SCRIPTS: &[&str] = &["time", "hmget", "hset", "del", "pexpireat", "publish"];

/// Client requests since `before`, not counting the counting itself (INFO).
fn requests(before: &[(String, u64)], after: &[(String, u64)]) -> HashMap<String, u64> {
    delta(before, after, |name| {
        name != "info" && !INSIDE_SCRIPTS.contains(&name)
    })
}

/// Commands idem's scripts ran since `before`.
fn inside_scripts(before: &[(String, u64)], after: &[(String, u64)]) -> HashMap<String, u64> {
    delta(before, after, |name| INSIDE_SCRIPTS.contains(&name))
}

fn delta(
    before: &[(String, u64)],
    after: &[(String, u64)],
    counted: impl Fn(&str) -> bool,
) -> HashMap<String, u64> {
    let before: HashMap<_, _> = before.iter().cloned().collect();
    after
        .iter()
        .filter(|(name, _)| counted(name))
        .filter_map(|(name, calls)| {
            let d = calls - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

async fn fresh_call_is_two_round_trips_and_replay_one() {
    let server = TempRedis::start(&[]);
    let idem = idem::Idem::redis(&server.url()).await.unwrap();
    let mut probe = raw(&server.url()).await;
    let call = || {
        idem.call("roundtrips")
            .key("order-1")
            .run(async { Ok::<_, idem::Error>(vec![1u8, 2, 3]) })
    };

    let s0 = commandstats(&mut probe).await;
    assert!(!call().await.unwrap().is_replayed());
    let s1 = commandstats(&mut probe).await;
    let fresh = requests(&s0, &s1);
    assert_eq!(
        fresh,
        HashMap::from([("evalsha".to_string(), 2)]),
        "a fresh call: {fresh:?}"
    );
    // Nobody waited, so the completion published nothing.
    let inner = inside_scripts(&s0, &s1);
    assert_eq!(
        inner.get("publish"),
        None,
        "a fresh call's scripts ran: {inner:?}"
    );

    assert!(call().await.unwrap().is_replayed());
    let s2 = commandstats(&mut probe).await;
    let replay = requests(&s1, &s2);
    assert_eq!(
        replay,
        HashMap::from([("evalsha".to_string(), 1)]),
        "a replay: {replay:?}"
    );
    // Inside the script, a replay is one read: no TIME, no write (each `redis.call` costs about
    // as much as the read).
    let inner = inside_scripts(&s1, &s2);
    assert_eq!(
        inner,
        HashMap::from([("hmget".to_string(), 1)]),
        "a replay's script ran: {inner:?}"
    );
}

/// After `SCRIPT FLUSH` (or a restart), `EVALSHA` fails with NOSCRIPT once per script, the
/// script is loaded again, and the call still succeeds.
async fn scripts_are_reloaded_after_script_flush() {
    let server = TempRedis::start(&[]);
    let idem = idem::Idem::redis(&server.url()).await.unwrap();
    let mut probe = raw(&server.url()).await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut probe)
        .await
        .unwrap();
    let s0 = commandstats(&mut probe).await;
    let out = idem
        .call("flushed")
        .key("k")
        .run(async { Ok::<_, idem::Error>(1u8) })
        .await
        .unwrap();
    assert!(!out.is_replayed());
    let s1 = commandstats(&mut probe).await;
    let d = requests(&s0, &s1);
    // Two failed EVALSHA, two loads, two EVALSHA that ran.
    assert_eq!(d.get("evalsha"), Some(&4), "{d:?}");
    assert_eq!(d.get("script|load"), Some(&2), "{d:?}");
}

/// A duplicate that waits listens on pub/sub instead of polling: over a 1.5 s wait it sends a
/// handful of requests (claim, subscribe, one look after subscribing that marks the record as
/// waited for, the final read), not one every few milliseconds, and it wakes with the value
/// when the completion publishes.
async fn a_waiting_duplicate_listens_instead_of_polling() {
    let server = TempRedis::start(&[]);
    let idem = idem::Idem::redis(&server.url()).await.unwrap();
    let mut probe = raw(&server.url()).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call("listen")
                .key("k")
                .run(async move {
                    started_tx.send(()).unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                    Ok::<_, idem::Error>(5u8)
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let s0 = commandstats(&mut probe).await;
    let waited = idem
        .call("listen")
        .key("k")
        .wait(std::time::Duration::from_secs(10))
        .run(async { Ok::<_, idem::Error>(6u8) })
        .await
        .unwrap();
    assert_eq!(waited, idem::Outcome::Replayed(5));
    assert_eq!(holder.await.unwrap().unwrap(), idem::Outcome::Fresh(5));
    let s1 = commandstats(&mut probe).await;
    let d = requests(&s0, &s1);
    // The waiter: claim, a look after subscribing, a read after the wake-up; the holder:
    // complete. Polling every 25 ms would have been about 60.
    assert_eq!(d.get("evalsha"), Some(&4), "{d:?}");
    assert_eq!(d.get("subscribe"), Some(&1), "{d:?}");
    // The waiter's look marked the record, so its completion published: once.
    let inner = inside_scripts(&s0, &s1);
    assert_eq!(inner.get("publish"), Some(&1), "{inner:?}");
}

idem_integration::server_tests! {
    REDIS_SERVER => [
        fresh_call_is_two_round_trips_and_replay_one,
        scripts_are_reloaded_after_script_flush,
        a_waiting_duplicate_listens_instead_of_polling,
    ],
}
