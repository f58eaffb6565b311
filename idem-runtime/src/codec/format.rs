//! The tags at the head of a stored value: its format byte and, in the envelope, its flags.
//! Both the plain codec and the envelope read them; kept apart so that neither reaches into the
//! other.

/// Format version written in the first byte of every plain stored value.
pub(crate) const FORMAT_V1: u8 = 1;
/// The envelope's format byte.
pub(crate) const FORMAT_SEALED: u8 = 2;
/// The body is a zstd frame.
pub(crate) const FLAG_ZSTD: u8 = 1;
/// The body is sealed with a key of the keyring.
pub(crate) const FLAG_SEALED: u8 = 2;
