//! HTTP integrations (feature `axum`).
//!
//! [`axum`] has the `Idempotency-Key` layer: a [tower] layer for axum routers that
//! replays the stored response of a request repeated with the same key, following the IETF draft
//! *The Idempotency-Key HTTP Header Field* and the behaviour of Stripe's API. [`problem`]
//! documents the error responses it answers with.
//!
//! [tower]: https://docs.rs/tower

// `problem` before `axum`, which re-exports it: the facade's documentation inlines this
// module, and rustdoc gives a module reachable by two paths the page of the first it meets;
// the problem types are addresses on the `http::problem` page.
pub mod problem;

pub mod axum;
mod detach;
mod fingerprint;
mod key;
mod layer;
mod service;
mod stored;
