//! HTTP integrations (feature `axum`).
//!
//! [`axum`] has the `Idempotency-Key` layer: a [tower] layer for axum routers that
//! replays the stored response of a request repeated with the same key, following the IETF draft
//! *The Idempotency-Key HTTP Header Field* and the behaviour of Stripe's API.
//!
//! [tower]: https://docs.rs/tower

pub mod axum;
