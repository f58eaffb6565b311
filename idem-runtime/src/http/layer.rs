//! The tower layer: its builder and the principal that scopes keys.

use super::config::{store_policy, Config, OnReplayFn, Protocol, ScopeFn, StoreIfFn};
use super::detach::ShutdownHandle;
use super::fingerprint::FingerprintMode;
use super::reconcile::{AbandonedRequest, Reconciled};
use super::service::IdempotencyService;
use crate::policy::{OnAbandoned, OnError};
use crate::Idem;
use http::request::Parts as RequestParts;
use http::response::Parts as ResponseParts;
use http::HeaderName;
use http::{Method, StatusCode};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// The authenticated principal of a request: insert it as a request extension in the
/// authentication middleware (outside the layer); the layer scopes keys by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

impl Principal {
    /// The principal identified by `id` (a user id, an API key's id, a tenant): the scope of
    /// its requests' keys.
    pub fn new(id: impl Into<String>) -> Principal {
        Principal(id.into())
    }
}

/// A tower layer that makes the HTTP services it wraps (an axum router, a hyper service, a
/// tonic server) idempotent by their `Idempotency-Key`. See [`idem::http`](super) for what it
/// does.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.config;
        f.debug_struct("IdempotencyLayer")
            .field("name", &c.name)
            .field("methods", &c.methods)
            .field("key_required", &c.key_required)
            .field("body_limit", &c.body_limit)
            .field("ttl", &c.ttl)
            .field("lease", &c.lease)
            .field("wait", &c.wait)
            .field("allow_anonymous", &c.allow_anonymous)
            .field("detached", &c.detached)
            .field("max_in_flight", &c.max_in_flight)
            .field("fingerprint", &c.fingerprint)
            .field("stored_headers", &c.stored_headers)
            .field("respect_no_store", &c.respect_no_store)
            .field("response_limit", &c.response_limit)
            .field("protocol", &c.protocol)
            .field("on_abandoned", &c.on_abandoned)
            .field("reconcile", &c.reconcile.is_some())
            .finish_non_exhaustive()
    }
}

fn principal_scope(parts: &RequestParts) -> Option<String> {
    parts.extensions.get::<Principal>().map(|p| p.0.clone())
}

impl IdempotencyLayer {
    /// A layer on `idem` with the defaults: namespace `"http"`, `POST` and `PATCH`, key
    /// required, body limit 1 MiB, the handle's ttl and lease, no wait (a duplicate in flight
    /// gets a 409 with `Retry-After: 1`), scope from the [`Principal`] extension, anonymous
    /// requests refused, [`store_policy`], handlers detached from their connection
    /// ([`IdempotencyLayer::detached`]) without a bound on how many run at once, every
    /// response field replayed but `Set-Cookie`, the hop-by-hop ones, `Date`, `Server` and
    /// `Content-Length` ([`IdempotencyLayer::replay_headers`] restricts them).
    pub fn new(idem: Idem) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                idem,
                name: Cow::Borrowed("http"),
                methods: vec![Method::POST, Method::PATCH],
                key_required: true,
                body_limit: 1 << 20,
                ttl: None,
                tombstone: None,
                lease: None,
                wait: None,
                retry_after: Duration::from_secs(1),
                scope: Arc::new(principal_scope),
                allow_anonymous: false,
                store_if: Arc::new(store_policy),
                detached: true,
                max_in_flight: None,
                handlers: Arc::default(),
                fingerprint: FingerprintMode::Raw,
                stored_headers: None,
                on_replay: None,
                respect_no_store: false,
                response_limit: None,
                protocol: Protocol::Http,
                #[cfg(feature = "grpc")]
                grpc_store_if: Arc::new(super::grpc_status::store_policy),
                on_abandoned: OnAbandoned::Rerun,
                reconcile: None,
            }),
        }
    }

    /// `self` with `f` applied to its configuration (before any service is made).
    #[cfg(feature = "grpc")]
    pub(super) fn with_config(self, f: impl FnOnce(&mut Config)) -> Self {
        self.with(f)
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The namespace of the keys (default `"http"`). Two layers with different names never
    /// share keys; two with the same name share them (the fingerprint still tells routes
    /// apart: a key reused on another route is a 422).
    pub fn name(self, name: impl Into<Cow<'static, str>>) -> Self {
        let name = name.into();
        self.with(|c| c.name = name)
    }

    /// The methods the layer applies to (default `POST` and `PATCH`); others pass through.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|c| c.methods = methods)
    }

    /// Lets a request without `Idempotency-Key` pass through, unprotected (the default
    /// refuses it with a 400). A malformed key is refused either way.
    pub fn optional_key(self) -> Self {
        self.with(|c| c.key_required = false)
    }

    /// Whether a request without `Idempotency-Key` is refused with a 400 (`true`, the
    /// default) or passes through unprotected (`false`).
    pub fn require_key(self, required: bool) -> Self {
        self.with(|c| c.key_required = required)
    }

    /// The largest request body read, in bytes (default 1 MiB); above it: 413.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|c| c.body_limit = bytes)
    }

    /// How long a stored response is replayed (default: the handle's ttl, 24 h).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = Some(ttl))
    }

    /// After the ttl, keep the key's tombstone this long (default: the handle's,
    /// [`Idem::with_tombstone`](crate::Idem::with_tombstone), none unless set): a late retry
    /// with the key gets `410 Gone` ([`problem::KEY_EXPIRED`](super::problem::KEY_EXPIRED))
    /// instead of running the handler again.
    pub fn tombstone(self, tombstone: Duration) -> Self {
        self.with(|c| c.tombstone = Some(tombstone))
    }

    /// How long a request's claim lives without renewal (default: the handle's lease, 30 s);
    /// renewed while the handler runs.
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = Some(lease))
    }

    /// A duplicate of a request in flight waits up to `wait` for it and gets its response,
    /// instead of a 409 at once.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|c| c.wait = Some(wait))
    }

    /// The `Retry-After` of a 503 (the store failed, [`max_in_flight`](Self::max_in_flight)
    /// reached, a shutdown begun), and of a 409 whose error carries no hint (default 1 s,
    /// rounded up to whole seconds). A 409 otherwise says what the function error says,
    /// [`Error::retry_after`](crate::Error::retry_after): one rule for both. A gRPC layer
    /// sends the same seconds as `retry-after` and `grpc-retry-pushback-ms`.
    pub fn retry_after(self, retry_after: Duration) -> Self {
        self.with(|c| c.retry_after = retry_after)
    }

    /// Where the scope of a request comes from (default: its [`Principal`] extension). `None`
    /// is an anonymous request; see [`IdempotencyLayer::allow_anonymous`].
    pub fn scope_with(
        self,
        scope: impl Fn(&RequestParts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        let scope: Arc<ScopeFn> = Arc::new(scope);
        self.with(|c| c.scope = scope)
    }

    /// Whether requests without a principal share one anonymous scope (`true`) or are refused
    /// with a 500 [`problem::PRINCIPAL_MISSING`](super::problem::PRINCIPAL_MISSING) (`false`, the default, so that a missing or
    /// misplaced authentication middleware can never let users replay each other's responses).
    pub fn allow_anonymous(self, allow: bool) -> Self {
        self.with(|c| c.allow_anonymous = allow)
    }

    /// Which responses are stored: [`OnError::Keep`] stores the response and replays it,
    /// [`OnError::Release`] frees the key so that a retry runs the handler again (default:
    /// [`store_policy`]).
    pub fn store_if(self, policy: impl Fn(StatusCode) -> OnError + Send + Sync + 'static) -> Self {
        let policy: Arc<StoreIfFn> = Arc::new(policy);
        self.with(|c| c.store_if = policy)
    }
}

impl IdempotencyLayer {
    /// Whether a request's handler runs to its end even when the client goes away (`true`,
    /// the default) or is dropped with the connection (`false`).
    ///
    /// Detached, the part of a request under its key (the claim, the handler, storing its
    /// response) runs on a tokio task of its own once the request body is read: a client
    /// that disconnects, or times out, mid-handler does not cut a payment between its gateway
    /// call and its reply; the response is stored, and the client's retry gets it replayed.
    /// Not detached, the server drops the handler's future with the connection: the handler
    /// stops wherever it is, and its claim lapses after the lease (until then a retry gets a
    /// 409). Opt out (`.detached(false)`) for handlers that must stop when nobody waits for
    /// them, or whose inner service is not `'static`-spawnable in your runtime. Requests that
    /// pass through (other methods, no key where it is optional) are never detached.
    pub fn detached(self, detached: bool) -> Self {
        self.with(|c| c.detached = detached)
    }

    /// At most `max` detached handlers at once (default: no bound); a request beyond it gets
    /// a 503 [`problem::OVERLOADED`](super::problem::OVERLOADED) with `Retry-After` (the
    /// layer's [`retry_after`](IdempotencyLayer::retry_after)) and does not run. Handlers
    /// whose clients left count until they finish, so this is what bounds the work a wave of
    /// disconnecting clients can leave running.
    pub fn max_in_flight(self, max: usize) -> Self {
        self.with(|c| c.max_in_flight = Some(max))
    }

    /// How requests are fingerprinted (default [`FingerprintMode::Raw`]; see
    /// [`FingerprintMode::Canonical`] for JSON bodies compared by value). Changing it changes
    /// the fingerprints of requests: a retry of a request stored before the change (within the
    /// ttl) gets a 422, so switch on a new [`name`](IdempotencyLayer::name), or once the ttl
    /// has passed.
    pub fn fingerprint(self, mode: FingerprintMode) -> Self {
        self.with(|c| c.fingerprint = mode)
    }

    /// Restricts the response fields stored and replayed to `names` (an allow-list; by
    /// default every field is, but the deny-list below). A gRPC layer adds its `grpc-*`
    /// fields to them. `Set-Cookie` (a replay must not hand a session to whoever holds the
    /// key), the hop-by-hop fields (`Connection`, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`,
    /// `Transfer-Encoding`, `Upgrade`) and the per-response ones (`Date`, `Server`;
    /// `Content-Length` is recomputed) are never stored, listed or not.
    /// [`STORED_HEADERS`](super::STORED_HEADERS) is the allow-list that was the default
    /// before every field was replayed.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.with(|c| {
            // Extended below for a gRPC layer only.
            #[cfg_attr(not(feature = "grpc"), allow(unused_mut))]
            let mut names = names;
            #[cfg(feature = "grpc")]
            if c.protocol == Protocol::Grpc {
                names.extend(super::stored::GRPC_STORED_HEADERS.iter().cloned());
            }
            c.stored_headers = Some(names);
        })
    }

    /// The same as [`IdempotencyLayer::replay_headers`] (its earlier name).
    pub fn store_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_headers(names)
    }

    /// One more response field in the allow-list of
    /// [`IdempotencyLayer::replay_headers`]; without an allow-list every field is replayed
    /// already (but the deny-list), and this changes nothing.
    pub fn store_header(self, name: HeaderName) -> Self {
        self.with(|c| {
            if let Some(list) = &mut c.stored_headers {
                list.push(name);
            }
        })
    }

    /// Adjusts every replayed response before it is sent (after the layer added
    /// `Idempotent-Replayed: true`): a fresh request id, an `Age`, a header saying which
    /// instance replayed it.
    pub fn on_replay(self, hook: impl Fn(&mut ResponseParts) + Send + Sync + 'static) -> Self {
        let hook: Arc<OnReplayFn> = Arc::new(hook);
        self.with(|c| c.on_replay = Some(hook))
    }

    /// Whether a response with `Cache-Control: no-store` is kept out of storage, its key
    /// released (default `false`). Off by default because many APIs send `no-store` on every
    /// response (for browsers and proxies, as OWASP recommends): honouring it there would
    /// silently turn idempotency off. A handler opts one response out with the [`NoStore`](super::NoStore)
    /// extension whatever this says.
    pub fn respect_no_store(self, respect: bool) -> Self {
        self.with(|c| c.respect_no_store = respect)
    }

    /// The largest response body stored, in bytes (default: no limit). A larger response
    /// goes to the client as it is (no 5xx), but is not stored: its key is released, and a
    /// retry runs the handler again, so set it above the responses of handlers with effects.
    pub fn response_limit(self, bytes: usize) -> Self {
        self.with(|c| c.response_limit = Some(bytes))
    }

    /// What a request does when it takes over an abandoned attempt (one whose lease lapsed
    /// before its response was stored: the server died mid-handler, or a handler that is not
    /// [`detached`](IdempotencyLayer::detached) was cut with its connection), as
    /// `on_abandoned = …` of `#[idempotent]`: [`OnAbandoned::Rerun`] (the default) runs the
    /// handler again, and the handler can tell with [`crate::recovery`];
    /// [`OnAbandoned::Park`] runs nothing: this and every later request with the key get a
    /// 423 [`problem::OUTCOME_UNKNOWN`](super::problem::OUTCOME_UNKNOWN) until an operator
    /// resolves the key (`idem resolve`, the board). With a
    /// [`reconcile`](IdempotencyLayer::reconcile) hook, the hook decides instead.
    pub fn on_abandoned(self, on_abandoned: OnAbandoned) -> Self {
        self.with(|c| c.on_abandoned = on_abandoned)
    }

    /// Decides a takeover of an abandoned attempt by looking its effect up, as `reconcile = …`
    /// of `#[idempotent]`: when a request takes one over, `hook` runs before the handler, inside
    /// the call ([`crate::current_key`] and [`crate::recovery`] answer), with the request
    /// ([`AbandonedRequest`]: its key, scope, method, URI, fields and body). It returns
    /// ([`Reconciled`]) `Ok(Some(response))` when the effect happened — the response is stored
    /// and sent as the handler's would be, and the handler does not run —, `Ok(None)` when it
    /// did not — the handler runs —, or `Err(e)` when it cannot tell yet — a 503
    /// [`problem::OUTCOME_UNDECIDED`](super::problem::OUTCOME_UNDECIDED), and the key stays
    /// abandoned for the next request to reconcile again. A first attempt never calls it.
    /// With a hook, [`on_abandoned`](IdempotencyLayer::on_abandoned) is not used.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// use idem::http::{AbandonedRequest, IdempotencyLayer};
    /// # async fn charge_at_gateway(key: &str) -> Result<Option<String>, std::io::Error> { Ok(None) }
    /// let layer = IdempotencyLayer::new(idem::Idem::memory()).reconcile(|req: AbandonedRequest| async move {
    ///     // the handler sent its charge to the gateway under the request's key
    ///     Ok(charge_at_gateway(&req.key).await?.map(|id| {
    ///         http::Response::builder().status(201).body(bytes::Bytes::from(id)).unwrap()
    ///     }))
    /// });
    /// ```
    pub fn reconcile<F, Fut>(self, hook: F) -> Self
    where
        F: Fn(AbandonedRequest) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Reconciled> + Send + 'static,
    {
        let hook = super::reconcile::boxed(hook);
        self.with(|c| c.reconcile = Some(hook))
    }

    /// The handle that waits for this layer's running handlers at shutdown (shared by every
    /// clone of the layer and every service it made).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            handlers: self.config.handlers.clone(),
        }
    }
}

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy() {
        for s in [200, 201, 204, 303, 400, 404, 422] {
            assert_eq!(
                store_policy(StatusCode::from_u16(s).unwrap()),
                OnError::Keep,
                "{s}"
            );
        }
        for s in [408, 409, 425, 429, 500, 502, 503] {
            assert_eq!(
                store_policy(StatusCode::from_u16(s).unwrap()),
                OnError::Release,
                "{s}"
            );
        }
    }
}
