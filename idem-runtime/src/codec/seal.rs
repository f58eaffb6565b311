//! Encryption at rest (feature `encryption`): stored values sealed with XChaCha20-Poly1305
//! under a [`Keyring`].
//!
//! XChaCha20-Poly1305 rather than AES-256-GCM: its 24-byte nonce can be drawn at random for
//! every value with no practical risk of reuse, however many values a key seals (GCM's 12-byte
//! random nonces are limited to about 2^32 messages per key), and it is constant-time in
//! software on machines without AES instructions.
//!
//! The associated data binds a ciphertext to the record it was written for: the envelope's
//! flags and key id, the key's digest and the namespace. A value copied under another key or
//! namespace, or a header changed, does not decrypt ([`CodecErrorKind::Decrypt`]).

use super::format::FORMAT_SEALED;
use crate::error::{CodecErrorKind, Error};
use crate::key::Digest;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

const NONCE_LEN: usize = 24;
/// Names the associated data's layout, so that a future layout can never be confused with it.
const AAD_DOMAIN: &[u8] = b"idem.value.v2";
/// The longest key id (it is stored in every value).
pub const MAX_KEY_ID_LEN: usize = 64;

/// The keys stored values are encrypted with: new values with the newest key, stored ones
/// opened with whichever key of the ring their header names. Rotation: add a key (it becomes
/// the newest), keep the old ones until every value they sealed has expired (the longest TTL),
/// then drop them.
///
/// ```
/// # extern crate idem_runtime as idem;
/// let ring = idem::Keyring::new("2026-11", [7; 32])?.with_key("2026-12", [9; 32])?;
/// assert_eq!(ring.current_id(), "2026-12");
/// // The same ring from configuration (an environment variable, a secret file): oldest first.
/// let spec = format!("2026-11:{},2026-12:{}", "07".repeat(32), "09".repeat(32));
/// assert_eq!(idem::Keyring::parse(&spec)?.current_id(), "2026-12");
/// # Ok::<_, idem::Error>(())
/// ```
#[derive(Clone)]
pub struct Keyring {
    /// Oldest first; the last is the newest.
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl std::fmt::Debug for Keyring {
    /// The key ids only, never the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field(
                "ids",
                &self.keys.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Keyring {
    /// A ring of one 256-bit key, named `id` in every value it seals (1 to 64 printable ASCII
    /// characters, without `,` or `:`). A bad id is [`Error::Config`].
    pub fn new(id: &str, key: [u8; 32]) -> Result<Keyring, Error> {
        Keyring { keys: Vec::new() }.with_key(id, key)
    }

    /// Adds a key, which becomes the newest: values written from now on are sealed with it.
    /// An id already in the ring, or a bad one, is [`Error::Config`].
    pub fn with_key(mut self, id: &str, key: [u8; 32]) -> Result<Keyring, Error> {
        check_id(id)?;
        if self.keys.iter().any(|(k, _)| k == id) {
            return Err(Error::config(format!(
                "keyring: the key id `{id}` is in the ring twice"
            )));
        }
        self.keys
            .push((id.to_owned(), XChaCha20Poly1305::new(&key.into())));
        Ok(self)
    }

    /// A ring from `id:hex,id:hex,…` (oldest first, each key 64 hex digits): the form for an
    /// environment variable or a secret file, and the CLI's `--keyring`.
    pub fn parse(spec: &str) -> Result<Keyring, Error> {
        let mut ring = Keyring { keys: Vec::new() };
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (id, hex) = part.split_once(':').ok_or_else(|| {
                Error::config("keyring: expected `id:hex` (a key id, a colon, 64 hex digits)")
            })?;
            let key = Digest::from_hex(hex.trim()).ok_or_else(|| {
                Error::config(format!("keyring: the key `{id}` is not 64 hex digits"))
            })?;
            ring = ring.with_key(id.trim(), key.0)?;
        }
        if ring.keys.is_empty() {
            return Err(Error::config("keyring: no key"));
        }
        Ok(ring)
    }

    /// The id of the newest key, which seals new values.
    pub fn current_id(&self) -> &str {
        self.keys.last().map_or("", |(id, _)| id)
    }

    /// Every key id in the ring, oldest first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }

    /// Seals `plaintext` with the newest key and a random nonce.
    pub(crate) fn seal(
        &self,
        flags: u8,
        name: &str,
        key: &Digest,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, Error> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        self.seal_with(flags, name, key, plaintext, &nonce)
    }

    fn seal_with(
        &self,
        flags: u8,
        name: &str,
        key: &Digest,
        plaintext: &[u8],
        nonce: &XNonce,
    ) -> Result<Vec<u8>, Error> {
        let (id, cipher) = self
            .keys
            .last()
            .ok_or_else(|| Error::config("keyring: no key"))?;
        let aad = associated_data(flags, id, name, key);
        let sealed = cipher
            .encrypt(
                nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                Error::codec(
                    CodecErrorKind::Encode,
                    "value",
                    "XChaCha20-Poly1305 refused the value".into(),
                )
            })?;
        let mut out = Vec::with_capacity(3 + id.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(&[FORMAT_SEALED, flags, id.len() as u8]);
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Opens the body of a sealed value (after the format and flags bytes).
    pub(crate) fn open(
        &self,
        type_name: &'static str,
        flags: u8,
        name: &str,
        key: &Digest,
        body: &[u8],
    ) -> Result<Vec<u8>, Error> {
        let corrupt = || {
            Error::codec(
                CodecErrorKind::Corrupt,
                type_name,
                "the encrypted value's header is cut short".into(),
            )
        };
        let (&n, rest) = body.split_first().ok_or_else(corrupt)?;
        let n = usize::from(n);
        if rest.len() < n + NONCE_LEN {
            return Err(corrupt());
        }
        let (id, rest) = rest.split_at(n);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let id = std::str::from_utf8(id).map_err(|_| corrupt())?;
        let Some((_, cipher)) = self.keys.iter().find(|(k, _)| k == id) else {
            return Err(Error::codec(
                CodecErrorKind::UnknownKey,
                type_name,
                format!(
                    "the value is encrypted with the key id `{id}`, which is not in the keyring \
                     ({:?})",
                    self.ids().collect::<Vec<_>>()
                ),
            ));
        };
        let aad = associated_data(flags, id, name, key);
        cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                Error::codec(
                    CodecErrorKind::Decrypt,
                    type_name,
                    format!(
                        "the value does not decrypt with the key `{id}` for this key and \
                         namespace: tampered with, or copied from another record"
                    ),
                )
            })
    }
}

/// Domain, flags, key id (length-prefixed), the key's digest, then the namespace: every part
/// but the last has a known length, so no two records share associated data.
fn associated_data(flags: u8, id: &str, name: &str, key: &Digest) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_DOMAIN.len() + 2 + id.len() + 32 + name.len());
    aad.extend_from_slice(AAD_DOMAIN);
    aad.extend_from_slice(&[flags, id.len() as u8]);
    aad.extend_from_slice(id.as_bytes());
    aad.extend_from_slice(&key.0);
    aad.extend_from_slice(name.as_bytes());
    aad
}

fn check_id(id: &str) -> Result<(), Error> {
    let printable = id
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b',' && b != b':');
    if id.is_empty() || id.len() > MAX_KEY_ID_LEN || !printable {
        return Err(Error::config(format!(
            "keyring: the key id `{id}` must be 1 to {MAX_KEY_ID_LEN} printable ASCII characters \
             without `,` or `:`"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::envelope::Codec;
    use super::super::format::{FLAG_SEALED, FLAG_ZSTD};
    use super::*;
    use std::sync::Arc;

    fn codec(ring: Keyring) -> Codec {
        let mut codec = Codec::new(None);
        codec.keyring = Some(Arc::new(ring));
        codec
    }

    fn kind(r: Result<impl std::fmt::Debug, Error>) -> CodecErrorKind {
        match r {
            Err(Error::Codec(e)) => e.kind,
            other => panic!("{other:?}"),
        }
    }

    const K: Digest = Digest([3; 32]);

    #[test]
    fn round_trip_and_binding() {
        let c = codec(Keyring::new("a", [1; 32]).unwrap());
        let plain = crate::codec::encode_ok(&"4242").unwrap();
        let stored = c.seal("T", "charges", &K, plain.clone()).unwrap();
        assert_eq!(stored[..2], [FORMAT_SEALED, FLAG_SEALED]);
        assert!(!stored.windows(4).any(|w| w == b"4242"), "plaintext leaked");
        assert_eq!(&*c.open("T", "charges", &K, &stored).unwrap(), &plain[..]);
        // Moved to another key, or another namespace: refused.
        assert_eq!(
            kind(c.open("T", "charges", &Digest([4; 32]), &stored)),
            CodecErrorKind::Decrypt
        );
        assert_eq!(
            kind(c.open("T", "refunds", &K, &stored)),
            CodecErrorKind::Decrypt
        );
        // A flipped flag (claiming compression) or a flipped ciphertext bit: refused.
        let mut flipped = stored.clone();
        flipped[1] |= FLAG_ZSTD;
        assert_eq!(
            kind(c.open("T", "charges", &K, &flipped)),
            CodecErrorKind::Decrypt
        );
        let mut flipped = stored.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(
            kind(c.open("T", "charges", &K, &flipped)),
            CodecErrorKind::Decrypt
        );
        // Cut short: corrupt, never a panic.
        for cut in 2..30 {
            let r = c.open("T", "charges", &K, &stored[..cut]);
            assert!(matches!(r, Err(Error::Codec(_))), "{cut}");
        }
        // Two seals of one value differ (random nonces).
        assert_ne!(stored, c.seal("T", "charges", &K, plain).unwrap());
    }

    #[test]
    fn rotation_and_unknown_keys() {
        let old = codec(Keyring::new("a", [1; 32]).unwrap());
        let plain = crate::codec::encode_ok(&1u8).unwrap();
        let by_a = old.seal("T", "n", &K, plain.clone()).unwrap();
        let both = codec(
            Keyring::new("a", [1; 32])
                .unwrap()
                .with_key("b", [2; 32])
                .unwrap(),
        );
        let by_b = both.seal("T", "n", &K, plain.clone()).unwrap();
        assert_eq!(&by_b[3..4], b"b", "new writes use the newest key");
        assert_eq!(&*both.open("T", "n", &K, &by_a).unwrap(), &plain[..]);
        assert_eq!(&*both.open("T", "n", &K, &by_b).unwrap(), &plain[..]);
        // The old ring does not know `b`; a ring that dropped `a` does not know `a`.
        assert_eq!(
            kind(old.open("T", "n", &K, &by_b)),
            CodecErrorKind::UnknownKey
        );
        let only_b = codec(Keyring::new("b", [2; 32]).unwrap());
        assert_eq!(
            kind(only_b.open("T", "n", &K, &by_a)),
            CodecErrorKind::UnknownKey
        );
        // A key named `a` that is not the key `a`: does not decrypt.
        let wrong = codec(Keyring::new("a", [9; 32]).unwrap());
        assert_eq!(
            kind(wrong.open("T", "n", &K, &by_a)),
            CodecErrorKind::Decrypt
        );
        // No keyring at all.
        assert_eq!(
            kind(Codec::new(None).open("T", "n", &K, &by_a)),
            CodecErrorKind::UnknownKey
        );
        assert_eq!(
            super::super::envelope::describe_sealed(&by_a).unwrap(),
            "encrypted (key id `a`)"
        );
    }

    #[test]
    fn bad_rings_are_config_errors() {
        for id in ["", "a,b", "a:b", "é", &"x".repeat(65)] {
            assert!(Keyring::new(id, [0; 32]).unwrap_err().is_config(), "{id}");
        }
        let dup = Keyring::new("a", [0; 32]).unwrap().with_key("a", [1; 32]);
        assert!(dup.unwrap_err().is_config());
        for spec in ["", "a", "a:00", "a:zz", ","] {
            assert!(Keyring::parse(spec).unwrap_err().is_config(), "{spec}");
        }
        let ring =
            Keyring::parse(&format!("a:{}, b:{}", "00".repeat(32), "ff".repeat(32))).unwrap();
        assert_eq!(ring.ids().collect::<Vec<_>>(), ["a", "b"]);
        assert!(!format!("{ring:?}").contains("ff"), "{ring:?}");
    }

    /// Pins the sealed format: a value written today opens after an upgrade. (Fixed key, nonce,
    /// namespace and key digest; XChaCha20-Poly1305 is deterministic given those.) The vector
    /// was checked against an independent computation: HChaCha20 by hand, then the IETF
    /// ChaCha20-Poly1305 of Python's `cryptography`, over the associated data laid out as
    /// `associated_data` documents.
    #[test]
    fn golden_vector() {
        let ring = Keyring::new("k1", [0x42; 32]).unwrap();
        let plain = crate::codec::encode_ok(&"4242").unwrap();
        let nonce = XNonce::from([0x24; NONCE_LEN]);
        let stored = ring
            .seal_with(FLAG_SEALED, "charges.v1", &K, &plain, &nonce)
            .unwrap();
        let hex: String = stored.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN);
        let c = codec(ring);
        assert_eq!(
            &*c.open("T", "charges.v1", &K, &stored).unwrap(),
            &plain[..]
        );
    }

    const GOLDEN: &str = "0202026b31242424242424242424242424242424242424242424242424a431f5515c107e84f9c864175cdf02119ec51e3533cb75d0";
}
