//! `idem::Error`: every way an idempotent call can fail without the body's own error.

use std::fmt;
use std::time::Duration;

/// Boxed source of a store failure.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An idempotency failure. It reaches the caller of an `#[idempotent]` function as
/// `E::from(idem::Error)`.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Another attempt with the same key is running (its lease is live), and this call did not
    /// wait for it (or waited `wait` and it had not finished).
    InProgress {
        /// The namespace (`name = …`, by default the function's name).
        name: String,
        /// The hex digest of the key ([`crate::current_key`] of the running attempt).
        key: String,
        /// How long, at most, until the running attempt's lease lapses.
        retry_after: Option<Duration>,
    },
    /// The key was used before with other arguments (another fingerprint): a key reused for a
    /// different request. The body did not run.
    Mismatch {
        /// The namespace.
        name: String,
        /// The hex digest of the key.
        key: String,
    },
    /// This attempt outlived its lease and another attempt took the key over: its completion
    /// (or release) was refused by the fencing token. The body's effects happened, but its
    /// result was not stored.
    LeaseLost {
        /// The namespace.
        name: String,
        /// The hex digest of the key.
        key: String,
        /// The fencing token this attempt held.
        token: u64,
    },
    /// A result could not be encoded, or a stored result does not decode into the return type.
    Codec(CodecError),
    /// The key, scope or fingerprint could not be serialized.
    Key(String),
    /// The store failed: unreachable, refused the statement, timed out.
    Store(StoreError),
    /// A misconfiguration: no installed handle, a bad table name, a bad URL.
    Config(String),
}

impl Error {
    /// A store error from any source.
    pub fn store(backend: &'static str, op: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Store(StoreError {
            backend,
            op,
            source: source.into(),
        })
    }

    /// True for [`Error::InProgress`].
    pub fn is_in_progress(&self) -> bool {
        matches!(self, Error::InProgress { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InProgress {
                name,
                key,
                retry_after,
            } => {
                write!(f, "idempotent call {name}/{key} is already in progress")?;
                if let Some(d) = retry_after {
                    write!(f, "; retry after {} ms", d.as_millis())?;
                }
                Ok(())
            }
            Error::Mismatch { name, key } => write!(
                f,
                "idempotency key {name}/{key} was already used with other arguments; \
                 use a new key for a different request"
            ),
            Error::LeaseLost { name, key, token } => write!(
                f,
                "idempotent call {name}/{key} (token {token}) outlived its lease and another \
                 attempt took over; its result was not stored"
            ),
            Error::Codec(e) => write!(f, "{e}"),
            Error::Key(e) => write!(f, "idempotency key could not be encoded: {e}"),
            Error::Store(e) => write!(f, "{e}"),
            Error::Config(e) => write!(f, "idem configuration error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Codec(e) => Some(e),
            Error::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// A failure of the store behind a handle.
#[derive(Debug)]
pub struct StoreError {
    /// `"memory"`, `"sqlite"`, `"postgres"`, `"redis"`, …
    pub backend: &'static str,
    /// The protocol step that failed: `"claim"`, `"complete"`, `"open"`, …
    pub op: &'static str,
    /// What the backend said.
    pub source: BoxError,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "idem {} store failed at {}: {}",
            self.backend, self.op, self.source
        )
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// What went wrong with a stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CodecErrorKind {
    /// The result could not be serialized (nothing was stored).
    Encode,
    /// The stored value is well-formed but is not a value of the expected type: the type
    /// changed between deploys.
    TypeChanged,
    /// The stored bytes are not a value this version of idem wrote (corrupt, or written by a
    /// newer format version).
    Corrupt,
}

/// A result that could not be encoded or a stored value that could not be decoded.
#[derive(Debug, Clone)]
pub struct CodecError {
    /// What kind of failure.
    pub kind: CodecErrorKind,
    /// The Rust type being encoded or decoded.
    pub type_name: &'static str,
    /// What the codec said.
    pub message: String,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            CodecErrorKind::Encode => "could not encode a result of type",
            CodecErrorKind::TypeChanged => "stored result does not decode into",
            CodecErrorKind::Corrupt => "stored result is corrupt or of an unknown format, expected",
        };
        write!(
            f,
            "idem codec: {what} `{}`: {}",
            self.type_name, self.message
        )
    }
}

impl std::error::Error for CodecError {}

/// So that functions returning `std::io::Result<T>` can be `#[idempotent]`.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::InProgress { .. } => std::io::ErrorKind::WouldBlock,
            Error::Mismatch { .. } | Error::Key(_) | Error::Config(_) => {
                std::io::ErrorKind::InvalidInput
            }
            Error::Codec(_) => std::io::ErrorKind::InvalidData,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
