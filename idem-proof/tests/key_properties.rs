//! Properties of the key encoding over generated serde values: the digest does not depend on
//! a map's iteration order nor on the integer type a number was written with, distinct
//! canonical values encode differently, and the golden vectors stay what they are.

use idem_runtime::key::{canonical, fingerprint_digest, key_digest};
use proptest::prelude::*;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;

/// A serde value in canonical form: maps are sorted and free of duplicate keys, so two values
/// are equal exactly when they mean the same key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum V {
    Unit,
    Bool(bool),
    Int(i64),
    Big(u128),
    Str(String),
    Bytes(Vec<u8>),
    Opt(Option<Box<V>>),
    Seq(Vec<V>),
    Map(BTreeMap<V, V>),
}

impl Serialize for V {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            V::Unit => s.serialize_unit(),
            V::Bool(b) => s.serialize_bool(*b),
            V::Int(i) => s.serialize_i64(*i),
            V::Big(u) => s.serialize_u128(*u),
            V::Str(t) => s.serialize_str(t),
            V::Bytes(b) => s.serialize_bytes(b),
            V::Opt(None) => s.serialize_none(),
            V::Opt(Some(v)) => s.serialize_some(v),
            V::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            V::Map(m) => Entries(m.iter().collect()).serialize(s),
        }
    }
}

/// Map entries serialized in exactly the order given (a `HashMap`'s iteration order, say).
struct Entries<'a>(Vec<(&'a V, &'a V)>);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// The same number written with another integer type.
#[derive(Debug, Clone, Copy)]
enum Width {
    U8,
    U16,
    U32,
    U64,
    U128,
    I8,
    I16,
    I32,
    I64,
    I128,
}

struct Widened(i128, Width);

impl Serialize for Widened {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        match self.1 {
            Width::U8 => s.serialize_u8(v as u8),
            Width::U16 => s.serialize_u16(v as u16),
            Width::U32 => s.serialize_u32(v as u32),
            Width::U64 => s.serialize_u64(v as u64),
            Width::U128 => s.serialize_u128(v as u128),
            Width::I8 => s.serialize_i8(v as i8),
            Width::I16 => s.serialize_i16(v as i16),
            Width::I32 => s.serialize_i32(v as i32),
            Width::I64 => s.serialize_i64(v as i64),
            Width::I128 => s.serialize_i128(v),
        }
    }
}

/// Whether `v` fits the type `w` exactly.
fn fits(v: i128, w: Width) -> bool {
    match w {
        Width::U8 => u8::try_from(v).is_ok(),
        Width::U16 => u16::try_from(v).is_ok(),
        Width::U32 => u32::try_from(v).is_ok(),
        Width::U64 => u64::try_from(v).is_ok(),
        Width::U128 => u128::try_from(v).is_ok(),
        Width::I8 => i8::try_from(v).is_ok(),
        Width::I16 => i16::try_from(v).is_ok(),
        Width::I32 => i32::try_from(v).is_ok(),
        Width::I64 => i64::try_from(v).is_ok(),
        Width::I128 => true,
    }
}

fn value() -> impl Strategy<Value = V> {
    let leaf = prop_oneof![
        Just(V::Unit),
        any::<bool>().prop_map(V::Bool),
        prop_oneof![any::<i64>(), -3i64..3].prop_map(V::Int),
        // Only above i64: a u128 that fits an i64 is the same canonical value as that `Int`.
        ((i64::MAX as u128 + 1)..=u128::MAX).prop_map(V::Big),
        "[a-c]{0,3}".prop_map(V::Str),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(V::Bytes),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::option::of(inner.clone()).prop_map(|o| V::Opt(o.map(Box::new))),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(V::Seq),
            proptest::collection::btree_map(inner.clone(), inner, 0..4).prop_map(V::Map),
        ]
    })
}

/// `v` with every map's entries in an order given by `seed` rather than sorted.
fn shuffled(v: &V, seed: u64) -> Vec<u8> {
    struct Shuffled<'a>(&'a V, u64);
    impl Serialize for Shuffled<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                V::Map(m) => {
                    let mut entries: Vec<_> = m.iter().collect();
                    let n = entries.len();
                    if n > 1 {
                        entries.rotate_left((self.1 as usize) % n);
                        if self.1 & 1 == 1 {
                            entries.reverse();
                        }
                    }
                    let mut map = s.serialize_map(Some(n))?;
                    for (k, v) in entries {
                        map.serialize_entry(&Shuffled(k, self.1 >> 1), &Shuffled(v, self.1 >> 1))?;
                    }
                    map.end()
                }
                V::Seq(items) => {
                    let mut seq = s.serialize_seq(Some(items.len()))?;
                    for v in items {
                        seq.serialize_element(&Shuffled(v, self.1.rotate_left(7)))?;
                    }
                    seq.end()
                }
                V::Opt(Some(v)) => s.serialize_some(&Shuffled(v, self.1)),
                other => other.serialize(s),
            }
        }
    }
    canonical(&Shuffled(v, seed)).expect("encodes")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn map_order_does_not_change_the_digest(v in value(), seed in any::<u64>()) {
        let sorted = canonical(&v).expect("encodes");
        prop_assert_eq!(&shuffled(&v, seed), &sorted);
        prop_assert_eq!(key_digest("n", None, &shuffled(&v, seed)), key_digest("n", None, &sorted));
    }

    #[test]
    fn integer_width_does_not_change_the_digest(
        n in prop_oneof![any::<i8>().prop_map(i128::from), any::<i64>().prop_map(i128::from), any::<u64>().prop_map(i128::from)],
    ) {
        let widths = [Width::U8, Width::U16, Width::U32, Width::U64, Width::U128,
            Width::I8, Width::I16, Width::I32, Width::I64, Width::I128];
        let want = canonical(&Widened(n, Width::I128)).unwrap();
        for w in widths.into_iter().filter(|&w| fits(n, w)) {
            prop_assert_eq!(&canonical(&Widened(n, w)).unwrap(), &want, "{:?}", w);
        }
    }

    #[test]
    fn distinct_values_have_distinct_encodings(a in value(), b in value()) {
        let (ea, eb) = (canonical(&a).expect("encodes"), canonical(&b).expect("encodes"));
        prop_assert_eq!(a == b, ea == eb, "{:?} / {:?}", a, b);
        prop_assert_eq!(a == b, key_digest("n", None, &ea) == key_digest("n", None, &eb));
    }

    #[test]
    fn a_value_never_runs_into_the_next(a in value(), b in value(), c in value(), d in value()) {
        // Concatenated encodings are a tuple's: two pairs encode alike only when equal.
        let ab = canonical(&(&a, &b)).expect("encodes");
        let cd = canonical(&(&c, &d)).expect("encodes");
        prop_assert_eq!(a == c && b == d, ab == cd);
    }

    #[test]
    fn scope_and_namespace_separate_keys(v in value(), ns in "[a-z]{1,4}", scope in "[a-z]{0,3}") {
        let k = canonical(&v).expect("encodes");
        let s = canonical(&scope).expect("encodes");
        prop_assert_ne!(key_digest(&ns, None, &k), key_digest(&ns, Some(&s), &k));
        prop_assert_ne!(key_digest(&ns, None, &k), key_digest(&format!("{ns}x"), None, &k));
    }
}

/// The golden vectors of the runtime's own tests, computed through the public API: a key
/// computed today is the same key after an upgrade.
#[test]
fn golden_vectors_stay_unchanged() {
    #[derive(Serialize)]
    struct Charge {
        order: u64,
        amount_cents: i64,
        currency: &'static str,
        tags: BTreeMap<&'static str, bool>,
        note: Option<String>,
    }
    #[derive(Serialize)]
    enum Kind {
        Refund { of: u32 },
    }
    fn digest_of<T: Serialize + ?Sized>(ns: &str, scope: Option<&str>, key: &T) -> String {
        let scope = scope.map(|s| canonical(s).unwrap());
        key_digest(ns, scope.as_deref(), &canonical(key).unwrap()).to_hex()
    }
    let charge = Charge {
        order: 42,
        amount_cents: -1999,
        currency: "EUR",
        tags: [("vip", true), ("b2b", false)].into_iter().collect(),
        note: None,
    };
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&canonical(&(1u8, "a")).unwrap()),
        "090000000000000002040000000000000000000000000000000107000000000000000161"
    );
    assert_eq!(
        digest_of("charge", None, "k-1"),
        "7bc032cb96f85e28cc8ccd773b4aa376dc6acb25ed8894bcb5f265f27e30813e"
    );
    assert_eq!(
        digest_of("charges.v1", Some("tenant-7"), &charge),
        "60d18d210edcd1d42dd80a245e545ad3bf1d7b691e45295030157baaa66fd436"
    );
    assert_eq!(
        digest_of("monthly-invoice", None, &(17u32, (2026u16, 11u8))),
        "80abfc9313c6ad4aea072ab743978cccd930dc8a862b8128bf474852f5575200"
    );
    assert_eq!(
        digest_of("refund", None, &Kind::Refund { of: 3 }),
        "30767244ac39a4b0c0d66c72fc27a997687528196c2b14b58d0ad7302dfcd774"
    );
    assert_eq!(
        fingerprint_digest(&canonical(&(0.5f64, vec![b'x'; 3], ())).unwrap()).to_hex(),
        "900cdd56319b169e890a3f8fe48c31b65377a42d84a84190ed499b1b88927799"
    );
}
