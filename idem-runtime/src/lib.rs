//! The runtime of `idem`: the protocol, the stores, key derivation, errors, TTL and lease policy.
//!
//! Users depend on the `idem` facade crate, which re-exports all of this together with the
//! `#[idempotent]` attribute. The guide is the `idem-rs` crate's documentation.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod admin;
mod backend;
mod cache;
mod call;
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub mod client;
mod codec;
#[cfg(feature = "consume")]
#[cfg_attr(docsrs, doc(cfg(feature = "consume")))]
pub mod consume;
mod context;
pub mod cron;
mod error;
mod handle;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod key;
mod lease;
mod observe;
#[cfg(any(feature = "outbox", feature = "outbox-mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "outbox", feature = "outbox-mysql"))))]
pub mod outbox;
mod policy;
pub mod protocol;
mod record;
pub mod resume;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod transaction;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[cfg(feature = "cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "cache")))]
pub use cache::CacheOptions;
pub use call::{step, Call, Outcome, Reconciling, Resolution};
pub use codec::{describe_value, DEFAULT_MAX_VALUE_LEN};
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use codec::{Keyring, MAX_KEY_ID_LEN};
pub use context::{current_key, current_token, recovery, Recovery};
pub use error::{
    BoxError, CodecError, CodecErrorKind, Error, ErrorKind, StoreError, StoreErrorKind,
};
pub use handle::{Idem, Reaper};
pub use policy::{
    parse_duration, DecideErrors, Defaults, ErrorPolicy, KeepErrors, OnAbandoned, OnError,
    ReleaseErrors,
};
pub use store::{Backend, Store};
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use transaction::InTransaction;

/// The PostgreSQL store and its transactional mode (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::postgres;
