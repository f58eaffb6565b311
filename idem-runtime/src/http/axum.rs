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
//! use axum::{routing::post, Router};
//! use idem::http::axum::{IdempotencyLayer, Principal};
//!
//! async fn charge(body: String) -> String {
//!     format!("charged {body}")
//! }
//!
//! let idem = idem::Idem::memory();
//! let app: Router = Router::new()
//!     .route("/charges", post(charge))
//!     // the layer applies to the routes above it: apply it to a route or a router
//!     .layer(IdempotencyLayer::new(idem));
//!     // and put the middleware that authenticates and inserts the `Principal` extension
//!     // *outside* it (a `.layer(...)` after this one), so the layer sees who is asking.
//! ```
//!
//! A runnable payment API is in `examples/http_payments.rs`.
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
//!   with a 422 and the handler does not run.
//! * **What is stored**: the status, the body and the headers that belong to the response:
//!   not the hop-by-hop fields (`Connection`, `Keep-Alive`, `Transfer-Encoding`, `TE`,
//!   `Trailer`, `Upgrade`, `Proxy-*` and those named in `Connection`), not `Date`, not
//!   `Content-Length` (recomputed). The response body is buffered to be stored: this layer is
//!   for API responses, not for streams.
//! * **Which responses are stored**: [`store_policy`] by default: 1xx–3xx and 4xx responses are
//!   kept and replayed, except `408`, `409`, `425` and `429`, which say "try again"; 5xx
//!   responses release the key so that a retry runs the handler again. Change it with
//!   [`IdempotencyLayer::store_if`]. A released response still goes to the client as it is.
//! * **While the first request is in flight** a repeat gets a 409 with `Retry-After`, or, with
//!   [`IdempotencyLayer::wait`], waits for it and gets its response.
//! * **A client that disconnects** mid-request: the server drops the request's future, so the
//!   handler stops where it is and its claim is no longer renewed; it lapses after the lease
//!   (30 s by default, [`IdempotencyLayer::lease`]), and until then a retry gets a 409. Choose
//!   a lease a little longer than the slowest handler's pauses, not longer.
//!
//! # Errors
//!
//! Errors are `application/problem+json` (RFC 9457) with these `type`s (constants in
//! [`problem`]):
//!
//! | status | `type` | when |
//! |---|---|---|
//! | 400 | [`problem::KEY_MISSING`] | the route requires a key and the request has none |
//! | 400 | [`problem::KEY_MALFORMED`] | the key is not a valid structured-field string or bare value of 1–255 characters |
//! | 409 | [`problem::IN_PROGRESS`] | a request with this key is being processed; `Retry-After` says when to retry |
//! | 413 | [`problem::BODY_TOO_LARGE`] | the body is above [`IdempotencyLayer::body_limit`] |
//! | 422 | [`problem::KEY_REUSED`] | the key was used before with another request (method, path, query or body) |
//! | 500 | [`problem::PRINCIPAL_MISSING`] | no principal and anonymous requests are not allowed |
//! | 500 | [`problem::INTERNAL`] | a stored response no longer decodes, or the handler's response body failed |
//! | 503 | [`problem::STORE_UNAVAILABLE`] | the idempotency store failed; retry later (`Retry-After`) |

use crate::error::BoxError;
use crate::policy::OnError;
use crate::{Error, Idem, Outcome};
use base64::Engine as _;
use bytes::Bytes;
use http::request::Parts as RequestParts;
use http::response::Parts as ResponseParts;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

pub use ::axum::body::Body;

/// The request header that carries the key: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replayed response: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest key accepted, in characters (as Stripe's API).
pub const MAX_KEY_LEN: usize = 255;

/// The problem `type` URIs of the layer's error responses (RFC 9457).
pub mod problem {
    /// 400: the route requires an `Idempotency-Key` and the request has none.
    pub const KEY_MISSING: &str = "https://example.invalid/idem/problems/idempotency-key-missing";
    /// 400: the `Idempotency-Key` is not a structured-field string (or bare value) of 1–255
    /// printable ASCII characters, or the request has more than one.
    pub const KEY_MALFORMED: &str =
        "https://example.invalid/idem/problems/idempotency-key-malformed";
    /// 409: a request with this key is being processed; retry after `Retry-After` seconds.
    pub const IN_PROGRESS: &str = "https://example.invalid/idem/problems/request-in-progress";
    /// 413: the request body is larger than the layer's limit.
    pub const BODY_TOO_LARGE: &str = "https://example.invalid/idem/problems/body-too-large";
    /// 422: the key was used before with another request (method, path, query or body).
    pub const KEY_REUSED: &str = "https://example.invalid/idem/problems/idempotency-key-reused";
    /// 500: the layer found no principal and anonymous requests are not allowed.
    pub const PRINCIPAL_MISSING: &str = "https://example.invalid/idem/problems/principal-missing";
    /// 500: a stored response no longer decodes, or the handler's response body failed.
    pub const INTERNAL: &str = "https://example.invalid/idem/problems/internal";
    /// 503: the idempotency store failed; the request did not run. Retry later.
    pub const STORE_UNAVAILABLE: &str = "https://example.invalid/idem/problems/store-unavailable";
}

/// The authenticated principal of a request: insert it as a request extension in the
/// authentication middleware (outside the layer); the layer scopes keys by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

type ScopeFn = dyn Fn(&RequestParts) -> Option<String> + Send + Sync;
type StoreIfFn = dyn Fn(StatusCode) -> OnError + Send + Sync;

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

#[derive(Clone)]
struct Config {
    idem: Idem,
    name: Cow<'static, str>,
    methods: Vec<Method>,
    key_required: bool,
    body_limit: usize,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    retry_after: Duration,
    scope: Arc<ScopeFn>,
    allow_anonymous: bool,
    store_if: Arc<StoreIfFn>,
}

/// A tower layer that makes the axum routes it wraps idempotent by their `Idempotency-Key`.
/// See [the module](self) for what it does.
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
    /// requests refused, [`store_policy`].
    pub fn new(idem: Idem) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                idem,
                name: Cow::Borrowed("http"),
                methods: vec![Method::POST, Method::PATCH],
                key_required: true,
                body_limit: 1 << 20,
                ttl: None,
                lease: None,
                wait: None,
                retry_after: Duration::from_secs(1),
                scope: Arc::new(principal_scope),
                allow_anonymous: false,
                store_if: Arc::new(store_policy),
            }),
        }
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

    /// The most a 409's `Retry-After` says (default 1 s, rounded up to whole seconds); it
    /// says less when the claim in flight lapses sooner.
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
    /// with a 500 [`problem::PRINCIPAL_MISSING`] (`false`, the default, so that a missing or
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

impl<S> tower_layer::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service made by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> tower_service::Service<Request<Body>> for IdempotencyService<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The clone is not ready; the one that was polled ready serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(self.config.clone(), inner, req))
    }
}

/// What the fingerprint covers. The body enters as its sha256 (the canonical encoding of a
/// byte string would be long).
#[derive(Serialize)]
struct Fingerprint<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    body_sha256: String,
}

/// Bytes as stored: text when they are UTF-8 (readable by an operator), base64 otherwise.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Blob {
    Text(String),
    Base64 { b64: String },
}

impl Blob {
    fn new(bytes: &[u8]) -> Blob {
        match std::str::from_utf8(bytes) {
            Ok(s) => Blob::Text(s.to_owned()),
            Err(_) => Blob::Base64 {
                b64: base64::engine::general_purpose::STANDARD.encode(bytes),
            },
        }
    }

    fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Blob::Text(s) => Some(s.into_bytes()),
            Blob::Base64 { b64 } => base64::engine::general_purpose::STANDARD.decode(b64).ok(),
        }
    }
}

/// A response as stored.
#[derive(Serialize, Deserialize)]
struct StoredResponse {
    status: u16,
    headers: Vec<(String, Blob)>,
    body: Blob,
}

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The headers that belong to the response, as stored.
fn stored_headers(headers: &HeaderMap) -> Vec<(String, Blob)> {
    let named_in_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            !HOP_BY_HOP.contains(name)
                && *name != header::DATE
                && *name != header::CONTENT_LENGTH
                && *name != IDEMPOTENT_REPLAYED
                && !named_in_connection.iter().any(|n| n == name.as_str())
        })
        .map(|(name, value)| (name.as_str().to_owned(), Blob::new(value.as_bytes())))
        .collect()
}

impl StoredResponse {
    fn new(parts: &ResponseParts, body: &[u8]) -> StoredResponse {
        StoredResponse {
            status: parts.status.as_u16(),
            headers: stored_headers(&parts.headers),
            body: Blob::new(body),
        }
    }

    /// The replayed response, or `None` when the stored record does not make one.
    fn into_response(self) -> Option<Response<Body>> {
        let mut res = Response::new(Body::from(self.body.into_bytes()?));
        *res.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = res.headers_mut();
        for (name, value) in self.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let value = HeaderValue::from_bytes(&value.into_bytes()?).ok()?;
            headers.append(name, value);
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Some(res)
    }
}

/// Why the body of the idempotent call did not give a response to store.
enum Failure<E> {
    Idem(Error),
    /// The store policy released this response; it is in the slot.
    Released,
    Service(E),
    ResponseBody(BoxError),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

/// Parses the `Idempotency-Key` field: `Ok(None)` when there is none.
pub fn parse_key(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("the request has more than one Idempotency-Key field");
    }
    parse_key_value(value.as_bytes()).map(Some)
}

/// Parses one `Idempotency-Key` value: a structured-field string, or a bare value of visible
/// ASCII characters without `"`, `\` and `,`. The key is 1–255 characters.
pub fn parse_key_value(raw: &[u8]) -> Result<String, &'static str> {
    let v = raw.trim_ascii();
    let key = if let Some(rest) = v.strip_prefix(b"\"") {
        let mut key = String::with_capacity(rest.len());
        let mut bytes = rest.iter();
        loop {
            match bytes.next() {
                None => return Err("the Idempotency-Key string has no closing quote"),
                Some(b'"') => break,
                Some(b'\\') => match bytes.next() {
                    Some(&c @ (b'"' | b'\\')) => key.push(c as char),
                    _ => {
                        return Err(
                            "the Idempotency-Key string has an escape other than \\\" or \\\\",
                        )
                    }
                },
                Some(&c @ 0x20..=0x7e) => key.push(c as char),
                Some(_) => {
                    return Err("the Idempotency-Key has a character that is not printable ASCII")
                }
            }
        }
        if !bytes.as_slice().is_empty() {
            return Err("the Idempotency-Key has something after its closing quote (parameters are not accepted)");
        }
        key
    } else {
        if let Some(bad) = v
            .iter()
            .find(|&&c| !(0x21..=0x7e).contains(&c) || b"\"\\,".contains(&c))
        {
            return Err(if bad.is_ascii_whitespace() {
                "an unquoted Idempotency-Key cannot contain whitespace: quote it"
            } else if bad.is_ascii_graphic() {
                "an unquoted Idempotency-Key cannot contain '\"', '\\' or ',': quote it"
            } else {
                "the Idempotency-Key has a character that is not printable ASCII"
            });
        }
        // Only ASCII is left.
        String::from_utf8(v.to_vec()).map_err(|_| "the Idempotency-Key is not ASCII")?
    };
    if key.is_empty() {
        return Err("the Idempotency-Key is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return Err("the Idempotency-Key is longer than 255 characters");
    }
    Ok(key)
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// An `application/problem+json` response (RFC 9457).
fn problem(status: StatusCode, type_: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::to_vec(&Problem {
        type_,
        title,
        status: status.as_u16(),
        detail,
    })
    .unwrap_or_default();
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

fn with_retry_after(mut res: Response<Body>, secs: u64) -> Response<Body> {
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    res
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::key::Digest(Sha256::digest(bytes).into()).to_hex()
}

async fn handle<S, B>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: tower_service::Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if !config.methods.contains(req.method()) {
        return inner.call(req).await.map(|r| r.map(Body::new));
    }
    let key = match parse_key(req.headers()) {
        Ok(Some(key)) => key,
        Ok(None) if !config.key_required => return inner.call(req).await.map(|r| r.map(Body::new)),
        Ok(None) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                problem::KEY_MISSING,
                "Idempotency-Key is missing",
                "this operation is idempotent and requires an Idempotency-Key header, for \
                 example Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
            ))
        }
        Err(why) => {
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                problem::KEY_MALFORMED,
                "Idempotency-Key is malformed",
                why,
            ))
        }
    };
    let (parts, body) = req.into_parts();
    let scope = (config.scope)(&parts);
    if scope.is_none() && !config.allow_anonymous {
        tracing::error!(
            path = parts.uri.path(),
            "idem: IdempotencyLayer found no principal: put the authentication middleware \
             outside the layer, or call allow_anonymous(true)"
        );
        return Ok(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::PRINCIPAL_MISSING,
            "No principal",
            "the server could not tell who sent this request, so it cannot scope its \
             Idempotency-Key",
        ));
    }

    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem::BODY_TOO_LARGE,
            "Request body too large",
            &format!(
                "the body of an idempotent request is limited to {} bytes",
                config.body_limit
            ),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.body_limit as u64) {
        return Ok(too_large());
    }
    let body = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return Ok(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "idem: request body could not be read");
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "about:blank",
                "Bad Request",
                "the request body could not be read",
            ));
        }
    };

    let fingerprint = Fingerprint {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        body_sha256: sha256_hex(&body),
    };
    let mut call = config
        .idem
        .call(config.name.clone())
        .key(&key)
        .fingerprint(&fingerprint);
    if let Some(scope) = &scope {
        call = call.scope(scope);
    }
    if let Some(ttl) = config.ttl {
        call = call.ttl(ttl);
    }
    if let Some(lease) = config.lease {
        call = call.lease(lease);
    }
    if let Some(wait) = config.wait {
        call = call.wait(wait);
    }

    // The fresh response, as the handler made it (with its extensions), for this caller.
    let slot: Mutex<Option<(ResponseParts, Bytes)>> = Mutex::new(None);
    let req = Request::from_parts(parts, Body::from(body));
    let store_if = config.store_if.clone();
    let result = call
        .run(async {
            let res = inner.call(req).await.map_err(Failure::Service)?;
            let (parts, body) = res.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| Failure::ResponseBody(e.into()))?
                .to_bytes();
            let stored = StoredResponse::new(&parts, &body);
            let keep = store_if(parts.status);
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some((parts, body));
            match keep {
                OnError::Keep => Ok(stored),
                OnError::Release => Err(Failure::Released),
            }
        })
        .await;
    let fresh = || {
        slot.lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .map(|(parts, body)| Response::from_parts(parts, Body::from(body)))
    };

    Ok(match result {
        Ok(Outcome::Fresh(_)) | Err(Failure::Released) => match fresh() {
            Some(res) => res,
            None => internal("the handler's response was lost"),
        },
        Ok(Outcome::Replayed(stored)) => match stored.into_response() {
            Some(res) => res,
            None => internal("the stored response is not a valid HTTP response"),
        },
        Err(Failure::Service(e)) => return Err(e),
        Err(Failure::ResponseBody(e)) => {
            tracing::warn!(error = %e, "idem: the handler's response body failed; key released");
            internal("the response body failed")
        }
        Err(Failure::Idem(e)) => match e {
            Error::InProgress { retry_after, .. } => {
                let wait = retry_after
                    .unwrap_or(config.retry_after)
                    .min(config.retry_after);
                with_retry_after(
                    problem(
                        StatusCode::CONFLICT,
                        problem::IN_PROGRESS,
                        "Request in progress",
                        "a request with this Idempotency-Key is being processed; retry it later",
                    ),
                    wait.as_millis().div_ceil(1000) as u64,
                )
            }
            Error::Mismatch { .. } => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                problem::KEY_REUSED,
                "Idempotency-Key reused",
                "this Idempotency-Key was already used with another request (method, path, \
                 query or body); use a new key for a new request",
            ),
            Error::Store(e) => {
                tracing::warn!(error = %e, "idem: store failed; answering 503");
                with_retry_after(
                    problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        problem::STORE_UNAVAILABLE,
                        "Idempotency store unavailable",
                        "the request was not processed; retry it later with the same key",
                    ),
                    config.retry_after.as_millis().div_ceil(1000) as u64,
                )
            }
            Error::LeaseLost { .. } => {
                // The handler ran to the end; its response is real even though it could not be
                // stored (another attempt took the key over after this one's lease lapsed).
                tracing::warn!(error = %e, "idem: lease lost; the response was not stored");
                match fresh() {
                    Some(res) => res,
                    None => internal("the handler's response was lost"),
                }
            }
            e => {
                tracing::error!(error = %e, "idem: idempotent request failed");
                internal("the idempotent request could not be completed")
            }
        },
    })
}

fn internal(detail: &str) -> Response<Body> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::INTERNAL,
        "Internal Server Error",
        detail,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let ok = |raw: &str| parse_key_value(raw.as_bytes()).unwrap();
        let bad = |raw: &str| assert!(parse_key_value(raw.as_bytes()).is_err(), "{raw:?}");
        assert_eq!(ok("\"abc-123\""), "abc-123");
        assert_eq!(ok("  \"a b\"  "), "a b");
        assert_eq!(ok(r#""a\"b\\c""#), r#"a"b\c"#);
        assert_eq!(
            ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(ok(&"k".repeat(255)), "k".repeat(255));
        assert_eq!(ok(&format!("\"{}\"", "k".repeat(255))), "k".repeat(255));
        bad(&"k".repeat(256));
        bad("\"\"");
        bad("");
        bad("\"abc");
        bad("\"abc\";p=1");
        bad("\"a\\nb\"");
        bad("a b");
        bad("a,b");
        bad("\"caf\u{e9}\"");
        bad("a\"b");
    }

    #[test]
    fn two_fields_are_malformed() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_key(&h), Ok(None));
        h.append(IDEMPOTENCY_KEY, HeaderValue::from_static("\"a\""));
        assert_eq!(parse_key(&h), Ok(Some("a".into())));
        h.append(IDEMPOTENCY_KEY, HeaderValue::from_static("\"b\""));
        assert!(parse_key(&h).is_err());
    }

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

    #[test]
    fn stored_headers_leave_out_hop_by_hop_and_date() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::LOCATION, HeaderValue::from_static("/charges/1"));
        h.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Jul 2025 00:00:00 GMT"),
        );
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert("x-bin", HeaderValue::from_bytes(&[0xff, b'a']).unwrap());
        let names: Vec<String> = stored_headers(&h).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["content-type", "location", "x-bin"]);

        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::CREATED;
        parts.headers = h;
        let stored = StoredResponse::new(&parts, &[0, 159, 146, 150]);
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let res = back.into_response().unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()["x-bin"].as_bytes(), [0xff, b'a']);
        assert_eq!(res.headers()[IDEMPOTENT_REPLAYED], "true");
        assert!(res.headers().get(header::DATE).is_none());
    }
}
