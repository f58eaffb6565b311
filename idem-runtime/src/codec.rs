//! How results are stored: one format byte, one kind byte, then JSON.
//!
//! JSON because a stored value must stay readable by an operator (`idem show --value`) and
//! self-describing, so that a value written by an older type can be told from a corrupt row:
//! bytes that are not JSON at all are [`CodecErrorKind::Corrupt`]; JSON that does not fit the
//! type is [`CodecErrorKind::TypeChanged`].

use crate::error::{CodecError, CodecErrorKind, Error};
use serde::{de::DeserializeOwned, Serialize};

/// Format version written in the first byte of every stored value.
pub(crate) const FORMAT_V1: u8 = 1;
const KIND_OK: u8 = b'o';
const KIND_ERR: u8 = b'e';

/// A stored value, decoded as far as its kind.
pub(crate) enum Stored<'a> {
    Ok(&'a [u8]),
    Err(&'a [u8]),
}

fn encode<T: Serialize>(kind: u8, value: &T) -> Result<Vec<u8>, Error> {
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

pub(crate) fn encode_err<E: Serialize>(value: &E) -> Result<Vec<u8>, Error> {
    encode(KIND_ERR, value)
}

pub(crate) fn split<T>(bytes: &[u8]) -> Result<Stored<'_>, Error> {
    match bytes {
        [FORMAT_V1, KIND_OK, rest @ ..] => Ok(Stored::Ok(rest)),
        [FORMAT_V1, KIND_ERR, rest @ ..] => Ok(Stored::Err(rest)),
        [format, ..] if *format != FORMAT_V1 => Err(corrupt::<T>(format!(
            "format version {format}, this version of idem reads {FORMAT_V1}"
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

/// The stored value as JSON text, for operators (the CLI's `--value`).
pub fn describe_value(bytes: &[u8]) -> String {
    match split::<()>(bytes) {
        Ok(Stored::Ok(json)) => format!("Ok({})", String::from_utf8_lossy(json)),
        Ok(Stored::Err(json)) => format!("Err({})", String::from_utf8_lossy(json)),
        Err(e) => e.to_string(),
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
}
