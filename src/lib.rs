//! `idem` makes async functions idempotent: the first call with a key runs the body and stores
//! its `Ok` value; every repeat with that key gets the stored value without running the body.
//!
//! A customer double-clicks "Pay", a phone retries after losing signal, a broker redelivers a
//! message: networks promise *at least once*, so every handler that changes state must be safe
//! to run twice. The guide below shows the parts; the repository's `docs/` folder has the
//! details of each store and integration, and what idem guarantees (and does not).
//!
//! # The attribute
//!
//! ```
//! use idem::{idempotent, Idem};
//!
//! #[idempotent(key = order_id, store = idem, ttl = "24h")]
//! async fn charge(order_id: u64, cents: u64, idem: &Idem) -> Result<String, idem::Error> {
//!     Ok(format!("receipt-{order_id}-{cents}")) // the side effect, at most once per order id
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! let idem = Idem::memory();
//! let first = charge(42, 4_999, &idem).await?;
//! let retry = charge(42, 4_999, &idem).await?; // replayed: the body does not run again
//! assert_eq!(first, retry);
//! // The same key with other arguments is a bug, and it is loud.
//! assert!(matches!(charge(42, 1, &idem).await, Err(idem::Error::Mismatch { .. })));
//! # Ok(()) }
//! ```
//!
//! The options (`key`, `store`, `ttl` — default 24 h —, `lease` — default 30 s —, `wait`,
//! `fingerprint`, `skip`, `scope`, `name`, `on_error`, `step`, `reconcile`, `on_abandoned`,
//! `transaction`, `crate`) are listed on [`idempotent`]. Without the macro, the same engine is
//! a builder, [`Idem::call`]:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! let idem = idem::Idem::memory();
//! let out = idem
//!     .call("charges.v1")
//!     .key("order-42")
//!     .run(async { Ok::<_, idem::Error>("receipt".to_string()) })
//!     .await?;
//! assert!(!out.is_replayed());
//! # Ok(()) }
//! ```
//!
//! # The stores
//!
//! A handle, [`Idem`], opens one store; two handles on the same database see the same keys.
//! [`Idem::install`] makes one the default of every `#[idempotent]` function without
//! `store = …`.
//!
//! ```no_run
//! # async fn open() -> Result<(), idem::Error> {
//! let idem = idem::Idem::memory(); // one process; tests
//! # #[cfg(feature = "sqlite")]
//! let idem = idem::Idem::sqlite("sqlite://idem.db").await?; // one machine, durable
//! # #[cfg(feature = "postgres")]
//! let idem = idem::Idem::postgres("postgres://app@db/app").await?; // many instances
//! # #[cfg(feature = "mysql")]
//! let idem = idem::Idem::mysql("mysql://app@db/app").await?; // MySQL 8 / MariaDB 10.6+
//! # #[cfg(feature = "redis")]
//! let idem = idem::Idem::redis("redis://cache:6379/").await?;
//! # #[cfg(feature = "dynamodb")]
//! let idem = idem::Idem::dynamodb("idem_records").await?; // AWS config from the environment
//! idem.install();
//! # Ok(()) }
//! ```
//!
//! # Steps
//!
//! Inside an idempotent call, a function marked `#[idempotent(step)]` (or a block in
//! [`step`]) records its result under the parent's call, so a retry of the parent replays the
//! finished steps and runs only the rest:
//!
//! ```
//! use idem::{idempotent, Idem};
//!
//! #[idempotent(step)]
//! async fn charge_card(order: u64) -> Result<String, idem::Error> {
//!     Ok(format!("ch_{order}")) // once per checkout, however often checkout is retried
//! }
//!
//! #[idempotent(key = order, store = idem)]
//! async fn checkout(order: u64, idem: &Idem) -> Result<String, idem::Error> {
//!     let charge = charge_card(order).await?;
//!     idem::step(("receipt", order), || async { Ok::<_, idem::Error>(()) }).await?;
//!     Ok(charge)
//! }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! # assert_eq!(checkout(7, &Idem::memory()).await?, "ch_7");
//! # Ok(()) }
//! ```
//!
//! # The HTTP layer
//!
//! [`http::IdempotencyLayer`] (features `http`, `axum`, `grpc`) gives any tower stack the
//! `Idempotency-Key` header: a retry gets the stored response with `Idempotent-Replayed: true`,
//! a duplicate in flight a 409, the key with another request a 422, errors as
//! `application/problem+json` ([`http::problem`]). Its keys live under the namespace `http`,
//! scoped by the [`http::Principal`] your authentication inserts.
//!
//! ```
//! # #[cfg(feature = "http")]
//! # fn main() {
//! use idem::http::IdempotencyLayer;
//!
//! let layer = IdempotencyLayer::new(idem::Idem::memory()).max_in_flight(512);
//! // axum::Router::new().route("/charges", post(create_charge)).layer(layer)
//! # let _ = layer;
//! # }
//! # #[cfg(not(feature = "http"))]
//! # fn main() {}
//! ```
//!
//! # The outbox
//!
//! [`outbox::Outbox`] (features `outbox`, `outbox-mysql`) writes a message in the caller's
//! transaction, so it is sent if and only if the business rows commit; a relay delivers it.
//!
//! ```no_run
//! # #[cfg(feature = "outbox")]
//! # async fn demo(pool: idem::postgres::sqlx::PgPool) -> Result<(), idem::Error> {
//! use idem::outbox::{Message, Outbox};
//!
//! let outbox = Outbox::new(pool.clone()).migrate().await?;
//! let mut tx = pool.begin().await.map_err(|e| idem::Error::store("postgres", "begin", e))?;
//! // … the business rows on `tx` …
//! outbox.enqueue(&mut tx, Message::json("order.placed", &42)?).await?;
//! tx.commit().await.map_err(|e| idem::Error::store("postgres", "commit", e))?;
//! # Ok(()) }
//! # fn main() {}
//! ```
//!
//! # Features
#![cfg_attr(feature = "document-features", doc = document_features::document_features!())]
#![cfg_attr(
    not(feature = "document-features"),
    doc = "The features and what each one adds are listed in `Cargo.toml` and on docs.rs."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub use idem_macros::idempotent;
#[doc(hidden)]
pub use idem_runtime::__private;
pub use idem_runtime::*;

// The README's examples run as doc tests of the idem-integration package (integration/), which
// has the HTTP and NATS clients they use.
