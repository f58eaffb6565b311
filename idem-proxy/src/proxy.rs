//! The proxy: routes, principals, the layer per route over the upstream client, the server
//! loop and its graceful shutdown.

use crate::config::{KeyMode, RouteSettings, Settings};
use crate::log::{Outcome, RequestLog};
use crate::principal::{digest, PrincipalSource, Unauthorized};
use http::uri::{Authority, PathAndQuery};
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem::http::{
    parse_key, Buffered, IdempotencyLayer, IdempotencyService, LayerBody, Principal,
    ShutdownHandle, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED,
};
use idem::Idem;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;

/// A body to or from the upstream: the layer's buffered one, or the connection's own.
pub type UpBody = LayerBody<Incoming>;
/// A body the proxy answers with.
pub type ProxyBody = LayerBody<UpBody>;

/// The problem `type` of an upstream that could not be reached (502).
pub const UPSTREAM_UNAVAILABLE: &str = "urn:idem-proxy:problem:upstream-unavailable";
/// The problem `type` of an upstream that did not answer in time (504).
pub const UPSTREAM_TIMEOUT: &str = "urn:idem-proxy:problem:upstream-timeout";
/// The problem `type` of a request whose principal is missing or whose token is invalid (401).
pub const UNAUTHORIZED: &str = "urn:idem-proxy:problem:unauthorized";

/// A response extension: this response is the upstream's.
#[derive(Clone, Copy)]
pub struct FromUpstream;

/// A response extension: the upstream failed (502/504 made by the proxy).
#[derive(Clone, Copy)]
pub struct UpstreamFailed;

/// The hop-by-hop fields, which one connection's ends set for themselves.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // the fields a Connection header names are hop-by-hop too
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// A problem+json response (RFC 9457).
pub fn problem<B>(
    status: StatusCode,
    type_: &str,
    title: &str,
    detail: &str,
    wrap: impl FnOnce(Buffered) -> B,
) -> Response<B> {
    let body = serde_json::json!({
        "type": type_,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut res = Response::new(wrap(Buffered::from(body.to_string().into_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// The service behind the proxy.
pub struct Upstream {
    client: Client<HttpConnector, UpBody>,
    authority: Authority,
    timeout: Duration,
}

impl Upstream {
    /// A client of the upstream at `authority`.
    pub fn new(authority: Authority, timeout: Duration) -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Upstream {
            client,
            authority,
            timeout,
        }
    }

    /// `req` sent upstream; its response, or the 502 / 504 of an upstream that failed.
    pub async fn forward(&self, mut req: Request<UpBody>) -> Response<UpBody> {
        strip_hop_by_hop(req.headers_mut());
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let uri = Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build();
        match uri {
            Ok(uri) => *req.uri_mut() = uri,
            Err(_) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "about:blank",
                    "Bad Request",
                    "the request target is not valid",
                    Either::Left,
                )
            }
        }
        *req.version_mut() = http::Version::HTTP_11;
        let failed = |status, type_, title, detail: String| {
            let mut res = problem(status, type_, title, &detail, Either::Left);
            res.extensions_mut().insert(UpstreamFailed);
            res
        };
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(res)) => {
                let mut res = res.map(Either::Right);
                strip_hop_by_hop(res.headers_mut());
                res.extensions_mut().insert(FromUpstream);
                res
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "upstream request failed");
                failed(
                    StatusCode::BAD_GATEWAY,
                    UPSTREAM_UNAVAILABLE,
                    "Upstream unavailable",
                    "the service behind the proxy could not be reached; the request did not \
                     run and its key is free: retry it"
                        .to_owned(),
                )
            }
            Err(_) => failed(
                StatusCode::GATEWAY_TIMEOUT,
                UPSTREAM_TIMEOUT,
                "Upstream timeout",
                format!(
                    "the service behind the proxy did not answer within {:?}; the key is free: \
                     retry it",
                    self.timeout
                ),
            ),
        }
    }
}

/// The layer's inner service: the upstream.
#[derive(Clone)]
pub struct UpstreamService(Arc<Upstream>);

impl tower_service::Service<Request<UpBody>> for UpstreamService {
    type Response = Response<UpBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<UpBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<UpBody>) -> Self::Future {
        let up = self.0.clone();
        Box::pin(async move { Ok(up.forward(req).await) })
    }
}

/// A route and the layer's service for it.
struct RouteEntry {
    name: String,
    settings: RouteSettings,
    service: IdempotencyService<UpstreamService>,
}

impl RouteEntry {
    /// Whether `req` goes through the layer (else it is streamed through untouched).
    fn keyed<B>(&self, req: &Request<B>) -> bool {
        match self.settings.key {
            KeyMode::Off => false,
            _ if !self.settings.methods.contains(req.method()) => false,
            KeyMode::Required => true,
            KeyMode::Optional => req.headers().contains_key(IDEMPOTENCY_KEY),
        }
    }
}

/// The proxy's request handling.
pub struct Proxy {
    routes: Vec<(crate::config::Route, RouteEntry)>,
    default: RouteEntry,
    upstream: Arc<Upstream>,
    principal: PrincipalSource,
    allow_anonymous: bool,
    shutdown: ShutdownHandle,
}

impl Proxy {
    /// The proxy of `settings` on `idem`.
    pub fn new(settings: Settings, idem: Idem) -> Proxy {
        let upstream = Arc::new(Upstream::new(
            settings.upstream.authority.clone(),
            settings.upstream_timeout,
        ));
        let mut base = IdempotencyLayer::new(idem)
            // the proxy refuses requests without a principal itself (401), before the layer
            .allow_anonymous(true)
            .body_limit(settings.body_limit)
            .response_limit(settings.response_limit);
        if let Some(max) = settings.max_in_flight {
            base = base.max_in_flight(max);
        }
        // every route's layer is made from `base`: they share its count of requests in
        // flight and its shutdown
        let shutdown = base.shutdown_handle();
        let entry = |name: String, s: &RouteSettings| {
            let mut layer = base
                .clone()
                .methods(s.methods.clone())
                .require_key(s.key == KeyMode::Required)
                .fingerprint(s.fingerprint.mode())
                .on_abandoned(s.on_abandoned.choice());
            if let Some(ttl) = s.ttl {
                layer = layer.ttl(ttl);
            }
            if let Some(lease) = s.lease {
                layer = layer.lease(lease);
            }
            RouteEntry {
                name,
                settings: s.clone(),
                service: tower_layer_apply(&layer, UpstreamService(upstream.clone())),
            }
        };
        let routes = settings
            .routes
            .iter()
            .map(|r| (r.clone(), entry(r.path.clone(), &r.settings)))
            .collect();
        let default = entry("*".to_owned(), &settings.defaults);
        Proxy {
            routes,
            default,
            upstream: upstream.clone(),
            principal: settings.principal,
            allow_anonymous: settings.allow_anonymous,
            shutdown,
        }
    }

    /// The handle that waits for detached upstream calls.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    fn route(&self, method: &Method, path: &str) -> &RouteEntry {
        self.routes
            .iter()
            .find(|(r, _)| r.matches(path) && r.settings.methods.contains(method))
            .map_or(&self.default, |(_, e)| e)
    }

    /// One request.
    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let route = self.route(req.method(), req.uri().path());
        let key = match parse_key(req.headers()) {
            Ok(Some(k)) => Some(digest(k.as_bytes())),
            _ => None,
        };
        let mut log = RequestLog::start(&route.name, req.method(), req.uri().path(), key);
        forwarded_for(req.headers_mut(), peer);
        if !route.keyed(&req) {
            let res = self.upstream.forward(req.map(Either::Right)).await;
            let outcome = match res.extensions().get::<UpstreamFailed>() {
                Some(_) => Outcome::UpstreamFailed,
                None => Outcome::Passthrough,
            };
            log.finish(outcome, res.status());
            return Ok(res.map(Either::Right));
        }
        match self.principal.scope(req.headers(), self.allow_anonymous) {
            Ok(Some(scope)) => {
                req.extensions_mut().insert(Principal(scope));
            }
            Ok(None) => {}
            Err(Unauthorized(why)) => {
                let mut res = problem(
                    StatusCode::UNAUTHORIZED,
                    UNAUTHORIZED,
                    "Unauthorized",
                    &why,
                    Either::Left,
                );
                res.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                log.finish(Outcome::Unauthorized, res.status());
                return Ok(res);
            }
        }
        let mut service = route.service.clone();
        let res = match tower_service::Service::call(&mut service, req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let outcome = if res.headers().contains_key(IDEMPOTENT_REPLAYED) {
            Outcome::Replayed
        } else if res.extensions().get::<FromUpstream>().is_some() {
            Outcome::Fresh
        } else if res.extensions().get::<UpstreamFailed>().is_some() {
            Outcome::UpstreamFailed
        } else {
            Outcome::Refused
        };
        log.finish(outcome, res.status());
        Ok(res)
    }
}

fn tower_layer_apply(
    layer: &IdempotencyLayer,
    inner: UpstreamService,
) -> IdempotencyService<UpstreamService> {
    tower_layer::Layer::layer(layer, inner)
}

/// Appends the client's address to `X-Forwarded-For`.
fn forwarded_for(headers: &mut HeaderMap, peer: SocketAddr) {
    let name = HeaderName::from_static("x-forwarded-for");
    let value = match headers.get(&name).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(name, v);
    }
}

/// Serves `proxy` on `listener` until `stop` resolves; then stops accepting, lets the open
/// requests finish and waits for the detached upstream calls, each up to `deadline`.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    stop: impl Future<Output = ()>,
    deadline: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let http = hyper::server::conn::http1::Builder::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // out of file descriptors and the like: wait rather than spin
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let p = proxy.clone();
                let service = hyper::service::service_fn(move |req| p.clone().handle(req, peer));
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: waiting for open requests and detached upstream calls");
    let handle = proxy.shutdown_handle();
    let (conns, detached) = tokio::join!(
        tokio::time::timeout(deadline, graceful.shutdown()),
        handle.shutdown(deadline)
    );
    if conns.is_err() {
        tracing::warn!("connections still open at the shutdown deadline");
    }
    if let Err(still) = detached {
        tracing::warn!("{still}");
    }
}
