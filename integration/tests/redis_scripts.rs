//! The Lua scripts on their own, called with raw redis-rs on a private server: the retry
//! answers that make a resent step safe, fencing, and the token rule.

mod redis_support;
use redis::{Script, Value};
use redis_support::{raw, TempRedis};

const CLAIM: &str = include_str!("../../idem-runtime/src/store/redis/claim.lua");
const COMPLETE: &str = include_str!("../../idem-runtime/src/store/redis/complete.lua");
const RELEASE: &str = include_str!("../../idem-runtime/src/store/redis/release.lua");
const RENEW: &str = include_str!("../../idem-runtime/src/store/redis/renew.lua");

fn claimed(v: &Value) -> Option<u64> {
    match v {
        Value::Array(items) if items[0] == Value::Int(1) => match &items[1] {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

async fn resent_steps_are_recognised_and_stale_tokens_refused() {
    let server = TempRedis::start(&[]);
    let mut con = raw(&server.url()).await;
    let (claim, complete) = (Script::new(CLAIM), Script::new(COMPLETE));
    let (release, renew) = (Script::new(RELEASE), Script::new(RENEW));
    let key = "idem:v1:{00}";
    let fp = [9u8; 32];
    let claim_with = |nonce: &'static [u8]| {
        let mut inv = claim.key(key);
        // name, fingerprint, lease, nonce, how long the record is kept (max(lease, ttl)).
        inv.arg("ns")
            .arg(&fp[..])
            .arg("60000")
            .arg(nonce)
            .arg("60000");
        inv
    };

    let first: Value = claim_with(b"attempt-a")
        .invoke_async(&mut con)
        .await
        .unwrap();
    let t1 = claimed(&first).expect("claimed");
    // Tokens are µs of the server clock (ms * 1000): far above 2^32, exact in a Lua double.
    assert!(t1 > 1_600_000_000_000_000 && t1 < (1 << 53), "{t1}");
    // The same attempt resending its claim (reply lost) holds the key, with the same token.
    let again: Value = claim_with(b"attempt-a")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(claimed(&again), Some(t1));
    // Another attempt sees the live record.
    let other: Value = claim_with(b"attempt-b")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(claimed(&other), None);
    let Value::Array(fields) = other else {
        panic!("{other:?}")
    };
    assert_eq!(fields[1], Value::BulkString(b"0".to_vec()), "in progress");
    assert_eq!(fields[3], Value::BulkString(fp.to_vec()), "fingerprint");
    assert_eq!(fields[4], Value::Nil, "no value yet");

    let stale = (t1 - 1).to_string();
    let t1s = t1.to_string();
    let r: i64 = renew
        .key(key)
        .arg(&stale)
        .arg("1000")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 0, "renew with a stale token");
    let r: i64 = release
        .key(key)
        .arg(&stale)
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 0, "release with a stale token");
    let r: i64 = complete
        .key(key)
        .arg(&stale)
        .arg(&b"x"[..])
        .arg("1000")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 0, "complete with a stale token");
    let r: i64 = complete
        .key(key)
        .arg(&t1s)
        .arg(&b"\0value\xff"[..])
        .arg("60000")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 1, "complete");
    // Resent after a lost reply: "already completed with this token", told apart from 0.
    let r: i64 = complete
        .key(key)
        .arg(&t1s)
        .arg(&b"\0value\xff"[..])
        .arg("60000")
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 2, "complete resent");
    let r: i64 = release
        .key(key)
        .arg(&t1s)
        .invoke_async(&mut con)
        .await
        .unwrap();
    assert_eq!(r, 0, "a completed record is not released");

    // The record's native expiry is the end of its TTL, on the server clock.
    let (pexpiretime, expires_at): (i64, i64) = redis::pipe()
        .cmd("PEXPIRETIME")
        .arg(key)
        .cmd("HGET")
        .arg(key)
        .arg("expires_at")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(pexpiretime, expires_at);
    let value: Vec<u8> = redis::cmd("HGET")
        .arg(key)
        .arg("value")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, b"\0value\xff");
}

/// A lapsed claim is taken over with a greater token, whether the old record is still there
/// (taken over at the end of its lease: previous + 1) or already expired by Redis (the clock).
async fn takeover_tokens_grow() {
    let server = TempRedis::start(&[]);
    let mut con = raw(&server.url()).await;
    let claim = Script::new(CLAIM);
    let key = "idem:v1:{01}";
    let mut last = 0;
    let mut takeovers = 0;
    let mut existing = 0;
    for i in 0..20_000u32 {
        // Lease 1 ms: live for this millisecond, then free for the next claim.
        let nonce = i.to_le_bytes();
        let v: Value = claim
            .key(key)
            .arg("ns")
            .arg(&[1u8; 32][..])
            .arg("1")
            .arg(&nonce[..])
            .arg("1")
            .invoke_async(&mut con)
            .await
            .unwrap();
        match claimed(&v) {
            Some(t) => {
                assert!(t > last, "{last} then {t}");
                last = t;
                takeovers += 1;
                if takeovers == 20 {
                    break;
                }
            }
            None => existing += 1,
        }
    }
    assert_eq!(takeovers, 20, "{existing} claims found the record live");
}

idem_integration::server_tests! {
    REDIS_SERVER => [
        resent_steps_are_recognised_and_stale_tokens_refused,
        takeover_tokens_grow,
    ],
}
