//! Abandoned requests: what the layer's reconcile hook is given, and the hook itself.
//!
//! A request's attempt is abandoned when its lease lapses before its response was stored (the
//! server died mid-handler, or the handler was cut with its connection). The next request with
//! the key takes it over, and the layer does what it was told
//! ([`IdempotencyLayer::on_abandoned`](super::IdempotencyLayer::on_abandoned),
//! [`IdempotencyLayer::reconcile`](super::IdempotencyLayer::reconcile)): run the handler again,
//! park the key, or ask the hook whether the earlier effect happened.

use crate::error::BoxError;
use crate::Recovery;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, Uri};
use std::future::Future;
use std::pin::Pin;

/// The request whose earlier attempt was abandoned, as the reconcile hook sees it: enough to
/// look the effect up downstream (by the key the handler passed down, or by what the request
/// asked for).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AbandonedRequest {
    /// The `Idempotency-Key` as the client sent it (unquoted). The handler can pass it, or
    /// [`crate::current_key`] (which also answers inside the hook), to the services it calls.
    pub key: String,
    /// The scope the key is in (the principal), `None` for an anonymous request.
    pub scope: Option<String>,
    /// The request's method.
    pub method: Method,
    /// The request's URI (path and query).
    pub uri: Uri,
    /// The request's header fields.
    pub headers: HeaderMap,
    /// The request's body (the same bytes as the abandoned attempt's: the fingerprint matched).
    pub body: Bytes,
    /// Which attempt this is (2 for the first takeover) and when the abandoned one began.
    pub recovery: Recovery,
}

/// What the hook returns: `Ok(Some(response))`, the earlier effect happened and this is its
/// response (stored and sent as if the handler had returned it; the handler does not run);
/// `Ok(None)`, it did not (the handler runs); `Err(e)`, undecided (a 503
/// [`OUTCOME_UNDECIDED`](super::problem::OUTCOME_UNDECIDED), the key stays abandoned and the
/// next request asks again).
pub type Reconciled = Result<Option<Response<Bytes>>, BoxError>;

pub(super) type ReconcileFn =
    dyn Fn(AbandonedRequest) -> Pin<Box<dyn Future<Output = Reconciled> + Send>> + Send + Sync;

/// A hook as the layer keeps it.
pub(super) fn boxed<F, Fut>(hook: F) -> std::sync::Arc<ReconcileFn>
where
    F: Fn(AbandonedRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reconciled> + Send + 'static,
{
    std::sync::Arc::new(move |req| Box::pin(hook(req)))
}
