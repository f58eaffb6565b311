//! What a layer was configured with, shared by the services it makes, and the policy of which
//! responses are stored.

use super::detach::Handlers;
use super::fingerprint::FingerprintMode;
#[cfg(feature = "grpc")]
use super::grpc_status::Code;
use crate::policy::OnError;
use crate::Idem;
use http::request::Parts as RequestParts;
use http::response::Parts as ResponseParts;
use http::{HeaderName, Method, StatusCode};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

pub(super) type ScopeFn = dyn Fn(&RequestParts) -> Option<String> + Send + Sync;
pub(super) type OnReplayFn = dyn Fn(&mut ResponseParts) + Send + Sync;

/// A response extension by which a handler keeps its response out of storage: the key is
/// released (a retry runs the handler again) and the response goes to the client as it is.
/// For a response that must not be replayed (a one-time secret, a token), or one the handler
/// knows is not final.
///
/// ```
/// # extern crate idem_runtime as idem;
/// let mut res = http::Response::new(());
/// res.extensions_mut().insert(idem::http::NoStore);
/// ```
/// (with axum: `(Extension(NoStore), body)`.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoStore;
pub(super) type StoreIfFn = dyn Fn(StatusCode) -> OnError + Send + Sync;

/// The default policy of which responses are stored: [`OnError::Keep`] (stored and replayed)
/// for 1xx–4xx except `408 Request Timeout`, `409 Conflict`, `425 Too Early` and
/// `429 Too Many Requests`; [`OnError::Release`] (the key is freed, a retry runs again) for
/// those and every 5xx.
pub fn store_policy(status: StatusCode) -> OnError {
    match status.as_u16() {
        408 | 409 | 425 | 429 => OnError::Release,
        s if s >= 500 => OnError::Release,
        _ => OnError::Keep,
    }
}

/// The protocol a layer speaks: how it writes its refusals and decides what to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    /// HTTP APIs: problem documents, [`store_policy`] on the status.
    Http,
    /// Unary gRPC calls: gRPC statuses, the store policy on `grpc-status`.
    #[cfg(feature = "grpc")]
    Grpc,
}

#[cfg(feature = "grpc")]
pub(super) type GrpcStoreIfFn = dyn Fn(Code) -> OnError + Send + Sync;

/// What a layer was configured with, shared by the services it makes.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) idem: Idem,
    pub(super) name: Cow<'static, str>,
    pub(super) methods: Vec<Method>,
    pub(super) key_required: bool,
    pub(super) body_limit: usize,
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Option<Duration>,
    pub(super) tombstone: Option<Duration>,
    pub(super) retry_after: Duration,
    pub(super) scope: Arc<ScopeFn>,
    pub(super) allow_anonymous: bool,
    pub(super) store_if: Arc<StoreIfFn>,
    /// Whether the idempotent part of a request runs on a task of its own.
    pub(super) detached: bool,
    pub(super) max_in_flight: Option<usize>,
    /// Shared by every clone of the layer and its services: one count, one shutdown.
    pub(super) handlers: Arc<Handlers>,
    pub(super) fingerprint: FingerprintMode,
    /// The response fields stored and replayed: `None`, every field but the deny-list
    /// (`Set-Cookie`, hop-by-hop, `Date`, `Server`, `Content-Length`); `Some`, an allow-list
    /// (the deny-list still applies).
    pub(super) stored_headers: Option<Vec<HeaderName>>,
    pub(super) on_replay: Option<Arc<OnReplayFn>>,
    pub(super) respect_no_store: bool,
    pub(super) response_limit: Option<usize>,
    pub(super) protocol: Protocol,
    #[cfg(feature = "grpc")]
    pub(super) grpc_store_if: Arc<GrpcStoreIfFn>,
    /// What a request that takes over an abandoned attempt does without a reconcile hook.
    pub(super) on_abandoned: crate::OnAbandoned,
    /// The reconcile hook: when set, it decides every takeover (`on_abandoned` is not used).
    pub(super) reconcile: Option<Arc<super::reconcile::ReconcileFn>>,
}
