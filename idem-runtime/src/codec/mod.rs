//! How results are stored: one format byte, one kind byte, then JSON.
//!
//! JSON because a stored value must stay readable by an operator (`idem show --value`) and
//! self-describing, so that a value written by an older type can be told from a corrupt row:
//! bytes that are not JSON at all are [`CodecErrorKind::Corrupt`]; JSON that does not fit the
//! type is [`CodecErrorKind::TypeChanged`].

use crate::error::{CodecError, CodecErrorKind, Error};
use serde::{de::DeserializeOwned, Serialize};

pub(crate) use format::FORMAT_V1;

mod envelope;
mod format;
#[cfg(feature = "encryption")]
mod seal;

pub(crate) use envelope::Codec;
pub use envelope::DEFAULT_MAX_VALUE_LEN;
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use seal::{Keyring, MAX_KEY_ID_LEN};

const KIND_OK: u8 = b'o';
const KIND_ERR: u8 = b'e';
/// A resumable call's arguments (`#[idempotent(resume)]`), kept with its claim.
const KIND_ARGS: u8 = b'a';

/// A stored value, decoded as far as its kind.
pub(crate) enum Stored<'a> {
    Ok(&'a [u8]),
    Err(&'a [u8]),
}

fn encode<T: Serialize + ?Sized>(kind: u8, value: &T) -> Result<Vec<u8>, Error> {
    // JSON has no NaN or infinity: serde_json writes one as `null`, which would be stored and
    // then never decode into the float it was. Refused here, nothing undecodable is stored.
    value.serialize(finite::Check).map_err(|e| {
        Error::Codec(CodecError {
            kind: CodecErrorKind::Encode,
            type_name: std::any::type_name::<T>(),
            message: e.to_string(),
        })
    })?;
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_V1);
    out.push(kind);
    serde_json::to_writer(&mut out, value).map_err(|e| {
        Error::Codec(CodecError {
            kind: CodecErrorKind::Encode,
            type_name: std::any::type_name::<T>(),
            message: e.to_string(),
        })
    })?;
    Ok(out)
}

pub(crate) fn encode_ok<T: Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    encode(KIND_OK, value)
}

/// Encodes a resumable call's arguments as they are kept with its claim.
pub(crate) fn encode_args<A: Serialize + ?Sized>(args: &A) -> Result<Vec<u8>, Error> {
    encode(KIND_ARGS, args)
}

/// Decodes a resumable call's kept (opened) arguments into `A`: [`CodecErrorKind::TypeChanged`]
/// when they no longer fit the function's argument types (a deploy changed them).
pub(crate) fn decode_args<A: DeserializeOwned>(bytes: &[u8]) -> Result<A, Error> {
    match bytes {
        [FORMAT_V1, KIND_ARGS, json @ ..] => decode(json),
        _ => Err(corrupt::<A>("not the arguments of a resumable call".into())),
    }
}

pub(crate) fn encode_err<E: Serialize>(value: &E) -> Result<Vec<u8>, Error> {
    encode(KIND_ERR, value)
}

pub(crate) fn split<T>(bytes: &[u8]) -> Result<Stored<'_>, Error> {
    match bytes {
        [FORMAT_V1, KIND_OK, rest @ ..] => Ok(Stored::Ok(rest)),
        [FORMAT_V1, KIND_ERR, rest @ ..] => Ok(Stored::Err(rest)),
        [format, ..] if *format != FORMAT_V1 => Err(corrupt::<T>(format!(
            "format version {format}, this version of idem reads {FORMAT_V1} and {}",
            format::FORMAT_SEALED
        ))),
        _ => Err(corrupt::<T>("unknown value kind".into())),
    }
}

fn corrupt<T>(message: String) -> Error {
    Error::Codec(CodecError {
        kind: CodecErrorKind::Corrupt,
        type_name: std::any::type_name::<T>(),
        message,
    })
}

pub(crate) fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(json).map_err(|e| {
        // The decoder stops at the first thing that does not fit `T`, even in bytes that are
        // not JSON at all; only well-formed JSON of another shape is a type change.
        let well_formed = serde_json::from_slice::<serde::de::IgnoredAny>(json).is_ok();
        let kind = match e.classify() {
            serde_json::error::Category::Data if well_formed => CodecErrorKind::TypeChanged,
            _ => CodecErrorKind::Corrupt,
        };
        Error::Codec(CodecError {
            kind,
            type_name: std::any::type_name::<T>(),
            message: e.to_string(),
        })
    })
}

/// Decodes a stored value the way a replay does: an `Ok` into the caller's `T`, a kept `Err`
/// through `decode_err` (the call's error policy). Anything that does not decode is
/// [`Error::Codec`].
pub(crate) fn decode_result<T, E>(
    bytes: &[u8],
    decode_err: impl FnOnce(&[u8]) -> Result<E, Error>,
) -> Result<Result<T, E>, Error>
where
    T: DeserializeOwned,
{
    match split::<T>(bytes)? {
        Stored::Ok(json) => decode(json).map(Ok),
        Stored::Err(json) => decode_err(json).map(Err),
    }
}

/// Decodes stored bytes into the `Result` a replay returns, kept errors decoded as
/// [`crate::KeepErrors`] does (the `record_decoding` fuzz target's entry point; never panics:
/// bytes that do not decode are [`Error::Codec`]).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn decode_stored<T: DeserializeOwned, E: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Result<T, E>, Error> {
    decode_result(bytes, |json| decode(json))
}

/// Encodes a result as a call stores it: an `Ok`, or an `Err` kept as [`crate::KeepErrors`]
/// keeps it (the inverse of [`decode_stored`], for the fuzz target's round trip).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn encode_stored<T: Serialize, E: Serialize>(result: &Result<T, E>) -> Result<Vec<u8>, Error> {
    match result {
        Ok(value) => encode_ok(value),
        Err(error) => encode_err(error),
    }
}

/// The stored value as JSON text, for operators (the CLI's `--value`): `Ok(…)` or `Err(…)`; a
/// compressed value decompressed (feature `compression`); an encrypted one as
/// `encrypted (key id …)` (see [`crate::Idem::describe_value`], which decrypts).
pub fn describe_value(bytes: &[u8]) -> String {
    envelope::describe_sealed(bytes).unwrap_or_else(|| describe_plain(bytes))
}

/// A format-1 value as JSON text.
pub(crate) fn describe_plain(bytes: &[u8]) -> String {
    match split::<()>(bytes) {
        Ok(Stored::Ok(json)) => format!("Ok({})", String::from_utf8_lossy(json)),
        Ok(Stored::Err(json)) => format!("Err({})", String::from_utf8_lossy(json)),
        Err(e) => e.to_string(),
    }
}

/// A serializer that only looks for floats JSON cannot hold (NaN, the infinities).
mod finite {
    use serde::ser::{self, Serialize};
    use std::fmt;

    #[derive(Debug)]
    pub(super) struct NonFinite(String);

    impl fmt::Display for NonFinite {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for NonFinite {}

    impl ser::Error for NonFinite {
        fn custom<T: fmt::Display>(msg: T) -> Self {
            NonFinite(msg.to_string())
        }
    }

    type R = Result<(), NonFinite>;

    /// Succeeds when every float in the value is finite.
    pub(super) struct Check;

    impl ser::Serializer for Check {
        type Ok = ();
        type Error = NonFinite;
        type SerializeSeq = Check;
        type SerializeTuple = Check;
        type SerializeTupleStruct = Check;
        type SerializeTupleVariant = Check;
        type SerializeMap = Check;
        type SerializeStruct = Check;
        type SerializeStructVariant = Check;

        fn serialize_bool(self, _: bool) -> R {
            Ok(())
        }
        fn serialize_i8(self, _: i8) -> R {
            Ok(())
        }
        fn serialize_i16(self, _: i16) -> R {
            Ok(())
        }
        fn serialize_i32(self, _: i32) -> R {
            Ok(())
        }
        fn serialize_i64(self, _: i64) -> R {
            Ok(())
        }
        fn serialize_i128(self, _: i128) -> R {
            Ok(())
        }
        fn serialize_u8(self, _: u8) -> R {
            Ok(())
        }
        fn serialize_u16(self, _: u16) -> R {
            Ok(())
        }
        fn serialize_u32(self, _: u32) -> R {
            Ok(())
        }
        fn serialize_u64(self, _: u64) -> R {
            Ok(())
        }
        fn serialize_u128(self, _: u128) -> R {
            Ok(())
        }
        fn serialize_f32(self, v: f32) -> R {
            self.serialize_f64(v.into())
        }
        fn serialize_f64(self, v: f64) -> R {
            if v.is_finite() {
                Ok(())
            } else {
                Err(NonFinite(format!(
                    "the float {v} cannot be stored: JSON has no NaN or infinity"
                )))
            }
        }
        fn serialize_char(self, _: char) -> R {
            Ok(())
        }
        fn serialize_str(self, _: &str) -> R {
            Ok(())
        }
        fn serialize_bytes(self, _: &[u8]) -> R {
            Ok(())
        }
        fn serialize_none(self) -> R {
            Ok(())
        }
        fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> R {
            v.serialize(Check)
        }
        fn serialize_unit(self) -> R {
            Ok(())
        }
        fn serialize_unit_struct(self, _: &'static str) -> R {
            Ok(())
        }
        fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> R {
            Ok(())
        }
        fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, v: &T) -> R {
            v.serialize(Check)
        }
        fn serialize_newtype_variant<T: ?Sized + Serialize>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            v: &T,
        ) -> R {
            v.serialize(Check)
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_tuple(self, _: usize) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Check, NonFinite> {
            Ok(Check)
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Check, NonFinite> {
            Ok(Check)
        }
    }

    /// The compound parts walk each element or field with the same check.
    macro_rules! walk_each {
        ($($trait:ident :: $method:ident ($($name:ty)?)),* $(,)?) => {$(
            impl ser::$trait for Check {
                type Ok = ();
                type Error = NonFinite;
                fn $method<T: ?Sized + Serialize>(&mut self, $(_: $name,)? v: &T) -> R {
                    v.serialize(Check)
                }
                fn end(self) -> R {
                    Ok(())
                }
            }
        )*};
    }

    walk_each!(
        SerializeSeq::serialize_element(),
        SerializeTuple::serialize_element(),
        SerializeTupleStruct::serialize_field(),
        SerializeTupleVariant::serialize_field(),
        SerializeStruct::serialize_field(&'static str),
        SerializeStructVariant::serialize_field(&'static str),
    );

    impl ser::SerializeMap for Check {
        type Ok = ();
        type Error = NonFinite;
        fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> R {
            k.serialize(Check)
        }
        fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> R {
            v.serialize(Check)
        }
        fn end(self) -> R {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_type_change_from_corruption() {
        let bytes = encode_ok(&"text").unwrap();
        let Stored::Ok(json) = split::<u32>(&bytes).unwrap() else {
            panic!()
        };
        match decode::<u32>(json) {
            Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::TypeChanged),
            other => panic!("{other:?}"),
        }
        match decode::<u32>(b"{not json") {
            Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::Corrupt),
            other => panic!("{other:?}"),
        }
        assert!(matches!(split::<u32>(&[9, b'o']), Err(Error::Codec(_))));
        assert!(matches!(split::<u32>(&[]), Err(Error::Codec(_))));
    }

    /// Found by the `record_decoding` fuzz target: serde_json's default float parser is not
    /// exact, so a replayed f64 could be one unit in the last place off the stored one.
    #[test]
    fn floats_replay_exactly() {
        for v in [
            7.064_162_446_993_141e-304_f64,
            0.1,
            1.0 / 3.0,
            f64::MIN_POSITIVE,
            5e-324,
        ] {
            let bytes = encode_ok(&v).unwrap();
            let Stored::Ok(json) = split::<f64>(&bytes).unwrap() else {
                panic!()
            };
            assert_eq!(decode::<f64>(json).unwrap().to_bits(), v.to_bits(), "{v:e}");
        }
    }

    /// Found by the `record_decoding` fuzz target: a non-finite float was stored as `null`,
    /// and the stored value then never decoded. It is refused when encoding instead.
    #[test]
    fn non_finite_floats_are_not_stored() {
        #[derive(Serialize)]
        struct Line {
            qty: u32,
            weight: Option<f32>,
        }
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            match encode_ok(&vec![(1u8, bad)]) {
                Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::Encode, "{e}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let line = Line {
            qty: 1,
            weight: Some(f32::INFINITY),
        };
        assert!(matches!(encode_err(&line), Err(Error::Codec(_))));
        let bytes = encode_ok(&(f64::MAX, -0.0f64, f32::MIN_POSITIVE)).unwrap();
        let Stored::Ok(json) = split::<()>(&bytes).unwrap() else {
            panic!()
        };
        assert_eq!(
            decode::<(f64, f64, f32)>(json).unwrap(),
            (f64::MAX, -0.0, f32::MIN_POSITIVE)
        );
    }
}
