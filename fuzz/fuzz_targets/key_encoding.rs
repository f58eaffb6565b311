//! Key encoding of arbitrary serde values: never panics; equal values give equal encodings and
//! digests; a map's entry order does not change them.
#![no_main]

use arbitrary::Arbitrary;
use idem_runtime::key::{canonical, key_digest};
use libfuzzer_sys::fuzz_target;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct, SerializeTupleVariant};
use serde::{Serialize, Serializer};

#[derive(Debug, Clone, PartialEq, Arbitrary)]
enum Value {
    Unit,
    Bool(bool),
    I8(i8),
    I64(i64),
    I128(i128),
    U128(u128),
    F32(f32),
    F64(f64),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    Opt(Option<Box<Value>>),
    Seq(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Struct(Box<Value>, Box<Value>),
    Variant(u8, Vec<Value>),
    Newtype(Box<Value>),
}

/// `reversed`: maps serialize their entries in reverse order.
struct Ser<'a>(&'a Value, bool);

impl Serialize for Ser<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.1;
        match self.0 {
            Value::Unit => s.serialize_unit(),
            Value::Bool(v) => s.serialize_bool(*v),
            Value::I8(v) => s.serialize_i8(*v),
            Value::I64(v) => s.serialize_i64(*v),
            Value::I128(v) => s.serialize_i128(*v),
            Value::U128(v) => s.serialize_u128(*v),
            Value::F32(v) => s.serialize_f32(*v),
            Value::F64(v) => s.serialize_f64(*v),
            Value::Char(v) => s.serialize_char(*v),
            Value::Str(v) => s.serialize_str(v),
            Value::Bytes(v) => s.serialize_bytes(v),
            Value::Opt(None) => s.serialize_none(),
            Value::Opt(Some(v)) => s.serialize_some(&Ser(v, r)),
            Value::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&Ser(v, r))?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                let mut order: Vec<&(Value, Value)> = entries.iter().collect();
                if r {
                    order.reverse();
                }
                for (k, v) in order {
                    map.serialize_entry(&Ser(k, r), &Ser(v, r))?;
                }
                map.end()
            }
            Value::Struct(a, b) => {
                let mut st = s.serialize_struct("S", 2)?;
                st.serialize_field("a", &Ser(a, r))?;
                st.serialize_field("b", &Ser(b, r))?;
                st.end()
            }
            Value::Variant(i, fields) => {
                const NAMES: [&str; 4] = ["A", "B", "C", "D"];
                let name = NAMES[*i as usize % NAMES.len()];
                let mut tv = s.serialize_tuple_variant("E", u32::from(*i), name, fields.len())?;
                for v in fields {
                    tv.serialize_field(&Ser(v, r))?;
                }
                tv.end()
            }
            Value::Newtype(v) => s.serialize_newtype_struct("N", &Ser(v, r)),
        }
    }
}

/// Whether every map in `v` has distinct keys (entry order can only be free of meaning then).
fn distinct_keys(v: &Value) -> bool {
    match v {
        Value::Map(entries) => {
            let keys: Vec<Vec<u8>> = entries
                .iter()
                .filter_map(|(k, _)| canonical(&Ser(k, false)).ok())
                .collect();
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.dedup();
            sorted.len() == entries.len()
                && entries
                    .iter()
                    .all(|(k, v)| distinct_keys(k) && distinct_keys(v))
        }
        Value::Opt(Some(v)) | Value::Newtype(v) => distinct_keys(v),
        Value::Seq(items) | Value::Variant(_, items) => items.iter().all(distinct_keys),
        Value::Struct(a, b) => distinct_keys(a) && distinct_keys(b),
        _ => true,
    }
}

fuzz_target!(|v: Value| {
    let Ok(once) = canonical(&Ser(&v, false)) else {
        return;
    };
    let again = canonical(&Ser(&v.clone(), false)).expect("encoded once, encodes again");
    assert_eq!(once, again, "one value, two encodings");
    assert_eq!(key_digest("n", None, &once), key_digest("n", None, &again));
    if distinct_keys(&v) {
        let reversed = canonical(&Ser(&v, true)).expect("encodes in any entry order");
        assert_eq!(once, reversed, "a map's entry order changed the encoding");
    }
});
