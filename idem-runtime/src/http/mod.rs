//! HTTP integrations (feature `http`; `axum` and `grpc` on top of it).
//!
//! [`IdempotencyLayer`] is a [tower] layer over `http::Request<B>` for any body `B`: it
//! replays the stored response of a request repeated with the same `Idempotency-Key`,
//! following the IETF draft *The Idempotency-Key HTTP Header Field* and the behaviour of
//! Stripe's API. `idem::http::axum` (feature `axum`) documents it in full, with an axum router;
//! `idem::http::grpc` (feature `grpc`) applies it to unary gRPC calls (a tonic server); [`problem`]
//! documents the error responses it answers with.
//!
//! # Any tower stack
//!
//! The layer's service takes `http::Request<B>` for any `B: http_body::Body<Data = Bytes>`
//! and buffers the body of a request under a key (up to
//! [`IdempotencyLayer::body_limit`]); the inner service gets an [`InnerRequest<B>`]: the
//! buffered body ([`Buffered`]) or, for a request that passes through, its own body
//! untouched. Its response body is the inner one, or [`Buffered`] for a response the layer
//! stored, replays or makes ([`LayerBody`]). An axum `Router`, a `hyper::service::service_fn`
//! behind `tower::ServiceBuilder`, and a tonic server all take such requests.
//!
//! [tower]: https://docs.rs/tower

// `problem` before `axum`, which re-exports it: the facade's documentation inlines this
// module, and rustdoc gives a module reachable by two paths the page of the first it meets;
// the problem types are addresses on the `http::problem` page.
pub mod problem;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
mod body;
mod config;
mod detach;
mod fingerprint;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
#[cfg(feature = "grpc")]
mod grpc_status;
mod key;
mod layer;
mod reconcile;
mod service;
mod stored;

pub use body::{Buffered, LayerBody};
pub use config::{store_policy, NoStore};
pub use detach::{ShutdownHandle, StillRunning};
pub use fingerprint::FingerprintMode;
pub use key::{parse_key, parse_key_value, IDEMPOTENCY_KEY, MAX_KEY_LEN};
pub use layer::{IdempotencyLayer, Principal};
pub use reconcile::{AbandonedRequest, Reconciled};
pub use service::{IdempotencyService, InnerRequest};
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub use stored::decode_stored_response;
pub use stored::{IDEMPOTENT_REPLAYED, STORED_HEADERS};
