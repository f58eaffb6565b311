//! `idem::Error`: every way an idempotent call can fail without the body's own error.

use crate::backend::{Backend, UnknownScheme};
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
        /// When to ask again: the running attempt's lease left, capped at one second
        /// ([`crate::protocol::retry_after`]); also what [`Error::retry_after`] returns.
        retry_after: Duration,
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
    /// An earlier attempt was abandoned (its lease lapsed before it stored a result or released
    /// its key) and the function parks such keys (`on_abandoned = park`): whether its effect
    /// happened is unknown, so the body does not run, for this call or any later one, until an
    /// operator resolves the key ([`crate::Idem::resolve`], `idem resolve`).
    OutcomeUnknown {
        /// The namespace.
        name: String,
        /// The hex digest of the key.
        key: String,
    },
    /// The key's result expired and its tombstone is still kept (`tombstone = …`): the call
    /// came after `ttl`, so its earlier result can no longer be replayed, and the body does not
    /// run again either (it ran once already). Use a new key for a new request.
    Expired {
        /// The namespace.
        name: String,
        /// The hex digest of the key.
        key: String,
        /// When the result expired (ms since the Unix epoch, the store's clock).
        expired_at: i64,
        /// Until when the tombstone is kept (ms since the Unix epoch, the store's clock); after
        /// it the key is free again.
        until: i64,
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

/// What kind of failure an [`Error`] is, without its details: what code that handles errors
/// matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InProgress`].
    InProgress,
    /// [`Error::Mismatch`].
    Mismatch,
    /// [`Error::LeaseLost`].
    LeaseLost,
    /// [`Error::OutcomeUnknown`].
    OutcomeUnknown,
    /// [`Error::Expired`].
    Expired,
    /// [`Error::Codec`].
    Codec,
    /// [`Error::Key`].
    Key,
    /// [`Error::Store`], with what the store said went wrong.
    Store(StoreErrorKind),
    /// [`Error::Config`].
    Config,
}

impl Error {
    /// A store failure of kind [`StoreErrorKind::Query`]: a statement or command that failed.
    /// For store implementors and for bodies that report their own database failures; a store
    /// that knows better says so with [`Error::store_kind`].
    pub fn store(
        backend: impl Into<Backend>,
        op: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::store_kind(backend, op, StoreErrorKind::Query, source)
    }

    /// A store failure of a given kind (for store implementors).
    pub fn store_kind(
        backend: impl Into<Backend>,
        op: &'static str,
        kind: StoreErrorKind,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Store(StoreError {
            backend: backend.into(),
            op,
            kind,
            source: source.into(),
        })
    }

    /// A misconfiguration: a bad URL, table name or option, or no installed handle.
    pub fn config(message: impl Into<String>) -> Self {
        Error::Config(message.into())
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InProgress { .. } => ErrorKind::InProgress,
            Error::Mismatch { .. } => ErrorKind::Mismatch,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::Expired { .. } => ErrorKind::Expired,
            Error::Codec(_) => ErrorKind::Codec,
            Error::Key(_) => ErrorKind::Key,
            Error::Store(e) => ErrorKind::Store(e.kind),
            Error::Config(_) => ErrorKind::Config,
        }
    }

    /// The store failure's kind, for [`Error::Store`].
    pub fn store_error_kind(&self) -> Option<StoreErrorKind> {
        match self {
            Error::Store(e) => Some(e.kind),
            _ => None,
        }
    }

    /// True for [`Error::InProgress`].
    pub fn is_in_progress(&self) -> bool {
        matches!(self, Error::InProgress { .. })
    }

    /// True for [`Error::Mismatch`].
    pub fn is_mismatch(&self) -> bool {
        matches!(self, Error::Mismatch { .. })
    }

    /// True for [`Error::OutcomeUnknown`].
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Error::OutcomeUnknown { .. })
    }

    /// True for [`Error::Expired`].
    pub fn is_expired(&self) -> bool {
        matches!(self, Error::Expired { .. })
    }

    /// True for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// True for [`Error::Codec`].
    pub fn is_codec(&self) -> bool {
        matches!(self, Error::Codec(_))
    }

    /// True for [`Error::Store`].
    pub fn is_store(&self) -> bool {
        matches!(self, Error::Store(_))
    }

    /// True for [`Error::Config`].
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config(_))
    }

    /// For [`Error::InProgress`]: when to ask again (the running attempt's lease left, capped
    /// at [`crate::protocol::MAX_RETRY_AFTER`]); the HTTP layer's `Retry-After` is this,
    /// rounded up to whole seconds. `None` for every other error.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InProgress { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
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
                write!(
                    f,
                    "idempotent call {name}/{key} is already in progress; retry after {} ms",
                    retry_after.as_millis()
                )
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
            Error::OutcomeUnknown { name, key } => write!(
                f,
                "idempotent call {name}/{key}: an earlier attempt was abandoned and its outcome \
                 is unknown (the key is parked); an operator resolves it with `idem resolve` or \
                 Idem::resolve"
            ),
            Error::Expired { name, key, .. } => write!(
                f,
                "idempotency key {name}/{key} expired: its result is no longer kept, and its \
                 tombstone refuses a late repeat; use a new key for a new request"
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

/// A failure of the store behind a handle. Built by the stores ([`Error::store_kind`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct StoreError {
    /// Which store.
    pub backend: Backend,
    /// The protocol step that failed: `"claim"`, `"complete"`, `"open"`, …
    pub op: &'static str,
    /// What went wrong, as the store classified it.
    pub kind: StoreErrorKind,
    /// What the backend said.
    pub source: BoxError,
}

/// What went wrong in a store, as the store classified it: what operators' tools and retry
/// logic decide on, instead of a message or a backend's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The server cannot be reached, the connection was lost, or no connection came free in
    /// time.
    Unreachable,
    /// The server took longer than the configured timeout to answer.
    Timeout,
    /// The server refused the credentials (or asked for some).
    Authentication,
    /// The credentials are accepted but lack a privilege the step needs.
    Permission,
    /// The database the URL names does not exist (a missing SQLite file, an unknown
    /// PostgreSQL database).
    DatabaseMissing,
    /// The store's table (its schema) does not exist: run the migrations.
    SchemaMissing,
    /// The schema is older than this version of idem reads: run the migrations.
    SchemaOutdated,
    /// The schema was written by a newer version of idem: upgrade idem.
    SchemaNewer,
    /// The server or file accepts no writes (a read-only replica, a read-only file).
    ReadOnly,
    /// Out of room: memory, disk, or the store's limit on a value's size.
    Capacity,
    /// Another writer held a lock for longer than the busy timeout.
    Busy,
    /// The service refused the request for its rate (DynamoDB's
    /// `ProvisionedThroughputExceededException`, `ThrottlingException`,
    /// `RequestLimitExceeded`), after the client's own retries: ask again later.
    Throttled,
    /// The server lacks something idem needs (too old a version).
    Unsupported,
    /// A stored record or a reply is not what idem writes.
    Corrupt,
    /// Any other failure of a statement or command.
    Query,
}

impl StoreErrorKind {
    /// True for the kinds a later retry of the same step may cure without anyone acting:
    /// [`Unreachable`](Self::Unreachable), [`Timeout`](Self::Timeout), [`Busy`](Self::Busy),
    /// [`Throttled`](Self::Throttled).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::Unreachable | Self::Timeout | Self::Busy | Self::Throttled
        )
    }

    /// True for the kinds about the schema: missing, outdated or newer.
    pub fn is_schema(self) -> bool {
        matches!(
            self,
            Self::SchemaMissing | Self::SchemaOutdated | Self::SchemaNewer
        )
    }
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
    /// The result, as it would be stored (after compression and encryption), is larger than the
    /// handle's or the store's limit ([`crate::Idem::with_max_value_len`],
    /// [`crate::Store::max_value_len`]): nothing was stored and the key was released.
    TooLarge,
    /// The stored value is encrypted with a key id that is not in the handle's keyring (rotated
    /// out, or no keyring configured). The body does not run.
    UnknownKey,
    /// The stored value is encrypted with a key of the ring but does not decrypt: it was
    /// tampered with, or moved to another key or namespace (the ciphertext is bound to both).
    /// The body does not run.
    Decrypt,
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
            CodecErrorKind::TooLarge => "result too large to store, of type",
            CodecErrorKind::UnknownKey => {
                "stored result is encrypted with an unknown key, expected"
            }
            CodecErrorKind::Decrypt => "stored result does not decrypt, expected",
        };
        write!(
            f,
            "idem codec: {what} `{}`: {}",
            self.type_name, self.message
        )
    }
}

impl std::error::Error for CodecError {}

impl Error {
    /// A codec error of `kind` about a value of type `type_name`.
    pub(crate) fn codec(kind: CodecErrorKind, type_name: &'static str, message: String) -> Error {
        Error::Codec(CodecError {
            kind,
            type_name,
            message,
        })
    }
}

/// A store URL of no known backend is a configuration error.
impl From<UnknownScheme> for Error {
    fn from(e: UnknownScheme) -> Self {
        Error::Config(e.to_string())
    }
}

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
