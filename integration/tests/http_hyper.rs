//! The same `Idempotency-Key` layer on a plain hyper service (no axum): `tower::service_fn`
//! behind `tower::ServiceBuilder`, served by hyper's HTTP/1 connection on a real socket.

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use idem::http::{FingerprintMode, IdempotencyLayer, InnerRequest};
use idem::Idem;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Serves `layer` over a handler that counts its runs and echoes the request body.
async fn serve(layer: IdempotencyLayer) -> (String, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = tower::service_fn(move |req: InnerRequest<Incoming>| {
        let runs = counted.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let res = Response::builder()
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, "text/plain")
                .header(header::SET_COOKIE, format!("session=s{n}"))
                .header(header::ETAG, format!("\"v{n}\""))
                .header("x-internal-trace", format!("t{n}"))
                .body(Full::new(Bytes::from(format!(
                    "run {n}: {}",
                    String::from_utf8_lossy(&body)
                ))))
                .unwrap();
            Ok::<_, Infallible>(res)
        }
    });
    let service = tower::ServiceBuilder::new()
        .layer(layer.allow_anonymous(true))
        .service(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/orders"), runs)
}

async fn post(url: &str, key: &str, ct: &str, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("Idempotency-Key", key)
        .header(header::CONTENT_TYPE, ct)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

fn replayed(res: &reqwest::Response) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

#[tokio::test]
async fn a_plain_hyper_service_replays_under_the_layer() {
    let (url, runs) = serve(IdempotencyLayer::new(Idem::memory())).await;
    let first = post(&url, "\"h-1\"", "text/plain", "hello").await;
    assert_eq!(first.status(), 201);
    assert!(!replayed(&first));
    assert_eq!(first.text().await.unwrap(), "run 1: hello");
    let again = post(&url, "\"h-1\"", "text/plain", "hello").await;
    assert_eq!(again.status(), 201);
    assert!(replayed(&again));
    assert_eq!(again.text().await.unwrap(), "run 1: hello");
    let other = post(&url, "\"h-1\"", "text/plain", "bye").await;
    assert_eq!(other.status(), 422);
    // a request without a key passes through with its own, unbuffered body: refused here
    // (the key is required by default) before the handler runs
    let res = reqwest::Client::new()
        .post(&url)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_replay_carries_every_field_but_set_cookie() {
    let layer = IdempotencyLayer::new(Idem::memory()).on_replay(|parts| {
        parts.headers.insert(
            "x-replayed-by",
            http::HeaderValue::from_static("instance-a"),
        );
    });
    let (url, runs) = serve(layer).await;
    let first = post(&url, "\"c-1\"", "text/plain", "a").await;
    assert_eq!(first.headers()[header::SET_COOKIE], "session=s1");
    assert!(first.headers().get("x-replayed-by").is_none());
    let again = post(&url, "\"c-1\"", "text/plain", "a").await;
    assert!(replayed(&again));
    assert!(
        again.headers().get(header::SET_COOKIE).is_none(),
        "never replayed"
    );
    assert_eq!(again.headers()[header::ETAG], "\"v1\"");
    assert_eq!(again.headers()[header::CONTENT_TYPE], "text/plain");
    // the service's own field, as the first response had it
    assert_eq!(again.headers()["x-internal-trace"], "t1");
    assert_eq!(again.headers()["x-replayed-by"], "instance-a");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // an allow-list restricts the replay; listing Set-Cookie does not store it
    let layer = IdempotencyLayer::new(Idem::memory())
        .replay_headers([header::ETAG])
        .store_header(header::SET_COOKIE);
    let (url, _) = serve(layer).await;
    post(&url, "\"c-2\"", "text/plain", "a").await;
    let again = post(&url, "\"c-2\"", "text/plain", "a").await;
    assert!(replayed(&again));
    assert!(again.headers().get(header::SET_COOKIE).is_none());
    assert!(again.headers().get("x-internal-trace").is_none());
    assert!(again.headers().get(header::CONTENT_TYPE).is_none());
    assert_eq!(again.headers()[header::ETAG], "\"v1\"");
}

#[tokio::test]
async fn canonical_json_fingerprints_replay_reordered_fields() {
    let (url, runs) =
        serve(IdempotencyLayer::new(Idem::memory()).fingerprint(FingerprintMode::Canonical)).await;
    let first = post(&url, "\"j-1\"", "application/json", r#"{"a":1,"b":2}"#).await;
    assert_eq!(first.status(), 201);
    let again = post(&url, "\"j-1\"", "application/json", r#"{ "b": 2, "a": 1 }"#).await;
    assert_eq!(again.status(), 201, "the same request: a replay, not a 422");
    assert!(replayed(&again));
    assert_eq!(again.text().await.unwrap(), r#"run 1: {"a":1,"b":2}"#);
    let other = post(&url, "\"j-1\"", "application/json", r#"{"a":1,"b":3}"#).await;
    assert_eq!(other.status(), 422, "another value is another request");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // the default (raw bytes): another order is another request
    let (url, _) = serve(IdempotencyLayer::new(Idem::memory())).await;
    post(&url, "\"j-2\"", "application/json", r#"{"a":1,"b":2}"#).await;
    let reordered = post(&url, "\"j-2\"", "application/json", r#"{"b":2,"a":1}"#).await;
    assert_eq!(reordered.status(), 422);
}

#[tokio::test]
async fn a_response_limit_releases_the_key_without_a_5xx() {
    let (url, runs) = serve(IdempotencyLayer::new(Idem::memory()).response_limit(8)).await;
    for n in 1..=2 {
        let res = post(&url, "\"big\"", "text/plain", "a long body").await;
        assert_eq!(res.status(), 201);
        assert!(!replayed(&res));
        assert_eq!(res.text().await.unwrap(), format!("run {n}: a long body"));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "not stored: the retry ran again"
    );
}

#[allow(dead_code)]
fn _inner_request_is_a_request(
    req: InnerRequest<Incoming>,
) -> Request<idem::http::LayerBody<Incoming>> {
    req
}

/// With a tombstone, a retry after the ttl is `410 Gone` with the `idempotency-key-expired`
/// problem type, and the handler does not run again; a new key runs.
#[tokio::test]
async fn a_late_retry_under_a_tombstone_is_410_gone() {
    let layer = IdempotencyLayer::new(Idem::memory())
        .ttl(std::time::Duration::from_millis(300))
        .tombstone(std::time::Duration::from_secs(3600));
    let (url, runs) = serve(layer).await;
    let first = post(&url, "\"t-1\"", "text/plain", "pay").await;
    assert_eq!(first.status(), 201);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let late = post(&url, "\"t-1\"", "text/plain", "pay").await;
    assert_eq!(late.status(), 410);
    assert_eq!(
        late.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let doc: serde_json::Value = late.json().await.unwrap();
    assert_eq!(doc["type"], idem::http::problem::KEY_EXPIRED);
    assert!(idem::http::problem::KEY_EXPIRED.ends_with("#idempotency-key-expired"));
    assert_eq!(doc["status"], 410);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let other = post(&url, "\"t-2\"", "text/plain", "pay").await;
    assert_eq!(other.status(), 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
