//! The `Idempotency-Key` layer for axum.
//!
//! [`IdempotencyLayer`] makes the routes it wraps idempotent per the IETF draft *The
//! Idempotency-Key HTTP Header Field* and the behaviour of Stripe's API: a client sends
//! `Idempotency-Key: "<unique value>"` with a `POST` (or `PATCH`); the first request with that
//! key runs the handler and its response is stored; a repeat of the same request with the same
//! key gets the stored response back, marked `Idempotent-Replayed: true`, and the handler does
//! not run again.
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! use axum::extract::Request;
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use axum::{routing::post, Router};
//! use idem::http::axum::{IdempotencyLayer, Principal};
//!
//! async fn charge(body: String) -> String {
//!     format!("charged {body}")
//! }
//!
//! /// Stands for the application's authentication: it tells who is asking.
//! async fn authenticate(mut req: Request, next: Next) -> Response {
//!     req.extensions_mut().insert(Principal::new("alice"));
//!     next.run(req).await
//! }
//!
//! let idem = idem::Idem::memory();
//! let app: Router = Router::new()
//!     .route("/charges", post(charge))
//!     // the layer applies to the routes above it: apply it to a route or a router
//!     .layer(IdempotencyLayer::new(idem))
//!     // authentication *outside* it (a `.layer(...)` after this one), so that the layer
//!     // sees who is asking and scopes the keys by it
//!     .layer(middleware::from_fn(authenticate));
//! ```
//!
//! A runnable payment API is in `integration/examples/http_payments.rs`.
//!
//! # What the layer does
//!
//! * **Which requests**: `POST` and `PATCH` by default ([`IdempotencyLayer::methods`]); other
//!   methods pass straight through. The key is **required** by default (a request without it
//!   gets a 400); [`IdempotencyLayer::optional_key`] lets requests without a key pass through
//!   unprotected, as Stripe does.
//! * **The key**: the `Idempotency-Key` field is a structured-field string (RFC 8941), for
//!   example `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. For clients that send
//!   the value unquoted (many do, after Stripe's examples), a bare value is accepted too: 1–255
//!   visible ASCII characters without `"`, `\` or `,`. The key (after unescaping a quoted string)
//!   is 1–255 characters of printable ASCII; a space is possible only inside quotes. Parameters
//!   after the string (`"k";p=1`), more than one `Idempotency-Key` field, or anything else is
//!   malformed: 400.
//! * **The scope**: the key is looked up in the scope of the request's principal, by default
//!   the [`Principal`] request extension that an authentication middleware put in front of
//!   the layer inserts ([`IdempotencyLayer::scope_with`] for another extractor). Two principals
//!   using the same key are two different keys: one user's key never replays another user's
//!   response. A request without a principal is refused with a 500 (a misconfiguration: the
//!   authentication middleware is missing or inside the layer) unless
//!   [`IdempotencyLayer::allow_anonymous`] puts such requests in one shared anonymous scope.
//! * **The fingerprint**: method, path, query and a sha256 of the body. A repeat with the same
//!   key and another fingerprint (another payload, or the key used on another route) is refused
//!   with a 422 and the handler does not run. With
//!   [`fingerprint(FingerprintMode::Canonical)`](IdempotencyLayer::fingerprint) a JSON body is
//!   compared by its parsed value (`{"a":1,"b":2}` and `{ "b": 2, "a": 1 }` are one request)
//!   and query parameters in any order; off by default, since switching it changes the
//!   fingerprints of keys already stored.
//! * **What is stored**: the status, the body, and every response field the handler set
//!   (`X-Charge-Id`, `Request-Id`, rate-limit fields: a replay is the same response) except a
//!   deny-list: **`Set-Cookie` is never stored**: whoever holds a key must not get the first
//!   caller's session; nor are the hop-by-hop fields, `Date`, `Server` and `Content-Length`
//!   (the server sets them anew). [`IdempotencyLayer::replay_headers`] restricts the fields to
//!   an allow-list ([`STORED_HEADERS`] is the representation's fields, `ETag`,
//!   `Last-Modified`, `Location`, `Link` and `Cache-Control`; [`IdempotencyLayer::store_header`]
//!   adds one to it).
//!   [`IdempotencyLayer::on_replay`] adjusts a replayed response before it is sent. The
//!   response body is buffered to be stored: this layer is for API responses, not for streams.
//! * **Which responses are stored**: [`store_policy`] by default: 1xx–3xx and 4xx responses are
//!   kept and replayed, except `408`, `409`, `425` and `429`, which say "try again"; 5xx
//!   responses release the key so that a retry runs the handler again. Change it with
//!   [`IdempotencyLayer::store_if`]. A released response still goes to the client as it is.
//!   A handler keeps one response out of storage with the [`NoStore`] response extension
//!   (with [`IdempotencyLayer::respect_no_store`], `Cache-Control: no-store` does it too), and
//!   a response above [`IdempotencyLayer::response_limit`] is not stored either: each goes to
//!   the client as it is and releases its key.
//! * **While the first request is in flight** a repeat gets a 409 with `Retry-After`, or, with
//!   [`IdempotencyLayer::wait`], waits for it and gets its response. `Retry-After` is
//!   [`Error::retry_after`](crate::Error::retry_after) of the in-progress error, the one rule a
//!   function caller gets too (the first attempt's lease left, capped at
//!   [`MAX_RETRY_AFTER`](crate::protocol::MAX_RETRY_AFTER)), rounded up to whole seconds.
//! * **A client that disconnects** mid-request does not cut its handler in half: once the
//!   request body is read, the claim, the handler and the storing of its response run on a
//!   tokio task of their own ([`IdempotencyLayer::detached`], on by default), which the
//!   connection only waits for. The handler finishes, its response is stored, and the client's
//!   retry gets it replayed (or, while it still runs, a 409 / the [`IdempotencyLayer::wait`]).
//!   [`IdempotencyLayer::max_in_flight`] bounds how many such handlers run at once (beyond it:
//!   503 with `Retry-After`), and a [`ShutdownHandle`] ([`IdempotencyLayer::shutdown_handle`])
//!   waits for them, up to a deadline, when the server stops, so that a deploy does not cut
//!   them either. **Opting out**: `.detached(false)` gives the old behaviour: the server drops
//!   the handler's future with the connection, the handler stops where it is, and its claim
//!   lapses after the lease (30 s by default, [`IdempotencyLayer::lease`]), until when a retry
//!   gets a 409.
//!
//! # Errors
//!
//! Errors are `application/problem+json` (RFC 9457) with these `type`s (constants in
//! [`problem`], whose documentation has a section for each: a `type` is the address of its
//! section):
//!
//! | status | `type` | when |
//! |---|---|---|
//! | 400 | [`problem::KEY_MISSING`] | the route requires a key and the request has none |
//! | 400 | [`problem::KEY_MALFORMED`] | the key is not a valid structured-field string or bare value of 1–255 characters |
//! | 409 | [`problem::IN_PROGRESS`] | a request with this key is being processed; `Retry-After` says when to retry |
//! | 413 | [`problem::BODY_TOO_LARGE`] | the body is above [`IdempotencyLayer::body_limit`] |
//! | 422 | [`problem::KEY_REUSED`] | the key was used before with another request (method, path, query or body) |
//! | 423 | [`problem::OUTCOME_UNKNOWN`] | an abandoned attempt's outcome is unknown and the key is parked ([`IdempotencyLayer::on_abandoned`]) until an operator resolves it; do not retry blindly |
//! | 410 | [`problem::KEY_EXPIRED`] | the key was used and its response expired; its tombstone ([`IdempotencyLayer::tombstone`]) refuses a late retry |
//! | 500 | [`problem::PRINCIPAL_MISSING`] | no principal and anonymous requests are not allowed |
//! | 500 | [`problem::INTERNAL`] | a stored response no longer decodes, or the handler's response body failed |
//! | 503 | [`problem::STORE_UNAVAILABLE`] | the idempotency store failed; retry later (`Retry-After`) |
//! | 503 | [`problem::OUTCOME_UNDECIDED`] | an abandoned attempt's outcome could not be reconciled yet ([`IdempotencyLayer::reconcile`]); retry later (`Retry-After`) |
//! | 503 | [`problem::OVERLOADED`] | [`IdempotencyLayer::max_in_flight`] handlers run already; retry later (`Retry-After`) |
//! | 503 | [`problem::SHUTTING_DOWN`] | the server is shutting down ([`ShutdownHandle::shutdown`]); retry (`Retry-After`) |

#[cfg(feature = "testkit")]
#[doc(hidden)]
pub use super::decode_stored_response;
#[doc(no_inline)]
pub use super::problem;
pub use super::{
    parse_key, parse_key_value, store_policy, AbandonedRequest, Buffered, FingerprintMode,
    IdempotencyLayer, IdempotencyService, InnerRequest, LayerBody, NoStore, Principal, Reconciled,
    ShutdownHandle, StillRunning, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, MAX_KEY_LEN,
    STORED_HEADERS,
};
/// The body type of the requests an axum router gives the layer's service.
pub use ::axum::body::Body;
