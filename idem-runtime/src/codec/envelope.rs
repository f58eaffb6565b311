//! What happens to an encoded result on its way to the store and back: compression, encryption
//! and the size limit, all in one versioned, tagged envelope.
//!
//! ```text
//! format 1 (plain):   [1] [kind] json                   written when nothing below applies
//! format 2 (sealed):  [2] [flags] body                  flags: 1 = zstd, 2 = encrypted
//!   encrypted body:   [n] key-id(n bytes) nonce(24) ciphertext+tag(16)
//!   plaintext:        a format-1 value, zstd-compressed when flag 1 is set
//! ```
//!
//! A handle with no option set writes format 1, byte for byte what earlier versions wrote, and
//! every handle reads both formats, so old and new records live side by side. The flags and the
//! key id are in the associated data of the AEAD, so flipping a flag or renaming a key is
//! detected like any other tampering.

use super::format::{FLAG_SEALED, FLAG_ZSTD, FORMAT_SEALED};
use crate::error::{CodecErrorKind, Error};
use crate::key::Digest;
use std::borrow::Cow;

const KNOWN_FLAGS: u8 = FLAG_ZSTD | FLAG_SEALED;

/// The default limit on a stored value: generous (16 MiB), so that only a runaway result hits
/// it; stores with a limit of their own declare it ([`crate::Store::max_value_len`]).
pub const DEFAULT_MAX_VALUE_LEN: usize = 16 << 20;

/// The most a compressed value may expand to when read back (a bound on a zstd bomb).
#[cfg(feature = "compression")]
const MAX_DECOMPRESSED: usize = 1 << 30;

/// The transformations a handle applies to stored values (set with `Idem::with_*`).
#[derive(Clone)]
pub(crate) struct Codec {
    /// The limit on a stored value: the handle's, or the store's if lower.
    pub(crate) max_len: usize,
    /// Values whose encoding is longer than this are compressed.
    #[cfg(feature = "compression")]
    pub(crate) compress_above: Option<usize>,
    /// The keys values are sealed with (the newest) and opened with (any).
    #[cfg(feature = "encryption")]
    pub(crate) keyring: Option<std::sync::Arc<super::seal::Keyring>>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Codec");
        d.field("max_len", &self.max_len);
        #[cfg(feature = "compression")]
        d.field("compress_above", &self.compress_above);
        #[cfg(feature = "encryption")]
        d.field("keyring", &self.keyring);
        d.finish()
    }
}

impl Codec {
    /// No transformation; the handle's limit is `min(DEFAULT_MAX_VALUE_LEN, store's)`.
    pub(crate) fn new(store_max: Option<usize>) -> Codec {
        Codec {
            max_len: store_max.map_or(DEFAULT_MAX_VALUE_LEN, |m| m.min(DEFAULT_MAX_VALUE_LEN)),
            #[cfg(feature = "compression")]
            compress_above: None,
            #[cfg(feature = "encryption")]
            keyring: None,
        }
    }

    /// True when a value goes to the store exactly as encoded (format 1, no limit but the
    /// size check): the engine can skip the envelope.
    fn is_plain(&self) -> bool {
        #[cfg(feature = "compression")]
        if self.compress_above.is_some() {
            return false;
        }
        #[cfg(feature = "encryption")]
        if self.keyring.is_some() {
            return false;
        }
        true
    }

    /// The bytes to store for an encoded (format 1) value of type `type_name` under the key
    /// `key` of namespace `name`: compressed and sealed as configured, then checked against
    /// the limit. Over the limit is [`CodecErrorKind::TooLarge`].
    pub(crate) fn seal(
        &self,
        type_name: &'static str,
        name: &str,
        key: &Digest,
        encoded: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let stored = if self.is_plain() {
            encoded
        } else {
            self.envelope(type_name, name, key, encoded)?
        };
        if stored.len() > self.max_len {
            return Err(Error::codec(
                CodecErrorKind::TooLarge,
                type_name,
                format!(
                    "{} bytes as stored, over the limit of {} bytes (the handle's \
                     `with_max_value_len`, or the store's own)",
                    stored.len(),
                    self.max_len
                ),
            ));
        }
        Ok(stored)
    }

    #[allow(unused_mut, unused_variables)]
    fn envelope(
        &self,
        type_name: &'static str,
        name: &str,
        key: &Digest,
        encoded: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let mut flags = 0u8;
        let mut body = encoded;
        #[cfg(feature = "compression")]
        if let Some(above) = self.compress_above {
            if body.len() > above {
                let packed = zstd_ctx::compress(&body).map_err(|e| {
                    Error::codec(CodecErrorKind::Encode, type_name, format!("zstd: {e}"))
                })?;
                // Incompressible data (already compressed, random) stays as it was.
                if packed.len() < body.len() {
                    body = packed;
                    flags |= FLAG_ZSTD;
                }
            }
        }
        #[cfg(feature = "encryption")]
        if let Some(keyring) = &self.keyring {
            return keyring.seal(flags | FLAG_SEALED, name, key, &body);
        }
        if flags == 0 {
            // Nothing applied (a small value): format 1, readable by any version.
            return Ok(body);
        }
        let mut out = Vec::with_capacity(2 + body.len());
        out.extend_from_slice(&[FORMAT_SEALED, flags]);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// The format-1 value inside stored bytes: decrypted with the keyring and decompressed as
    /// the record's flags say. Format 1 is returned as it is.
    pub(crate) fn open<'a>(
        &self,
        type_name: &'static str,
        name: &str,
        key: &Digest,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, Error> {
        let (flags, rest) = match stored {
            [FORMAT_SEALED, flags, rest @ ..] => (*flags, rest),
            _ => return Ok(Cow::Borrowed(stored)),
        };
        if flags & !KNOWN_FLAGS != 0 {
            return Err(Error::codec(
                CodecErrorKind::Corrupt,
                type_name,
                format!("unknown envelope flags {flags:#04x}"),
            ));
        }
        let body: Cow<'a, [u8]> = if flags & FLAG_SEALED != 0 {
            Cow::Owned(self.unseal(type_name, flags, name, key, rest)?)
        } else {
            Cow::Borrowed(rest)
        };
        if flags & FLAG_ZSTD != 0 {
            decompress(type_name, &body).map(Cow::Owned)
        } else {
            Ok(body)
        }
    }

    #[cfg(feature = "encryption")]
    fn unseal(
        &self,
        type_name: &'static str,
        flags: u8,
        name: &str,
        key: &Digest,
        body: &[u8],
    ) -> Result<Vec<u8>, Error> {
        match &self.keyring {
            Some(keyring) => keyring.open(type_name, flags, name, key, body),
            None => Err(Error::codec(
                CodecErrorKind::UnknownKey,
                type_name,
                format!(
                    "the value is encrypted (key id `{}`) and this handle has no keyring \
                     (`Idem::with_encryption`)",
                    sealed_key_id(body).unwrap_or("?")
                ),
            )),
        }
    }

    #[cfg(not(feature = "encryption"))]
    fn unseal(
        &self,
        type_name: &'static str,
        _: u8,
        _: &str,
        _: &Digest,
        body: &[u8],
    ) -> Result<Vec<u8>, Error> {
        Err(Error::codec(
            CodecErrorKind::UnknownKey,
            type_name,
            format!(
                "the value is encrypted (key id `{}`); this build of idem has no `encryption` \
                 feature",
                sealed_key_id(body).unwrap_or("?")
            ),
        ))
    }
}

/// The key id of a sealed body, if it is well-formed enough to have one.
pub(crate) fn sealed_key_id(body: &[u8]) -> Option<&str> {
    let (&n, rest) = body.split_first()?;
    std::str::from_utf8(rest.get(..usize::from(n))?).ok()
}

#[cfg(feature = "compression")]
fn decompress(type_name: &'static str, body: &[u8]) -> Result<Vec<u8>, Error> {
    let corrupt =
        |m: String| Error::codec(CodecErrorKind::Corrupt, type_name, format!("zstd: {m}"));
    // The frames idem writes carry their content size: the output is allocated once, exactly,
    // and a frame that claims more than the bound is refused before anything is allocated.
    let size = match zstd::zstd_safe::get_frame_content_size(body) {
        Ok(Some(size)) => size,
        Ok(None) => return Err(corrupt("the frame does not say its size".into())),
        Err(_) => return Err(corrupt("not a zstd frame".into())),
    };
    if size > MAX_DECOMPRESSED as u64 {
        return Err(Error::codec(
            CodecErrorKind::Corrupt,
            type_name,
            format!("the value decompresses to more than {MAX_DECOMPRESSED} bytes"),
        ));
    }
    let out = zstd_ctx::decompress(body, size as usize).map_err(|e| corrupt(e.to_string()))?;
    if out.len() as u64 != size {
        return Err(corrupt("the frame is shorter than it says".into()));
    }
    Ok(out)
}

/// One compression and one decompression context per thread: creating a context allocates
/// hundreds of kilobytes, which cost more than compressing a small JSON value.
#[cfg(feature = "compression")]
mod zstd_ctx {
    use std::cell::RefCell;
    use std::io;

    /// Level 3, zstd's default: most of the ratio at a fraction of the cost.
    const LEVEL: i32 = 3;

    thread_local! {
        static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { RefCell::new(None) };
        static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { RefCell::new(None) };
    }

    pub(super) fn compress(data: &[u8]) -> io::Result<Vec<u8>> {
        COMPRESSOR.with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return zstd::bulk::compress(data, LEVEL);
            };
            if c.is_none() {
                *c = Some(zstd::bulk::Compressor::new(LEVEL)?);
            }
            match c.as_mut() {
                Some(c) => c.compress(data),
                None => zstd::bulk::compress(data, LEVEL),
            }
        })
    }

    pub(super) fn decompress(data: &[u8], size: usize) -> io::Result<Vec<u8>> {
        DECOMPRESSOR.with(|d| {
            let Ok(mut d) = d.try_borrow_mut() else {
                return zstd::bulk::decompress(data, size);
            };
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new()?);
            }
            match d.as_mut() {
                Some(d) => d.decompress(data, size),
                None => zstd::bulk::decompress(data, size),
            }
        })
    }
}

#[cfg(not(feature = "compression"))]
fn decompress(type_name: &'static str, _: &[u8]) -> Result<Vec<u8>, Error> {
    Err(Error::codec(
        CodecErrorKind::Corrupt,
        type_name,
        "the value is compressed with zstd; this build of idem has no `compression` feature".into(),
    ))
}

/// What an operator sees of stored bytes without a keyring: format 1 as JSON, a compressed
/// value decompressed (feature `compression`), an encrypted one as `encrypted (key id …)`.
pub(crate) fn describe_sealed(stored: &[u8]) -> Option<String> {
    match stored {
        [FORMAT_SEALED, flags, body @ ..] if flags & FLAG_SEALED != 0 => Some(format!(
            "encrypted (key id `{}`)",
            sealed_key_id(body).unwrap_or("?")
        )),
        [FORMAT_SEALED, ..] => {
            let none = Codec::new(None);
            match none.open("value", "", &Digest([0; 32]), stored) {
                Ok(plain) => Some(super::describe_plain(&plain)),
                Err(e) => Some(e.to_string()),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(len: usize) -> Vec<u8> {
        super::super::encode_ok(&"receipt ".repeat(len / 8)).unwrap()
    }

    #[test]
    fn plain_values_are_format_one_byte_for_byte() {
        let codec = Codec::new(None);
        let v = value(100);
        let stored = codec.seal("T", "n", &Digest([1; 32]), v.clone()).unwrap();
        assert_eq!(stored, v);
        assert_eq!(
            &*codec.open("T", "n", &Digest([1; 32]), &stored).unwrap(),
            &v[..]
        );
    }

    #[test]
    fn over_the_limit_is_too_large() {
        let mut codec = Codec::new(Some(1000));
        assert_eq!(codec.max_len, 1000);
        codec.max_len = 50;
        match codec.seal("T", "n", &Digest([1; 32]), value(100)) {
            Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::TooLarge, "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(Codec::new(None).max_len, DEFAULT_MAX_VALUE_LEN);
    }

    #[test]
    fn unknown_flags_are_corrupt() {
        let codec = Codec::new(None);
        match codec.open("T", "n", &Digest([1; 32]), &[FORMAT_SEALED, 0x80, 1, 2]) {
            Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::Corrupt, "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[cfg(feature = "compression")]
    #[test]
    fn compression_above_the_threshold_and_both_formats_read() {
        let mut codec = Codec::new(None);
        codec.compress_above = Some(256);
        let key = Digest([7; 32]);
        let small = value(100);
        assert_eq!(codec.seal("T", "n", &key, small.clone()).unwrap(), small);
        let big = value(10_000);
        let stored = codec.seal("T", "n", &key, big.clone()).unwrap();
        assert_eq!(stored[..2], [FORMAT_SEALED, FLAG_ZSTD]);
        assert!(stored.len() < big.len() / 10, "{}", stored.len());
        assert_eq!(&*codec.open("T", "n", &key, &stored).unwrap(), &big[..]);
        // A handle without compression reads both.
        let plain = Codec::new(None);
        assert_eq!(&*plain.open("T", "n", &key, &stored).unwrap(), &big[..]);
        assert_eq!(&*plain.open("T", "n", &key, &small).unwrap(), &small[..]);
        assert!(describe_sealed(&stored)
            .unwrap()
            .starts_with("Ok(\"receipt"));
        // The limit applies to what is stored: compressed, the value fits.
        codec.max_len = stored.len();
        assert!(codec.seal("T", "n", &key, big.clone()).is_ok());
        codec.max_len = stored.len() - 1;
        assert!(codec.seal("T", "n", &key, big).is_err());
        // Garbage behind the flag is a typed error, not a panic.
        match plain.open("T", "n", &key, &[FORMAT_SEALED, FLAG_ZSTD, 1, 2, 3]) {
            Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::Corrupt, "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
