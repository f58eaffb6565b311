//! Decoding a stored record from a store's raw form, and its value into the caller's type: never
//! panics. Invariants:
//!
//! - stored bytes that do not decode into the caller's `Result<T, E>` are `Error::Codec`;
//! - a decode that succeeds round-trips: encoding what it gave and decoding that gives it again;
//! - a typed result that encodes decodes back to itself (one with a NaN or an infinity, which
//!   JSON cannot hold, is refused by the encoder: a codec error of kind `Encode`);
//! - a Redis script reply that is not a record is `Error::Store` (corrupt), and one that is
//!   keeps every field it was given (`now`, when absent for a completed record, inside the
//!   record's life); the engine's decision on it, and the replay of its value, do not panic;
//! - a SQL `status` column decodes only from 0 and 1, a token survives its `BIGINT` column
//!   (`u64` as `i64` and back), and a fingerprint column decodes only from 32 bytes.
#![no_main]

use arbitrary::Arbitrary;
use idem_runtime::key::Digest;
use idem_runtime::protocol::{decide_existing, Decision};
use idem_runtime::store::Status;
use idem_runtime::testkit::{decode_stored, encode_stored, parse_record_reply, status_from_column};
use idem_runtime::{CodecErrorKind, Error, StoreErrorKind};
use libfuzzer_sys::fuzz_target;
use redis::Value;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// A caller's type with the shapes serde treats differently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Arbitrary)]
struct Order {
    id: u64,
    note: Option<String>,
    lines: Vec<Line>,
    state: State,
    #[serde(default)]
    tags: Vec<(String, i32)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Arbitrary)]
struct Line {
    sku: String,
    qty: u32,
    price: i64,
    weight: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Arbitrary)]
enum State {
    Open,
    Paid(u64),
    Shipped { carrier: String, at: Option<i64> },
    Cancelled(String, bool),
}

/// An error a call keeps (`on_error = keep`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Arbitrary)]
enum Failure {
    Declined { code: u16, reason: String },
    Fraud,
    Other(String),
}

/// One field of a script's reply, as redis-rs hands it over.
#[derive(Debug, Clone, Arbitrary)]
enum Field {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Simple(String),
    Okay,
    Double(f64),
    Boolean(bool),
    Array(Vec<Vec<u8>>),
}

impl Field {
    fn value(&self) -> Value {
        match self {
            Field::Nil => Value::Nil,
            Field::Int(i) => Value::Int(*i),
            Field::Bulk(b) => Value::BulkString(b.clone()),
            Field::Simple(s) => Value::SimpleString(s.clone()),
            Field::Okay => Value::Okay,
            Field::Double(d) => Value::Double(*d),
            Field::Boolean(b) => Value::Boolean(*b),
            Field::Array(items) => {
                Value::Array(items.iter().cloned().map(Value::BulkString).collect())
            }
        }
    }
}

/// The fields of a record as the `get` and `claim` scripts reply them.
#[derive(Debug, Clone, Arbitrary)]
struct Reply {
    completed: bool,
    token: u64,
    fingerprint: [u8; 32],
    value: Option<Vec<u8>>,
    name: String,
    created_at: i64,
    expires_at: i64,
    /// `None`: a claim's reply for a completed record (no `TIME`).
    now: Option<i64>,
    /// Numbers as integers instead of decimal strings.
    ints: bool,
    /// Replace one field (`index % 8`) with an arbitrary one.
    replace: Option<(u8, Field)>,
}

#[derive(Debug, Arbitrary)]
enum Input {
    /// A store's raw value bytes.
    Stored(Vec<u8>),
    /// The format and kind header, then arbitrary JSON text.
    Framed {
        ok: bool,
        json: String,
    },
    /// A typed result, encoded as a call stores it.
    Typed(Result<Order, Failure>),
    TypedNumber(Result<u64, String>),
    /// A Redis script's reply.
    Redis {
        key: [u8; 32],
        reply: Reply,
    },
    /// A Redis reply of any shape.
    RedisRaw {
        key: [u8; 32],
        fields: Vec<Field>,
    },
    /// A SQL row's status, token and fingerprint columns.
    Sql {
        status: i64,
        token: u64,
        fingerprint: Vec<u8>,
    },
}

/// Decodes `bytes` as `Result<T, E>`; a success must round-trip, a failure be a codec error.
fn check<T, E>(bytes: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
    E: Serialize + DeserializeOwned + PartialEq + Debug,
{
    match decode_stored::<T, E>(bytes) {
        Ok(decoded) => {
            let again = encode_stored(&decoded).expect("a decoded value encodes");
            let twice = decode_stored::<T, E>(&again).expect("its encoding decodes");
            assert_eq!(decoded, twice, "a decoded value did not round-trip");
        }
        Err(Error::Codec(_)) => {}
        Err(other) => panic!("not a codec error: {other:?}"),
    }
}

fn check_all(bytes: &[u8]) {
    check::<u64, ()>(bytes);
    check::<String, String>(bytes);
    check::<Order, Failure>(bytes);
    check::<Option<Vec<Order>>, u32>(bytes);
}

fn round_trip<T, E>(result: &Result<T, E>)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
    E: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = match encode_stored(result) {
        Ok(bytes) => bytes,
        // A float JSON cannot hold (NaN, an infinity) is refused, never stored.
        Err(Error::Codec(e)) if e.kind == CodecErrorKind::Encode => return,
        Err(other) => panic!("not an encode error: {other:?}"),
    };
    let decoded = decode_stored::<T, E>(&bytes).expect("an encoded result decodes");
    assert_eq!(
        &decoded, result,
        "an encoded result did not decode to itself"
    );
    check_all(&bytes);
}

fn number(n: i64, ints: bool) -> Value {
    if ints {
        Value::Int(n)
    } else {
        Value::BulkString(n.to_string().into_bytes())
    }
}

fn redis_fields(r: &Reply) -> Vec<Value> {
    let mut fields = vec![
        Value::BulkString(if r.completed {
            b"1".to_vec()
        } else {
            b"0".to_vec()
        }),
        if r.ints && r.token <= i64::MAX as u64 {
            Value::Int(r.token as i64)
        } else {
            Value::BulkString(r.token.to_string().into_bytes())
        },
        Value::BulkString(r.fingerprint.to_vec()),
        r.value.clone().map_or(Value::Nil, Value::BulkString),
        Value::BulkString(r.name.clone().into_bytes()),
        number(r.created_at, r.ints),
        number(r.expires_at, r.ints),
        r.now.map_or(Value::Nil, |n| number(n, r.ints)),
        // attempt and keep_until: absent, as in a record written before them.
        Value::Nil,
        Value::Nil,
    ];
    if let Some((i, field)) = &r.replace {
        fields[*i as usize % 10] = field.value();
    }
    fields
}

/// The record must be what the reply said (checked only for replies left whole).
fn check_record(key: Digest, r: &Reply, fields: &[Value]) {
    match parse_record_reply(key, fields) {
        Ok(record) => {
            assert_eq!(record.key, key);
            if r.replace.is_none() {
                let status = if r.completed {
                    Status::Completed
                } else {
                    Status::InProgress
                };
                assert_eq!(record.status, status);
                assert_eq!(record.token, r.token);
                assert_eq!(record.fingerprint, Digest(r.fingerprint));
                assert_eq!(record.value, r.value);
                assert_eq!(record.name, r.name);
                assert_eq!(record.created_at, r.created_at);
                assert_eq!(record.expires_at, r.expires_at);
                assert_eq!((record.attempt, record.keep_until), (1, r.expires_at));
                match r.now {
                    Some(now) => assert_eq!(record.now, now),
                    None => assert!(
                        record.now >= r.created_at && record.now <= r.expires_at.max(r.created_at),
                        "a stand-in `now` outside the record's life: {record:?}"
                    ),
                }
            }
            let _ = record.remaining();
            let fingerprint = record.fingerprint;
            if let Decision::Replay { value: bytes, .. } = decide_existing(record, &fingerprint) {
                check_all(&bytes);
            }
        }
        Err(Error::Store(e)) => {
            assert_eq!(e.kind, StoreErrorKind::Corrupt, "{e:?}");
            // Only a whole reply of the right types can be refused for its contents: the
            // status must be "0"/"1", and the now of an in-progress record present.
            if r.replace.is_none() {
                assert!(
                    r.now.is_none() && !r.completed,
                    "a well-formed reply was refused: {e}"
                );
            }
        }
        Err(other) => panic!("not a store error: {other:?}"),
    }
}

fuzz_target!(|input: Input| match input {
    Input::Stored(bytes) => check_all(&bytes),
    Input::Framed { ok, json } => {
        let mut bytes = vec![1, if ok { b'o' } else { b'e' }];
        bytes.extend_from_slice(json.as_bytes());
        check_all(&bytes);
    }
    Input::Typed(result) => round_trip(&result),
    Input::TypedNumber(result) => round_trip(&result),
    Input::Redis { key, reply } => {
        let fields = redis_fields(&reply);
        check_record(Digest(key), &reply, &fields);
    }
    Input::RedisRaw { key, fields } => {
        let fields: Vec<Value> = fields.iter().map(Field::value).collect();
        match parse_record_reply(Digest(key), &fields) {
            Ok(record) => assert_eq!(record.key, Digest(key)),
            Err(Error::Store(e)) => assert_eq!(e.kind, StoreErrorKind::Corrupt, "{e:?}"),
            Err(other) => panic!("not a store error: {other:?}"),
        }
    }
    Input::Sql {
        status,
        token,
        fingerprint,
    } => {
        let expected = match status {
            0 => Some(Status::InProgress),
            1 => Some(Status::Completed),
            2 => Some(Status::Released),
            3 => Some(Status::Parked),
            _ => None,
        };
        assert_eq!(status_from_column(status), expected);
        assert_eq!((token as i64) as u64, token, "a token lost in its column");
        assert_eq!(
            Digest::from_slice(&fingerprint).is_some(),
            fingerprint.len() == 32
        );
    }
});
