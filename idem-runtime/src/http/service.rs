//! The tower service: one request through the layer, in named steps: the key, the scope, the
//! body, the idempotent call around the inner service, and the answer.

use super::detach::Refused;
use super::fingerprint::Fingerprint;
use super::key::parse_key;
use super::layer::Config;
use super::problem;
use super::stored::StoredResponse;
use crate::error::BoxError;
use crate::policy::OnError;
use crate::{Call, Error, Outcome};
// The layer buffers bodies into axum's body type, which is what its inner service takes.
use ::axum::body::Body;
use bytes::Bytes;
use http::request::Parts as RequestParts;
use http::response::Parts as ResponseParts;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The service made by [`IdempotencyLayer`](super::axum::IdempotencyLayer).
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }
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

/// One request through the layer.
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
    let key = match request_key(&config, &req) {
        KeyStep::Key(key) => key,
        KeyStep::PassThrough => return inner.call(req).await.map(|r| r.map(Body::new)),
        KeyStep::Answer(res) => return Ok(res),
    };
    let (parts, body) = req.into_parts();
    let scope = match request_scope(&config, &parts) {
        Ok(scope) => scope,
        Err(refusal) => return Ok(*refusal),
    };
    let body = match read_body(&config, &parts, body).await {
        Ok(body) => body,
        Err(refusal) => return Ok(*refusal),
    };
    let call = idempotent_call(&config, &key, scope.as_deref(), &parts, &body);
    let req = Request::from_parts(parts, Body::from(body));
    if !config.detached {
        let (result, fresh) = run_inner(call, config.clone(), inner, req).await;
        return answer(&config, result, fresh);
    }
    // Detached: from here on the request runs on a task of its own, which the connection's
    // future only waits for; a client that goes away drops the wait, not the handler.
    let admitted = match config.handlers.admit(config.max_in_flight) {
        Ok(admitted) => admitted,
        Err(refused) => return Ok(refusal(&config, refused)),
    };
    let task = config
        .handlers
        .spawn(admitted, run_inner(call, config.clone(), inner, req));
    match task.await {
        Ok((result, fresh)) => answer(&config, result, fresh),
        // The handler panicked: the panic goes on where it would have gone undetached (the
        // engine has already released the key).
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => {
            tracing::error!(error = %e, "idem: detached handler cancelled");
            Ok(problem::internal("the handler was cancelled"))
        }
    }
}

/// The 503 of a request not admitted to run detached.
fn refusal(config: &Config, refused: Refused) -> Response<Body> {
    let res = match refused {
        Refused::Overloaded => problem::response(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::OVERLOADED,
            "Too many requests in flight",
            "the server is running as many idempotent requests as it allows; the request did \
             not run: retry it later with the same key",
        ),
        Refused::ShuttingDown => problem::response(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::SHUTTING_DOWN,
            "Shutting down",
            "the server is shutting down; the request did not run: retry it with the same key",
        ),
    };
    problem::with_retry_after(res, config.retry_after)
}

/// The problem document that refuses a request before the handler runs.
type Refusal = Box<Response<Body>>;

/// What the request's `Idempotency-Key` makes of it.
enum KeyStep {
    /// The layer applies, with this key.
    Key(String),
    /// The layer does not apply (another method, or no key where it is optional).
    PassThrough,
    /// The request is refused: no key where it is required, or a malformed one.
    Answer(Response<Body>),
}

fn request_key(config: &Config, req: &Request<Body>) -> KeyStep {
    if !config.methods.contains(req.method()) {
        return KeyStep::PassThrough;
    }
    match parse_key(req.headers()) {
        Ok(Some(key)) => KeyStep::Key(key),
        Ok(None) if !config.key_required => KeyStep::PassThrough,
        Ok(None) => KeyStep::Answer(problem::response(
            StatusCode::BAD_REQUEST,
            problem::KEY_MISSING,
            "Idempotency-Key is missing",
            "this operation is idempotent and requires an Idempotency-Key header, for \
             example Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        )),
        Err(why) => KeyStep::Answer(problem::response(
            StatusCode::BAD_REQUEST,
            problem::KEY_MALFORMED,
            "Idempotency-Key is malformed",
            why,
        )),
    }
}

/// The scope of the request's key (`None`: anonymous), or the 500 that refuses an anonymous
/// request where it is not allowed.
fn request_scope(config: &Config, parts: &RequestParts) -> Result<Option<String>, Refusal> {
    let scope = (config.scope)(parts);
    if scope.is_none() && !config.allow_anonymous {
        tracing::error!(
            path = parts.uri.path(),
            "idem: IdempotencyLayer found no principal: put the authentication middleware \
             outside the layer, or call allow_anonymous(true)"
        );
        return Err(Box::new(problem::response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::PRINCIPAL_MISSING,
            "No principal",
            "the server could not tell who sent this request, so it cannot scope its \
             Idempotency-Key",
        )));
    }
    Ok(scope)
}

/// The whole request body, up to the layer's limit (413 above it, by the declared length
/// first, so that a large body is not read at all).
async fn read_body(config: &Config, parts: &RequestParts, body: Body) -> Result<Bytes, Refusal> {
    let too_large = || {
        Box::new(problem::response(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem::BODY_TOO_LARGE,
            "Request body too large",
            &format!(
                "the body of an idempotent request is limited to {} bytes",
                config.body_limit
            ),
        ))
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.body_limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "idem: request body could not be read");
            Err(Box::new(problem::response(
                StatusCode::BAD_REQUEST,
                "about:blank",
                "Bad Request",
                "the request body could not be read",
            )))
        }
    }
}

/// The idempotent call of this request: its key in its scope, its fingerprint, the layer's
/// durations.
fn idempotent_call(
    config: &Config,
    key: &str,
    scope: Option<&str>,
    parts: &RequestParts,
    body: &[u8],
) -> Call {
    let mut call = config
        .idem
        .call(config.name.clone())
        .key(key)
        .fingerprint(&Fingerprint::of(parts, body));
    if let Some(scope) = scope {
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
    call
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

/// The response the inner service made in this call, when it ran: the caller gets it as it is
/// (with its extensions), whether it was stored or released.
type Fresh = Option<(ResponseParts, Bytes)>;

/// Runs the inner service under the idempotent call (or replays, or fails without running it).
async fn run_inner<S, B>(
    call: Call,
    config: Arc<Config>,
    mut inner: S,
    req: Request<Body>,
) -> (Result<Outcome<StoredResponse>, Failure<S::Error>>, Fresh)
where
    S: tower_service::Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let slot: Mutex<Fresh> = Mutex::new(None);
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
    let fresh = slot.into_inner().unwrap_or_else(|p| p.into_inner());
    (result, fresh)
}

/// The response to the client: the fresh one, a replay, or a problem document.
fn answer<E>(
    config: &Config,
    result: Result<Outcome<StoredResponse>, Failure<E>>,
    fresh: Fresh,
) -> Result<Response<Body>, E> {
    let fresh = || {
        fresh
            .map(|(parts, body)| Response::from_parts(parts, Body::from(body)))
            .unwrap_or_else(|| problem::internal("the handler's response was lost"))
    };
    Ok(match result {
        Ok(Outcome::Fresh(_)) | Err(Failure::Released) => fresh(),
        Ok(Outcome::Replayed(stored)) => stored.into_response().unwrap_or_else(|| {
            problem::internal("the stored response is not a valid HTTP response")
        }),
        Err(Failure::Service(e)) => return Err(e),
        Err(Failure::ResponseBody(e)) => {
            tracing::warn!(error = %e, "idem: the handler's response body failed; key released");
            problem::internal("the response body failed")
        }
        Err(Failure::Idem(e @ Error::LeaseLost { .. })) => {
            // The handler ran to the end; its response is real even though it could not be
            // stored (another attempt took the key over after this one's lease lapsed).
            tracing::warn!(error = %e, "idem: lease lost; the response was not stored");
            fresh()
        }
        Err(Failure::Idem(e)) => idem_failure(config, e),
    })
}

/// The problem document of an idempotency failure other than a lost lease.
fn idem_failure(config: &Config, e: Error) -> Response<Body> {
    match e {
        Error::InProgress { .. } => {
            // The one rule of "when to ask again" (`Error::retry_after`), as the function error
            // says it; the layer's own value only where the error carries none.
            let after = e.retry_after().unwrap_or(config.retry_after);
            problem::with_retry_after(
                problem::response(
                    StatusCode::CONFLICT,
                    problem::IN_PROGRESS,
                    "Request in progress",
                    "a request with this Idempotency-Key is being processed; retry it later",
                ),
                after,
            )
        }
        Error::Mismatch { .. } => problem::response(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency-Key reused",
            "this Idempotency-Key was already used with another request (method, path, \
             query or body); use a new key for a new request",
        ),
        Error::Store(e) => {
            tracing::warn!(error = %e, "idem: store failed; answering 503");
            problem::with_retry_after(
                problem::response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    problem::STORE_UNAVAILABLE,
                    "Idempotency store unavailable",
                    "the request was not processed; retry it later with the same key",
                ),
                config.retry_after,
            )
        }
        e => {
            tracing::error!(error = %e, "idem: idempotent request failed");
            problem::internal("the idempotent request could not be completed")
        }
    }
}
