//! Key derivation: a versioned, canonical encoding of any `Serialize` value, hashed with sha256.
//!
//! The encoding is ours, not serde_json's, so nothing about it depends on a feature flag of
//! another crate (`preserve_order`, `arbitrary_precision`) or on a map's iteration order:
//!
//! * every integer type encodes as the same 128-bit big-endian value, so widening `u32` to `u64`
//!   between deploys keeps every key;
//! * structs encode as maps of their field names, and map entries are sorted by their encoded
//!   key at every level, so a `HashMap` gives one key whatever order it iterates in;
//! * newtype structs are transparent and enum variants encode by name, so wrapping an id in a
//!   newtype or reordering variants keeps every key;
//! * strings and byte strings are length-prefixed, so no value can run into the next.
//!
//! The digest of a call's key is `sha256(DOMAIN_KEY ‖ str(namespace) ‖ option(scope) ‖ key)`.
//! Golden vectors in the tests pin all of this: a key computed today is the same key after an
//! upgrade. Changing the encoding means a new domain tag (`v2`), never an edit of `v1`.

use serde::ser::{self, Serialize};
use sha2::{Digest as _, Sha256};
use std::cell::RefCell;
use std::fmt;
use std::hash::BuildHasher as _;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Domain tag of call keys, version 1 of the encoding.
const DOMAIN_KEY: &[u8] = b"idem\0key\0v1\0";
/// Domain tag of fingerprints, version 1 of the encoding.
const DOMAIN_FINGERPRINT: &[u8] = b"idem\0fp\0v1\0";

mod tag {
    pub(super) const NONE: u8 = 0x00;
    pub(super) const SOME: u8 = 0x01;
    pub(super) const UNIT: u8 = 0x02;
    pub(super) const BOOL: u8 = 0x03;
    pub(super) const INT: u8 = 0x04;
    pub(super) const BIG_UINT: u8 = 0x05;
    pub(super) const FLOAT: u8 = 0x06;
    pub(super) const STR: u8 = 0x07;
    pub(super) const BYTES: u8 = 0x08;
    pub(super) const SEQ: u8 = 0x09;
    pub(super) const MAP: u8 = 0x0a;
    pub(super) const UNIT_VARIANT: u8 = 0x0b;
    pub(super) const NEWTYPE_VARIANT: u8 = 0x0c;
    pub(super) const TUPLE_VARIANT: u8 = 0x0d;
    pub(super) const STRUCT_VARIANT: u8 = 0x0e;
}

/// A 32-byte sha256 digest: how keys and fingerprints are stored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest as 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 0xf) as usize] as char);
        }
        s
    }

    /// Parses 64 hex characters back into a digest.
    pub fn from_hex(s: &str) -> Option<Digest> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks(2).enumerate() {
            out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(Digest(out))
    }

    /// The digest as a byte slice.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Builds a digest from a stored byte slice; `None` unless it is exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Digest> {
        bytes.try_into().ok().map(Digest)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A value that could not be encoded (its `Serialize` impl returned an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeError(pub String);

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl ser::Error for EncodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        EncodeError(msg.to_string())
    }
}

/// Encodes `value` canonically (version 1) and returns the bytes.
pub fn canonical<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    value.serialize(Canon { out: &mut out })?;
    Ok(out)
}

/// The digest of one call's key: namespace, optional scope and key, all canonically encoded.
///
/// `scope` and `key` are canonical encodings as returned by [`canonical`].
pub fn key_digest(namespace: &str, scope: Option<&[u8]>, key: &[u8]) -> Digest {
    let mut h = Sha256::new();
    h.update(DOMAIN_KEY);
    key_parts(|b| h.update(b), namespace, scope, key);
    Digest(h.finalize().into())
}

/// The fingerprint of a call's arguments, from their canonical encoding.
pub fn fingerprint_digest(encoded: &[u8]) -> Digest {
    let mut h = Sha256::new();
    h.update(DOMAIN_FINGERPRINT);
    h.update(encoded);
    Digest(h.finalize().into())
}

/// What follows the domain tag in a key's digest, keyed or not.
fn key_parts(mut update: impl FnMut(&[u8]), namespace: &str, scope: Option<&[u8]>, key: &[u8]) {
    update(&(namespace.len() as u64).to_be_bytes());
    update(namespace.as_bytes());
    match scope {
        None => update(&[tag::NONE]),
        Some(scope) => {
            update(&[tag::SOME]);
            update(scope);
        }
    }
    update(key);
}

/// Keyed digests (feature `keyed-digests`): HMAC-SHA256 under a secret in place of SHA-256, so
/// that someone who reads the store cannot confirm a guessed low-entropy key (an order number)
/// by hashing it. The same canonical encoding under new domain tags (`v2-hmac`): a keyed digest
/// never equals an unkeyed one.
///
/// ```
/// # extern crate idem_runtime as idem;
/// let secret = idem::key::DigestSecret::new(&[0x5a; 32])?;
/// let idem = idem::Idem::memory().with_digest_secret(secret);
/// # Ok::<_, idem::Error>(())
/// ```
#[cfg(feature = "keyed-digests")]
#[cfg_attr(docsrs, doc(cfg(feature = "keyed-digests")))]
#[derive(Clone)]
pub struct DigestSecret(hmac::Hmac<Sha256>);

#[cfg(feature = "keyed-digests")]
impl fmt::Debug for DigestSecret {
    /// Never the secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestSecret(..)")
    }
}

/// Domain tag of keyed call keys (HMAC-SHA256), version 2.
#[cfg(feature = "keyed-digests")]
const DOMAIN_KEY_HMAC: &[u8] = b"idem\0key\0v2-hmac\0";
/// Domain tag of keyed fingerprints (HMAC-SHA256), version 2.
#[cfg(feature = "keyed-digests")]
const DOMAIN_FINGERPRINT_HMAC: &[u8] = b"idem\0fp\0v2-hmac\0";
/// The shortest secret accepted: 128 bits.
#[cfg(feature = "keyed-digests")]
#[cfg_attr(docsrs, doc(cfg(feature = "keyed-digests")))]
pub const MIN_DIGEST_SECRET_LEN: usize = 16;

#[cfg(feature = "keyed-digests")]
impl DigestSecret {
    /// A secret of at least [`MIN_DIGEST_SECRET_LEN`] bytes (32 random bytes is right); a
    /// shorter one is [`crate::error::Error::Config`]. Every instance sharing a store must use the
    /// same secret, and changing it changes every key (records under the old one are not
    /// found: the bodies run again).
    pub fn new(secret: &[u8]) -> Result<DigestSecret, crate::error::Error> {
        use hmac::Mac as _;
        if secret.len() < MIN_DIGEST_SECRET_LEN {
            return Err(crate::error::Error::config(format!(
                "the digest secret must be at least {MIN_DIGEST_SECRET_LEN} bytes"
            )));
        }
        hmac::Hmac::<Sha256>::new_from_slice(secret)
            .map(DigestSecret)
            .map_err(|e| crate::error::Error::config(format!("the digest secret: {e}")))
    }

    /// A secret given as hex (what an operator's tool reads from its command line or its
    /// environment): an even number of hex digits, at least [`MIN_DIGEST_SECRET_LEN`] bytes.
    pub fn from_hex(hex: &str) -> Result<DigestSecret, crate::error::Error> {
        let hex = hex.trim();
        if hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(crate::error::Error::config(
                "the digest secret in hex: an even number of hex digits (0-9, a-f)",
            ));
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| crate::error::Error::config(format!("the digest secret in hex: {e}")))?;
        DigestSecret::new(&bytes)
    }

    /// [`key_digest`] under this secret.
    pub fn key_digest(&self, namespace: &str, scope: Option<&[u8]>, key: &[u8]) -> Digest {
        use hmac::Mac as _;
        let mut m = self.0.clone();
        m.update(DOMAIN_KEY_HMAC);
        key_parts(|b| m.update(b), namespace, scope, key);
        Digest(m.finalize().into_bytes().into())
    }

    /// [`fingerprint_digest`] under this secret.
    pub fn fingerprint_digest(&self, encoded: &[u8]) -> Digest {
        use hmac::Mac as _;
        let mut m = self.0.clone();
        m.update(DOMAIN_FINGERPRINT_HMAC);
        m.update(encoded);
        Digest(m.finalize().into_bytes().into())
    }
}

struct Canon<'a> {
    out: &'a mut Vec<u8>,
}

impl Canon<'_> {
    fn len(&mut self, n: usize) {
        self.out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    // A tag and what follows it in one write: one capacity check, not two (keys are encoded
    // on every call).
    fn str(&mut self, s: &str) {
        self.tagged(tag::STR, (s.len() as u64).to_be_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }
    fn int(&mut self, v: i128) {
        self.tagged(tag::INT, v.to_be_bytes());
    }
    fn tagged<const N: usize>(&mut self, tag: u8, bytes: [u8; N]) {
        let mut head = [tag; 17];
        head[1..=N].copy_from_slice(&bytes);
        self.out.extend_from_slice(&head[..=N]);
    }
}

/// A sequence whose length may be unknown up front: the count is patched in at the end.
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    count_at: usize,
    count: u64,
}

impl<'a> Seq<'a> {
    fn start(out: &'a mut Vec<u8>, head: &[u8]) -> Self {
        out.extend_from_slice(head);
        out.push(tag::SEQ);
        let count_at = out.len();
        out.extend_from_slice(&[0; 8]);
        Seq {
            out,
            count_at,
            count: 0,
        }
    }
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.count += 1;
        v.serialize(Canon { out: self.out })
    }
    fn finish(self) {
        self.out[self.count_at..self.count_at + 8].copy_from_slice(&self.count.to_be_bytes());
    }
}

/// A map (or struct): entries are buffered and sorted so that iteration order never matters.
struct Map<'a> {
    out: &'a mut Vec<u8>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    pending_key: Option<Vec<u8>>,
}

/// The most map entries reserved up front from a length hint.
const MAX_PREALLOCATED_ENTRIES: usize = 64;

impl<'a> Map<'a> {
    fn start(out: &'a mut Vec<u8>, head: &[u8], len: Option<usize>) -> Self {
        out.extend_from_slice(head);
        Map {
            out,
            // The length is the `Serialize` impl's hint, not a promise: a huge one must not
            // allocate (or abort) before a single entry exists.
            entries: Vec::with_capacity(len.unwrap_or(4).min(MAX_PREALLOCATED_ENTRIES)),
            pending_key: None,
        }
    }
    fn field<T: Serialize + ?Sized>(&mut self, name: &str, v: &T) -> Result<(), EncodeError> {
        let mut k = Vec::with_capacity(name.len() + 9);
        Canon { out: &mut k }.str(name);
        self.entries.push((k, canonical(v)?));
        Ok(())
    }
    fn finish(mut self) {
        self.entries.sort_unstable();
        self.out.push(tag::MAP);
        self.out
            .extend_from_slice(&(self.entries.len() as u64).to_be_bytes());
        for (k, v) in &self.entries {
            self.out.extend_from_slice(k);
            self.out.extend_from_slice(v);
        }
    }
}

fn variant_head(t: u8, variant: &str) -> Vec<u8> {
    let mut head = vec![t];
    Canon { out: &mut head }.str(variant);
    head
}

impl<'a> ser::Serializer for Canon<'a> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Map<'a>;
    type SerializeStruct = Map<'a>;
    type SerializeStructVariant = Map<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), EncodeError> {
        self.out.extend_from_slice(&[tag::BOOL, v as u8]);
        Ok(())
    }
    fn serialize_i8(mut self, v: i8) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_i16(mut self, v: i16) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_i32(mut self, v: i32) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_i64(mut self, v: i64) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_i128(mut self, v: i128) -> Result<(), EncodeError> {
        self.int(v);
        Ok(())
    }
    fn serialize_u8(mut self, v: u8) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_u16(mut self, v: u16) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_u32(mut self, v: u32) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_u64(mut self, v: u64) -> Result<(), EncodeError> {
        self.int(v.into());
        Ok(())
    }
    fn serialize_u128(mut self, v: u128) -> Result<(), EncodeError> {
        match i128::try_from(v) {
            Ok(v) => self.int(v),
            Err(_) => {
                self.out.push(tag::BIG_UINT);
                self.out.extend_from_slice(&v.to_be_bytes());
            }
        }
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), EncodeError> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), EncodeError> {
        // One bit pattern per number: -0.0 is 0.0, every NaN is the same NaN.
        let v = if v == 0.0 {
            0.0
        } else if v.is_nan() {
            f64::NAN
        } else {
            v
        };
        self.out.push(tag::FLOAT);
        self.out.extend_from_slice(&v.to_bits().to_be_bytes());
        Ok(())
    }
    fn serialize_char(mut self, v: char) -> Result<(), EncodeError> {
        self.str(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(mut self, v: &str) -> Result<(), EncodeError> {
        self.str(v);
        Ok(())
    }
    fn serialize_bytes(mut self, v: &[u8]) -> Result<(), EncodeError> {
        self.out.push(tag::BYTES);
        self.len(v.len());
        self.out.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), EncodeError> {
        self.out.push(tag::NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), EncodeError> {
        self.out.push(tag::SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), EncodeError> {
        self.out.push(tag::UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), EncodeError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), EncodeError> {
        self.out
            .extend_from_slice(&variant_head(tag::UNIT_VARIANT, variant));
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        self.out
            .extend_from_slice(&variant_head(tag::NEWTYPE_VARIANT, variant));
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, EncodeError> {
        Ok(Seq::start(self.out, &[]))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, EncodeError> {
        Ok(Seq::start(self.out, &[]))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, EncodeError> {
        Ok(Seq::start(self.out, &[]))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, EncodeError> {
        Ok(Seq::start(
            self.out,
            &variant_head(tag::TUPLE_VARIANT, variant),
        ))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Map<'a>, EncodeError> {
        Ok(Map::start(self.out, &[], len))
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Map<'a>, EncodeError> {
        Ok(Map::start(self.out, &[], Some(len)))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Map<'a>, EncodeError> {
        Ok(Map::start(
            self.out,
            &variant_head(tag::STRUCT_VARIANT, variant),
            Some(len),
        ))
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.element(v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.element(v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.element(v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        self.element(v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), EncodeError> {
        self.pending_key = Some(canonical(key)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), EncodeError> {
        let key = self
            .pending_key
            .take()
            .ok_or_else(|| EncodeError("map value serialized before its key".into()))?;
        self.entries.push((key, canonical(v)?));
        Ok(())
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeStruct for Map<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        v: &T,
    ) -> Result<(), EncodeError> {
        self.field(name, v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

impl ser::SerializeStructVariant for Map<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        v: &T,
    ) -> Result<(), EncodeError> {
        self.field(name, v)
    }
    fn end(self) -> Result<(), EncodeError> {
        self.finish();
        Ok(())
    }
}

/// What one call is keyed by, as canonical bytes, gathered by the builders of
/// [`crate::Call`] and of the PostgreSQL transactional mode, so both compute one key alike.
#[derive(Debug, Default)]
pub(crate) struct KeyParts {
    /// The key's and the fingerprint's encodings, one after the other in one buffer: one
    /// allocation for both.
    bytes: Vec<u8>,
    key: Option<Range<usize>>,
    fingerprint: Option<Range<usize>>,
    pub(crate) scope: Option<Vec<u8>>,
    /// The first value that did not encode: builders cannot fail, so it is reported at `run`.
    /// Boxed: rare, and the builder is moved by value.
    pub(crate) error: Option<Box<crate::error::Error>>,
}

impl KeyParts {
    /// Sets the key of a call in namespace `name`.
    pub(crate) fn set_key<T: Serialize + ?Sized>(&mut self, name: &str, v: &T) {
        self.key = self.append(name, "key", v);
    }

    /// Sets the fingerprint of a call in namespace `name`.
    pub(crate) fn set_fingerprint<T: Serialize + ?Sized>(&mut self, name: &str, v: &T) {
        self.fingerprint = self.append(name, "fingerprint", v);
    }

    /// Sets the scope of a call in namespace `name`.
    pub(crate) fn set_scope<T: Serialize + ?Sized>(&mut self, name: &str, v: &T) {
        self.scope = match canonical(v) {
            Ok(b) => Some(b),
            Err(e) => {
                self.keep(name, "scope", e);
                None
            }
        };
    }

    /// Appends the canonical bytes of `v` and returns where they are, or `None` with the error
    /// kept for later. (A value set twice leaves its first bytes unused in the buffer.)
    fn append<T: Serialize + ?Sized>(
        &mut self,
        name: &str,
        what: &str,
        v: &T,
    ) -> Option<Range<usize>> {
        if self.bytes.capacity() == 0 {
            // Room for an id and a few arguments: what `canonical` reserves, for two values.
            self.bytes.reserve(128);
        }
        let start = self.bytes.len();
        match v.serialize(Canon {
            out: &mut self.bytes,
        }) {
            Ok(()) => Some(start..self.bytes.len()),
            Err(e) => {
                self.bytes.truncate(start);
                self.keep(name, what, e);
                None
            }
        }
    }

    fn keep(&mut self, name: &str, what: &str, e: EncodeError) {
        self.error.get_or_insert_with(|| {
            Box::new(crate::error::Error::Key(format!("{what} of {name}: {e}")))
        });
    }

    /// The digests' inputs: namespace `name`, scope, key and fingerprint bytes, or the error
    /// a builder kept, or `Config` when no key was given.
    pub(crate) fn inputs<'a>(
        &'a mut self,
        name: &'a str,
    ) -> Result<MemoQuery<'a>, crate::error::Error> {
        if let Some(e) = self.error.take() {
            return Err(*e);
        }
        self.query(name).ok_or_else(|| {
            crate::error::Error::Config(format!("idempotent call {name} has no key"))
        })
    }

    /// The digests' inputs in namespace `name`, `None` without a key.
    pub(crate) fn query<'a>(&'a self, name: &'a str) -> Option<MemoQuery<'a>> {
        Some(MemoQuery {
            namespace: name,
            scope: self.scope.as_deref(),
            key: &self.bytes[self.key.clone()?],
            fingerprint: self.fingerprint.clone().map(|f| &self.bytes[f]),
        })
    }
}

/// What a call's two digests are computed from: a pure function of these bytes (and of the
/// handle's secret, fixed per handle), so a [`DigestMemo`] may answer for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoQuery<'a> {
    namespace: &'a str,
    scope: Option<&'a [u8]>,
    key: &'a [u8],
    /// `None`: the fingerprint is the key's.
    fingerprint: Option<&'a [u8]>,
}

impl MemoQuery<'_> {
    /// The key's and the fingerprint's digests; with `secret` (feature `keyed-digests`), keyed
    /// digests instead.
    pub(crate) fn digests(
        &self,
        #[cfg(feature = "keyed-digests")] secret: Option<&DigestSecret>,
    ) -> (Digest, Digest) {
        let (name, key) = (self.namespace, self.key);
        let fingerprint = self.fingerprint.unwrap_or(key);
        #[cfg(feature = "keyed-digests")]
        if let Some(secret) = secret {
            return (
                secret.key_digest(name, self.scope, key),
                secret.fingerprint_digest(fingerprint),
            );
        }
        (
            key_digest(name, self.scope, key),
            fingerprint_digest(fingerprint),
        )
    }

    /// Whether the memo keeps these inputs: not a long key, so that the memo's memory stays
    /// bounded by its entry count.
    fn memoised(&self) -> bool {
        let len = self.namespace.len()
            + self.scope.map_or(0, <[u8]>::len)
            + self.key.len()
            + self.fingerprint.map_or(0, <[u8]>::len);
        len <= MEMO_MAX_INPUT
    }
}

// Hashed on every call: two writes, not the derived ten (a length, a tag or a separator per
// field). Equal queries hash alike; which fields are equal is for `eq` to tell. The key and
// namespace pick the slot: a key seen with two fingerprints (a mismatch) is rare enough to
// share one.
impl std::hash::Hash for MemoQuery<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.key);
        state.write(self.namespace.as_bytes());
    }
}

/// The owned [`MemoQuery`] a [`DigestMemo`] keeps.
#[derive(Debug)]
struct MemoKey {
    namespace: Box<str>,
    scope: Option<Box<[u8]>>,
    key: Box<[u8]>,
    fingerprint: Option<Box<[u8]>>,
}

impl MemoKey {
    fn query(&self) -> MemoQuery<'_> {
        MemoQuery {
            namespace: &self.namespace,
            scope: self.scope.as_deref(),
            key: &self.key,
            fingerprint: self.fingerprint.as_deref(),
        }
    }
}

/// How many calls' digests a thread remembers (a power of two: a slot is a hash's low bits).
const MEMO_ENTRIES: usize = 512;
/// The longest inputs (namespace, scope, key and fingerprint bytes) a memo keeps.
const MEMO_MAX_INPUT: usize = 256;

/// A handle's memo of the digests of keys it replayed: a replay repeats its key and arguments
/// by definition, and the two SHA-256 (or HMAC) digests are most of a replay's work. Exact: an
/// entry answers only for byte-for-byte the same inputs, under the same memo (one per handle
/// configuration, so under the handle's one secret).
///
/// The entries are the thread's, not the handle's: a replay reads them without a lock (two
/// atomic operations fewer per call, and no line shared between cores), and a thread's table
/// serves every handle on it, each entry tagged with its memo's id. Ids come from a counter,
/// never from an address, so an entry of a dropped handle can never answer for another.
/// Bounded per thread: [`MEMO_ENTRIES`] entries of at most [`MEMO_MAX_INPUT`] bytes.
///
/// Direct-mapped, as a CPU cache is: a query has one slot, and a put replaces what the slot
/// held. A miss only costs the digests the call computes anyway, so no eviction policy is worth
/// its bookkeeping on every call (nor a cache crate's place in the dependency budget).
///
/// A clone answers for the same entries: a handle's configuration is cloned whole, and one
/// that changes a setting is given a new memo (`Idem::reconfigured`).
#[derive(Debug, Clone)]
pub(crate) struct DigestMemo {
    id: u64,
}

impl Default for DigestMemo {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        DigestMemo {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One slot: the memo and the inputs it answers for, and their digests.
struct Slot {
    memo: u64,
    inputs: MemoKey,
    digests: (Digest, Digest),
}

/// A thread's slots, allocated at its first put.
#[derive(Default)]
struct Slots {
    slots: Vec<Option<Slot>>,
    hasher: foldhash::fast::RandomState,
}

impl Slots {
    fn index(&self, query: &MemoQuery<'_>) -> usize {
        self.hasher.hash_one(query) as usize & (MEMO_ENTRIES - 1)
    }
}

thread_local! {
    static SLOTS: RefCell<Slots> = RefCell::default();
}

impl DigestMemo {
    /// The digests of `query` if remembered.
    pub(crate) fn get(&self, query: &MemoQuery<'_>) -> Option<(Digest, Digest)> {
        let found = SLOTS.try_with(|slots| {
            let slots = slots.try_borrow().ok()?;
            let slot = slots.slots.get(slots.index(query))?.as_ref()?;
            (slot.memo == self.id && slot.inputs.query() == *query).then_some(slot.digests)
        });
        // At a thread's exit the table is gone: a miss.
        found.ok().flatten()
    }

    /// Remembers the digests of `query` (computed from it under this handle's secret).
    pub(crate) fn put(&self, query: &MemoQuery<'_>, digests: (Digest, Digest)) {
        if !query.memoised() {
            return;
        }
        let slot = Slot {
            memo: self.id,
            inputs: MemoKey {
                namespace: query.namespace.into(),
                scope: query.scope.map(Into::into),
                key: query.key.into(),
                fingerprint: query.fingerprint.map(Into::into),
            },
            digests,
        };
        let _ = SLOTS.try_with(|slots| {
            let Ok(mut slots) = slots.try_borrow_mut() else {
                return;
            };
            if slots.slots.is_empty() {
                slots.slots.resize_with(MEMO_ENTRIES, || None);
            }
            let i = slots.index(query);
            slots.slots[i] = Some(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::{BTreeMap, HashMap};

    /// The memo answers only for byte-for-byte the same inputs, with the digests computed
    /// from them: another namespace, scope, key or fingerprint, or a fingerprint set to the
    /// key's bytes rather than left to default to them, is a miss.
    #[test]
    fn the_digest_memo_answers_only_for_the_same_inputs() {
        let memo = DigestMemo::default();
        let (k, k2, s) = (
            canonical(&7u64).unwrap(),
            canonical(&8u64).unwrap(),
            canonical("t").unwrap(),
        );
        let q = |namespace, scope, key, fingerprint| MemoQuery {
            namespace,
            scope,
            key,
            fingerprint,
        };
        let query = q("n", Some(&s[..]), &k[..], Some(&k2[..]));
        let digests = query.digests(
            #[cfg(feature = "keyed-digests")]
            None,
        );
        assert_eq!(
            digests,
            (key_digest("n", Some(&s), &k), fingerprint_digest(&k2))
        );
        memo.put(&query, digests);
        assert_eq!(memo.get(&query), Some(digests));
        // Another handle's memo (another secret, say) shares this thread's table, not its
        // entries.
        assert_eq!(DigestMemo::default().get(&query), None);
        // Another thread has its own table.
        std::thread::scope(|t| {
            t.spawn(|| assert_eq!(memo.get(&query), None));
        });
        for other in [
            q("m", Some(&s[..]), &k[..], Some(&k2[..])),
            q("n", None, &k[..], Some(&k2[..])),
            q("n", Some(&s[..]), &k2[..], Some(&k2[..])),
            q("n", Some(&s[..]), &k[..], Some(&k[..])),
            q("n", Some(&s[..]), &k[..], None),
        ] {
            assert_eq!(memo.get(&other), None, "{other:?}");
        }
        // Inputs above the bound are not kept.
        let long = vec![0u8; MEMO_MAX_INPUT];
        let big = q("n", None, &long, None);
        memo.put(&big, digests);
        assert_eq!(memo.get(&big), None);
    }

    fn digest_of<T: Serialize + ?Sized>(ns: &str, scope: Option<&str>, key: &T) -> String {
        let scope = scope.map(|s| canonical(s).unwrap());
        key_digest(ns, scope.as_deref(), &canonical(key).unwrap()).to_hex()
    }

    /// A `Serialize` impl whose length hint is far larger than what it serializes: the hint
    /// reserves nothing out of bounds, and the key is the one of the real entries.
    #[test]
    fn a_lying_map_length_hint_allocates_nothing_out_of_bounds() {
        use serde::ser::SerializeMap;
        struct Lying;
        impl Serialize for Lying {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(usize::MAX / 2))?;
                m.serialize_entry("a", &1u8)?;
                m.end()
            }
        }
        let honest: BTreeMap<&str, u8> = [("a", 1)].into();
        assert_eq!(canonical(&Lying).unwrap(), canonical(&honest).unwrap());
    }

    /// Golden vectors: these strings must never change. A change here means every stored key
    /// of every user silently stops matching after an upgrade.
    #[test]
    fn golden_vectors() {
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
        let charge = Charge {
            order: 42,
            amount_cents: -1999,
            currency: "EUR",
            tags: [("vip", true), ("b2b", false)].into_iter().collect(),
            note: None,
        };
        let vectors: [(&str, String); 6] = [
            (GOLDEN[0], hex(&canonical(&(1u8, "a")).unwrap())),
            (GOLDEN[1], digest_of("charge", None, "k-1")),
            (
                GOLDEN[2],
                digest_of("charges.v1", Some("tenant-7"), &charge),
            ),
            (
                GOLDEN[3],
                digest_of("monthly-invoice", None, &(17u32, (2026u16, 11u8))),
            ),
            (
                GOLDEN[4],
                digest_of("refund", None, &Kind::Refund { of: 3 }),
            ),
            (
                GOLDEN[5],
                fingerprint_digest(&canonical(&(0.5f64, vec![b'x'; 3], ())).unwrap()).to_hex(),
            ),
        ];
        for (i, (want, got)) in vectors.iter().enumerate() {
            assert_eq!(want, got, "golden vector {i} changed");
        }
    }

    const GOLDEN: [&str; 6] = [
        "090000000000000002040000000000000000000000000000000107000000000000000161",
        "7bc032cb96f85e28cc8ccd773b4aa376dc6acb25ed8894bcb5f265f27e30813e",
        "60d18d210edcd1d42dd80a245e545ad3bf1d7b691e45295030157baaa66fd436",
        "80abfc9313c6ad4aea072ab743978cccd930dc8a862b8128bf474852f5575200",
        "30767244ac39a4b0c0d66c72fc27a997687528196c2b14b58d0ad7302dfcd774",
        "900cdd56319b169e890a3f8fe48c31b65377a42d84a84190ed499b1b88927799",
    ];

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Pins the keyed digests (HMAC-SHA256 under the secret 0x5a × 32). The vectors were
    /// computed independently with Python's `hmac` over the documented layout: the domain tag
    /// `idem\0key\0v2-hmac\0` (or `idem\0fp\0v2-hmac\0`), then what the unkeyed digest hashes.
    #[cfg(feature = "keyed-digests")]
    #[test]
    fn keyed_golden_vectors() {
        let secret = DigestSecret::new(&[0x5a; 32]).unwrap();
        let k1 = canonical("k-1").unwrap();
        let tenant = canonical("tenant-7").unwrap();
        assert_eq!(
            secret.key_digest("charge", None, &k1).to_hex(),
            "855050c1001afce73c2a09e0eea1d04c6aaef40533f4d3a4fc2947d78cd57e27"
        );
        assert_eq!(
            secret.key_digest("charges.v1", Some(&tenant), &k1).to_hex(),
            "14de621d46f38dbe0471ad1939763b22fc378aebf41e027519fd2166a5c6a8eb"
        );
        assert_eq!(
            secret.fingerprint_digest(&k1).to_hex(),
            "6aad37d8ffb8f371fa28c1218753d832df9905c64144cf4f7bdf395c5bc3f835"
        );
        // Never the unkeyed digest; another secret, another digest; a short secret refused.
        assert_ne!(
            secret.key_digest("charge", None, &k1).to_hex(),
            digest_of("charge", None, "k-1")
        );
        let other = DigestSecret::new(&[0x5b; 32]).unwrap();
        assert_ne!(
            other.key_digest("charge", None, &k1),
            secret.key_digest("charge", None, &k1)
        );
        assert!(DigestSecret::new(&[1; 15]).unwrap_err().is_config());
        assert_eq!(format!("{secret:?}"), "DigestSecret(..)");
    }

    #[test]
    fn map_order_does_not_matter() {
        let mut a = HashMap::new();
        let mut b = BTreeMap::new();
        for i in 0..100u32 {
            a.insert(format!("k{i}"), i);
            b.insert(format!("k{i}"), i);
        }
        assert_eq!(canonical(&a).unwrap(), canonical(&b).unwrap());
    }

    #[test]
    fn integer_width_does_not_matter() {
        assert_eq!(canonical(&5u8).unwrap(), canonical(&5i64).unwrap());
        assert_eq!(canonical(&5u128).unwrap(), canonical(&5i16).unwrap());
        assert_ne!(canonical(&u128::MAX).unwrap(), canonical(&-1i128).unwrap());
    }

    #[test]
    fn struct_field_order_does_not_matter_and_newtypes_are_transparent() {
        #[derive(Serialize)]
        struct A {
            x: u32,
            y: &'static str,
        }
        #[derive(Serialize)]
        struct B {
            y: &'static str,
            x: u64,
        }
        #[derive(Serialize)]
        struct Id(u64);
        assert_eq!(
            canonical(&A { x: 1, y: "z" }).unwrap(),
            canonical(&B { y: "z", x: 1 }).unwrap()
        );
        assert_eq!(canonical(&Id(7)).unwrap(), canonical(&7u64).unwrap());
    }

    #[test]
    fn no_value_runs_into_the_next() {
        assert_ne!(
            canonical(&("ab", "c")).unwrap(),
            canonical(&("a", "bc")).unwrap()
        );
        assert_ne!(digest_of("ab", None, "c"), digest_of("a", None, "bc"));
        assert_ne!(digest_of("n", Some("t1"), "k"), digest_of("n", None, "k"));
        assert_ne!(
            digest_of("n", Some("t1"), "k"),
            digest_of("n", Some("t2"), "k")
        );
    }

    #[test]
    fn floats_have_one_encoding() {
        assert_eq!(canonical(&0.0f64).unwrap(), canonical(&-0.0f64).unwrap());
        assert_eq!(
            canonical(&f64::NAN).unwrap(),
            canonical(&-f64::NAN).unwrap()
        );
    }

    #[test]
    fn hex_round_trips() {
        let d = key_digest("n", None, &canonical("k").unwrap());
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(Digest::from_hex("zz"), None);
    }
}
