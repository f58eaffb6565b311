//! The tower service: one request through the layer, in named steps: the key, the scope, the
//! body, the idempotent call around the inner service, and the answer.

use super::body::{Buffered, LayerBody};
use super::config::{Config, NoStore, Protocol};
use super::detach::Refused;
use super::fingerprint::Fingerprint;
use super::key::parse_key;
use super::problem::{self, Problem};
use super::reconcile::{AbandonedRequest, ReconcileFn};
use super::stored::{FreshResponse, StoredResponse};
use crate::error::BoxError;
use crate::policy::OnError;
use crate::{Call, Error, Outcome};
use bytes::Bytes;
use http::request::Parts as RequestParts;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, LengthLimitError, Limited};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The request the inner service gets: the buffered body of a request under a key, the
/// original one of a request that passes through.
pub type InnerRequest<B> = Request<LayerBody<B>>;

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
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

/// Over `http::Request<ReqB>` for any body: the inner service gets [`InnerRequest<ReqB>`] and
/// the caller a response whose body is the inner one or the layer's [`Buffered`] one.
impl<S, ReqB, ResB> tower_service::Service<Request<ReqB>> for IdempotencyService<S>
where
    S: tower_service::Service<InnerRequest<ReqB>, Response = Response<ResB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<LayerBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone is not ready; the one that was polled ready serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(self.config.clone(), inner, req))
    }
}

/// The response the caller gets.
type LayerResponse<B> = Response<LayerBody<B>>;

/// The refusals before the handler runs, written in the layer's protocol.
fn render<B>(config: &Config, problem: Problem) -> LayerResponse<B> {
    let res: Response<Buffered> = match config.protocol {
        Protocol::Http => problem.into_response(),
        #[cfg(feature = "grpc")]
        Protocol::Grpc => super::grpc_status::status_response(problem),
    };
    res.map(Either::Left)
}

/// One request through the layer.
async fn handle<S, ReqB, ResB>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqB>,
) -> Result<LayerResponse<ResB>, S::Error>
where
    S: tower_service::Service<InnerRequest<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let key = match request_key(&config, &req) {
        Ok(Some(key)) => key,
        Ok(None) => {
            let req = req.map(Either::Right);
            return inner.call(req).await.map(|r| r.map(Either::Right));
        }
        Err(problem) => return Ok(render(&config, problem)),
    };
    let (parts, body) = req.into_parts();
    let scope = match request_scope(&config, &parts) {
        Ok(scope) => scope,
        Err(problem) => return Ok(render(&config, problem)),
    };
    let body = match read_body(&config, &parts, body).await {
        Ok(body) => body,
        Err(problem) => return Ok(render(&config, problem)),
    };
    let call = idempotent_call(&config, &key, scope.as_deref(), &parts, &body);
    // What a reconcile hook is told, should this request take over an abandoned attempt.
    let abandoned = config.reconcile.as_ref().map(|_| AbandonedRequest {
        key,
        scope,
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
        recovery: crate::Recovery::new(2, 0),
    });
    let req = Request::from_parts(parts, Either::Left(Buffered::from(body)));
    let call = Inner { call, abandoned };
    if !config.detached {
        let (result, fresh) = run_inner(call, config.clone(), inner, req).await;
        return answer(&config, result, fresh);
    }
    // Detached: from here on the request runs on a task of its own, which the connection's
    // future only waits for; a client that goes away drops the wait, not the handler.
    let admitted = match config.handlers.admit(config.max_in_flight) {
        Ok(admitted) => admitted,
        Err(refused) => return Ok(render(&config, refusal(&config, refused))),
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
            Ok(render(
                &config,
                Problem::internal("the handler was cancelled"),
            ))
        }
    }
}

/// The 503 of a request not admitted to run detached.
fn refusal(config: &Config, refused: Refused) -> Problem {
    let problem = match refused {
        Refused::Overloaded => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::OVERLOADED,
            "Too many requests in flight",
            "the server is running as many idempotent requests as it allows; the request did \
             not run: retry it later with the same key",
        ),
        Refused::ShuttingDown => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::SHUTTING_DOWN,
            "Shutting down",
            "the server is shutting down; the request did not run: retry it with the same key",
        ),
    };
    problem.retry_after(config.retry_after)
}

/// The request's key; `None` when the layer does not apply (another method, or no key where
/// it is optional); a problem when the key is missing where required, or malformed.
fn request_key<B>(config: &Config, req: &Request<B>) -> Result<Option<String>, Problem> {
    if !config.methods.contains(req.method()) {
        return Ok(None);
    }
    match parse_key(req.headers()) {
        Ok(Some(key)) => Ok(Some(key)),
        Ok(None) if !config.key_required => Ok(None),
        Ok(None) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            problem::KEY_MISSING,
            "Idempotency-Key is missing",
            "this operation is idempotent and requires an Idempotency-Key header, for \
             example Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        )),
        Err(why) => Err(Problem::new(
            StatusCode::BAD_REQUEST,
            problem::KEY_MALFORMED,
            "Idempotency-Key is malformed",
            why,
        )),
    }
}

/// The scope of the request's key (`None`: anonymous), or the 500 that refuses an anonymous
/// request where it is not allowed.
fn request_scope(config: &Config, parts: &RequestParts) -> Result<Option<String>, Problem> {
    let scope = (config.scope)(parts);
    if scope.is_none() && !config.allow_anonymous {
        tracing::error!(
            path = parts.uri.path(),
            "idem: IdempotencyLayer found no principal: put the authentication middleware \
             outside the layer, or call allow_anonymous(true)"
        );
        return Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::PRINCIPAL_MISSING,
            "No principal",
            "the server could not tell who sent this request, so it cannot scope its \
             Idempotency-Key",
        ));
    }
    Ok(scope)
}

/// The whole request body, up to the layer's limit (413 above it, by the declared length
/// first, so that a large body is not read at all).
async fn read_body<B>(config: &Config, parts: &RequestParts, body: B) -> Result<Bytes, Problem>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem::BODY_TOO_LARGE,
            "Request body too large",
            format!(
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
        return Err(too_large());
    }
    match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "idem: request body could not be read");
            Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "about:blank",
                "Bad Request",
                "the request body could not be read",
            ))
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
        .fingerprint(&Fingerprint::of(parts, body, config.fingerprint))
        .on_abandoned(config.on_abandoned);
    if let Some(scope) = scope {
        call = call.scope(scope);
    }
    if let Some(ttl) = config.ttl {
        call = call.ttl(ttl);
    }
    if let Some(lease) = config.lease {
        call = call.lease(lease);
    }
    if let Some(tombstone) = config.tombstone {
        call = call.tombstone(tombstone);
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
    /// The reconcile hook could not tell whether the abandoned attempt's effect happened.
    Undecided(BoxError),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

/// The response the inner service made in this call, when it ran: the caller gets it as it is
/// (with its extensions), whether it was stored or released.
type Fresh = Option<FreshResponse>;

/// The idempotent call of a request, and what its reconcile hook is told (with a hook).
struct Inner {
    call: Call,
    abandoned: Option<AbandonedRequest>,
}

/// Runs the inner service under the idempotent call (or replays, or fails without running it;
/// or, taking over an abandoned attempt with a reconcile hook, adopts the hook's response).
async fn run_inner<S, ReqB, ResB>(
    call: Inner,
    config: Arc<Config>,
    mut inner: S,
    req: InnerRequest<ReqB>,
) -> (Result<Outcome<StoredResponse>, Failure<S::Error>>, Fresh)
where
    S: tower_service::Service<InnerRequest<ReqB>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let slot: Mutex<Fresh> = Mutex::new(None);
    let handler = async {
        let res = inner.call(req).await.map_err(Failure::Service)?;
        let (parts, body) = res.into_parts();
        let collected = body
            .collect()
            .await
            .map_err(|e| Failure::ResponseBody(e.into()))?;
        let trailers = collected.trailers().cloned();
        let fresh = FreshResponse {
            parts,
            body: collected.to_bytes(),
            trailers,
        };
        let keep = keep(&config, &fresh);
        let stored = StoredResponse::new(&fresh, config.stored_headers.as_deref());
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh);
        match keep {
            OnError::Keep => Ok(stored),
            OnError::Release => Err(Failure::Released),
        }
    };
    let result = match (config.reconcile.clone(), call.abandoned) {
        (Some(hook), Some(abandoned)) => {
            call.call
                .reconcile(|| ask(hook, abandoned, &config, &slot))
                .run(handler)
                .await
        }
        _ => call.call.run(handler).await,
    };
    let fresh = slot.into_inner().unwrap_or_else(|p| p.into_inner());
    (result, fresh)
}

/// The reconcile hook's verdict on an abandoned attempt, in the engine's terms: its response
/// (stored and sent, in the slot as a fresh one), `None` (the handler runs), or undecided.
async fn ask<E>(
    hook: Arc<ReconcileFn>,
    mut abandoned: AbandonedRequest,
    config: &Config,
    slot: &Mutex<Fresh>,
) -> Result<Option<StoredResponse>, Failure<E>> {
    if let Some(recovery) = crate::recovery() {
        abandoned.recovery = recovery;
    }
    match hook(abandoned).await {
        Ok(None) => Ok(None),
        Ok(Some(res)) => {
            let (parts, body) = res.into_parts();
            let fresh = FreshResponse {
                parts,
                body,
                trailers: None,
            };
            let stored = StoredResponse::new(&fresh, config.stored_headers.as_deref());
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh);
            Ok(Some(stored))
        }
        Err(e) => Err(Failure::Undecided(e)),
    }
}

/// Whether the layer's policy stores `fresh` or releases its key.
fn keep(config: &Config, fresh: &FreshResponse) -> OnError {
    if fresh.parts.extensions.get::<NoStore>().is_some() {
        return OnError::Release;
    }
    if config.respect_no_store && no_store(&fresh.parts.headers) {
        return OnError::Release;
    }
    if config
        .response_limit
        .is_some_and(|max| fresh.body.len() > max)
    {
        tracing::warn!(
            bytes = fresh.body.len(),
            "idem: response above the layer's response_limit; not stored, key released"
        );
        return OnError::Release;
    }
    match config.protocol {
        Protocol::Http => (config.store_if)(fresh.parts.status),
        #[cfg(feature = "grpc")]
        Protocol::Grpc => (config.grpc_store_if)(super::grpc_status::code_of_response(
            &fresh.parts.headers,
            fresh.trailers.as_ref(),
        )),
    }
}

/// Whether `Cache-Control` says `no-store`.
fn no_store(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-store"))
}

/// The response to the client: the fresh one, a replay, or a problem.
fn answer<B, E>(
    config: &Config,
    result: Result<Outcome<StoredResponse>, Failure<E>>,
    fresh: Fresh,
) -> Result<LayerResponse<B>, E> {
    let fresh = || match fresh {
        Some(f) => Response::from_parts(f.parts, Either::Left(Buffered::new(f.body, f.trailers))),
        None => render(config, Problem::internal("the handler's response was lost")),
    };
    Ok(match result {
        Ok(Outcome::Fresh(_)) | Err(Failure::Released) => fresh(),
        Ok(Outcome::Replayed(stored)) => match stored.into_response() {
            Some(res) => {
                let (mut parts, body) = res.into_parts();
                if let Some(hook) = &config.on_replay {
                    hook(&mut parts);
                }
                Response::from_parts(parts, Either::Left(body))
            }
            None => render(
                config,
                Problem::internal("the stored response is not a valid HTTP response"),
            ),
        },
        Err(Failure::Service(e)) => return Err(e),
        Err(Failure::ResponseBody(e)) => {
            tracing::warn!(error = %e, "idem: the handler's response body failed; key released");
            render(config, Problem::internal("the response body failed"))
        }
        Err(Failure::Undecided(e)) => {
            tracing::warn!(error = %e, "idem: the reconcile hook could not decide an abandoned attempt; it stays abandoned");
            render(
                config,
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    problem::OUTCOME_UNDECIDED,
                    "Outcome undecided",
                    "an earlier attempt of this request was abandoned and whether its effect \
                     happened cannot be told yet; the request did not run: retry it later \
                     with the same key",
                )
                .retry_after(config.retry_after),
            )
        }
        Err(Failure::Idem(e @ Error::LeaseLost { .. })) => {
            // The handler ran to the end; its response is real even though it could not be
            // stored (another attempt took the key over after this one's lease lapsed).
            tracing::warn!(error = %e, "idem: lease lost; the response was not stored");
            fresh()
        }
        Err(Failure::Idem(e)) => render(config, idem_failure(config, e)),
    })
}

/// The problem of an idempotency failure other than a lost lease.
fn idem_failure(config: &Config, e: Error) -> Problem {
    match e {
        Error::InProgress { .. } => {
            // The one rule of "when to ask again" (`Error::retry_after`), as the function error
            // says it; the layer's own value only where the error carries none.
            let after = e.retry_after().unwrap_or(config.retry_after);
            Problem::new(
                StatusCode::CONFLICT,
                problem::IN_PROGRESS,
                "Request in progress",
                "a request with this Idempotency-Key is being processed; retry it later",
            )
            .retry_after(after)
        }
        Error::Mismatch { .. } => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency-Key reused",
            "this Idempotency-Key was already used with another request (method, path, \
             query or body); use a new key for a new request",
        ),
        Error::OutcomeUnknown { .. } => Problem::new(
            StatusCode::LOCKED,
            problem::OUTCOME_UNKNOWN,
            "Outcome unknown",
            "an earlier attempt of this request was abandoned and whether its effect happened \
             is unknown; the key is locked until an operator resolves it. Do not retry blindly, \
             and do not resend the operation under a new key",
        ),
        Error::Expired { .. } => Problem::new(
            StatusCode::GONE,
            problem::KEY_EXPIRED,
            "Idempotency-Key expired",
            "this Idempotency-Key was used and its response is no longer kept; the request \
             did not run again. Use a new key for a new request",
        ),
        Error::Store(e) => {
            tracing::warn!(error = %e, "idem: store failed; answering 503");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::STORE_UNAVAILABLE,
                "Idempotency store unavailable",
                "the request was not processed; retry it later with the same key",
            )
            .retry_after(config.retry_after)
        }
        e => {
            tracing::error!(error = %e, "idem: idempotent request failed");
            Problem::internal("the idempotent request could not be completed")
        }
    }
}
