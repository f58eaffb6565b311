//! The `Idempotency-Key` layer on a real axum server (a TCP socket on 127.0.0.1) driven by a
//! real HTTP client.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use idem::http::axum::{problem, IdempotencyLayer, Principal};
use idem::{Idem, OnError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Deserialize)]
struct NewCharge {
    amount: u64,
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Charge {
    id: usize,
    owner: String,
    amount: u64,
}

#[derive(Clone, Default)]
struct Ledger {
    charges: Arc<Mutex<Vec<Charge>>>,
    /// Calls of /flaky per owner: the first one fails with a 500.
    flaky_calls: Arc<Mutex<HashMap<String, usize>>>,
    /// Calls of /declined: always a 402 (stored), then how many times it ran.
    declined_calls: Arc<AtomicUsize>,
}

impl Ledger {
    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
    fn count_of(&self, owner: &str) -> usize {
        self.charges
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.owner == owner)
            .count()
    }
}

async fn charge(
    State(ledger): State<Ledger>,
    Extension(Principal(owner)): Extension<Principal>,
    Json(new): Json<NewCharge>,
) -> Response {
    if new.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(new.delay_ms)).await;
    }
    let charge = {
        let mut charges = ledger.charges.lock().unwrap();
        let charge = Charge {
            id: charges.len() + 1,
            owner,
            amount: new.amount,
        };
        charges.push(charge.clone());
        charge
    };
    (
        StatusCode::CREATED,
        [
            (header::LOCATION, format!("/charges/{}", charge.id)),
            (
                header::HeaderName::from_static("x-charge-id"),
                charge.id.to_string(),
            ),
            (header::SET_COOKIE, format!("session=c{}", charge.id)),
        ],
        Json(charge),
    )
        .into_response()
}

async fn flaky(
    State(ledger): State<Ledger>,
    Extension(Principal(owner)): Extension<Principal>,
    body: String,
) -> Response {
    let n = {
        let mut calls = ledger.flaky_calls.lock().unwrap();
        let n = calls.entry(owner).or_default();
        *n += 1;
        *n
    };
    if n == 1 {
        (StatusCode::INTERNAL_SERVER_ERROR, "the gateway timed out").into_response()
    } else {
        (StatusCode::CREATED, format!("done after {n} calls: {body}")).into_response()
    }
}

async fn declined(State(ledger): State<Ledger>) -> Response {
    let n = ledger.declined_calls.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::PAYMENT_REQUIRED,
        format!("card declined (call {n})"),
    )
        .into_response()
}

/// `Authorization: Bearer <user>` makes `<user>` the principal.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    match user {
        Some(user) => {
            req.extensions_mut().insert(Principal(user));
            next.run(req).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

struct Server {
    base: String,
    ledger: Ledger,
    http: reqwest::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves the app under `layer` on a fresh 127.0.0.1 port.
async fn serve(layer: IdempotencyLayer) -> Server {
    let ledger = Ledger::default();
    let app = Router::new()
        .route("/charges", post(charge).get(|| async { "listing" }))
        .route("/flaky", post(flaky))
        .route("/declined", post(declined))
        .layer(layer)
        .layer(middleware::from_fn(authenticate))
        .with_state(ledger.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        base: format!("http://{addr}"),
        ledger,
        http: reqwest::Client::new(),
        task,
    }
}

impl Server {
    fn post(&self, path: &str, user: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(user);
        match key {
            Some(k) => req.header("Idempotency-Key", k),
            None => req,
        }
    }

    async fn charge(&self, user: &str, key: &str, amount: u64) -> reqwest::Response {
        self.post("/charges", user, Some(key))
            .json(&serde_json::json!({ "amount": amount }))
            .send()
            .await
            .unwrap()
    }
}

fn replayed(res: &reqwest::Response) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Checks a problem response (RFC 9457) and returns its body.
async fn problem_of(res: reqwest::Response, status: u16, type_: &str) -> Value {
    assert_eq!(res.status().as_u16(), status);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["type"], type_, "{body}");
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["title"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    body
}

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new(Idem::memory())
}

#[tokio::test]
async fn a_double_submit_is_replayed() {
    // every field of the first response is replayed (x-charge-id is the handler's own), but
    // Set-Cookie
    let s = serve(layer()).await;
    let first = s.charge("alice", "\"k-1\"", 1200).await;
    assert_eq!(first.status(), 201);
    assert!(!replayed(&first));
    let location = first.headers()[header::LOCATION].clone();
    assert_eq!(first.headers()[header::SET_COOKIE], "session=c1");
    let first_body: Charge = first.json().await.unwrap();

    let again = s.charge("alice", "\"k-1\"", 1200).await;
    assert_eq!(again.status(), 201);
    assert!(replayed(&again));
    assert_eq!(again.headers()[header::LOCATION], location);
    assert_eq!(again.headers()["x-charge-id"], first_body.id.to_string());
    assert!(again.headers().get(header::SET_COOKIE).is_none());
    assert_eq!(again.headers()[header::CONTENT_TYPE], "application/json");
    // one Date, the server's own, not a stored copy beside it
    assert_eq!(again.headers().get_all(header::DATE).iter().count(), 1);
    assert_eq!(again.json::<Charge>().await.unwrap(), first_body);
    assert_eq!(s.ledger.count(), 1);
}

#[tokio::test]
async fn a_bare_key_is_the_same_key_as_its_quoted_form() {
    let s = serve(layer()).await;
    let first = s.charge("alice", "8e03978e-40d5", 5).await;
    assert_eq!(first.status(), 201);
    let again = s.charge("alice", "\"8e03978e-40d5\"", 5).await;
    assert!(replayed(&again));
    assert_eq!(s.ledger.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_charge_once() {
    let s = Arc::new(serve(layer()).await);
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let res = s
                .post("/charges", "alice", Some("\"concurrent\""))
                .json(&serde_json::json!({ "amount": 700, "delay_ms": 300 }))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            let was_replayed = replayed(&res);
            let retry_after = res.headers().get(header::RETRY_AFTER).cloned();
            let body: Value = res.json().await.unwrap();
            (status, was_replayed, retry_after, body)
        }));
    }
    let (mut fresh, mut replays, mut conflicts) = (0, 0, 0);
    for t in tasks {
        let (status, was_replayed, retry_after, body) = t.await.unwrap();
        match (status, was_replayed) {
            (201, false) => fresh += 1,
            (201, true) => replays += 1,
            (409, false) => {
                conflicts += 1;
                assert_eq!(body["type"], problem::IN_PROGRESS);
                let secs: u64 = retry_after.unwrap().to_str().unwrap().parse().unwrap();
                assert!((1..=30).contains(&secs), "Retry-After {secs}");
            }
            other => panic!("unexpected {other:?}: {body}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one request ran the handler");
    assert_eq!(fresh + replays + conflicts, 32);
    assert!(
        conflicts > 0,
        "the handler takes 300 ms: some duplicates arrive while it runs"
    );
    assert_eq!(s.ledger.count(), 1, "exactly one charge");
    // after it finished, a retry gets the one charge back
    let after = s
        .post("/charges", "alice", Some("\"concurrent\""))
        .json(&serde_json::json!({ "amount": 700, "delay_ms": 300 }))
        .send()
        .await
        .unwrap();
    assert!(replayed(&after));
    assert_eq!(after.json::<Charge>().await.unwrap().id, 1);
    assert_eq!(s.ledger.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_concurrent_duplicates_all_get_the_response() {
    let s = Arc::new(serve(layer().wait(Duration::from_secs(5))).await);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let res = s
                .post("/charges", "alice", Some("\"waited\""))
                .json(&serde_json::json!({ "amount": 1, "delay_ms": 300 }))
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), res.json::<Charge>().await.unwrap())
        }));
    }
    for t in tasks {
        let (status, charge) = t.await.unwrap();
        assert_eq!(status, 201);
        assert_eq!(charge.id, 1);
    }
    assert_eq!(s.ledger.count(), 1);
}

#[tokio::test]
async fn another_payload_with_the_same_key_is_422() {
    let s = serve(layer()).await;
    assert_eq!(s.charge("alice", "\"k\"", 100).await.status(), 201);
    let other = s.charge("alice", "\"k\"", 999).await;
    problem_of(other, 422, problem::KEY_REUSED).await;
    // the key on another route is another request too
    let elsewhere = s
        .post("/flaky", "alice", Some("\"k\""))
        .body("{\"amount\":100}")
        .send()
        .await
        .unwrap();
    problem_of(elsewhere, 422, problem::KEY_REUSED).await;
    // and a query string is part of the request
    let query = s
        .http
        .post(format!("{}/charges?expand=all", s.base))
        .bearer_auth("alice")
        .header("Idempotency-Key", "\"k\"")
        .json(&serde_json::json!({ "amount": 100 }))
        .send()
        .await
        .unwrap();
    problem_of(query, 422, problem::KEY_REUSED).await;
    assert_eq!(s.ledger.count(), 1);
    // the original request still replays
    assert!(replayed(&s.charge("alice", "\"k\"", 100).await));
}

#[tokio::test]
async fn two_principals_with_the_same_key_are_two_charges() {
    let s = serve(layer()).await;
    let alice = s.charge("alice", "\"order-1\"", 100).await;
    let bob = s.charge("bob", "\"order-1\"", 100).await;
    assert!(!replayed(&alice) && !replayed(&bob));
    let alice: Charge = alice.json().await.unwrap();
    let bob: Charge = bob.json().await.unwrap();
    assert_eq!(alice.owner, "alice");
    assert_eq!(bob.owner, "bob");
    assert_ne!(alice.id, bob.id);
    assert_eq!(
        (s.ledger.count_of("alice"), s.ledger.count_of("bob")),
        (1, 1)
    );
    // each one's retry replays their own charge
    let again = s.charge("bob", "\"order-1\"", 100).await;
    assert!(replayed(&again));
    assert_eq!(again.json::<Charge>().await.unwrap(), bob);
    let again = s.charge("alice", "\"order-1\"", 100).await;
    assert_eq!(again.json::<Charge>().await.unwrap(), alice);
    assert_eq!(s.ledger.count(), 2);
}

#[tokio::test]
async fn a_missing_or_malformed_key_is_400() {
    let s = serve(layer()).await;
    let res = s
        .post("/charges", "alice", None)
        .json(&serde_json::json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    problem_of(res, 400, problem::KEY_MISSING).await;
    let long = format!("\"{}\"", "x".repeat(256));
    for bad in [
        "\"\"",
        "\"unterminated",
        "\"k\";param=1",
        "a b",
        long.as_str(),
    ] {
        let res = s.charge("alice", bad, 1).await;
        problem_of(res, 400, problem::KEY_MALFORMED).await;
    }
    // two fields
    let res = s
        .post("/charges", "alice", Some("\"a\""))
        .header("Idempotency-Key", "\"b\"")
        .json(&serde_json::json!({ "amount": 1 }))
        .send()
        .await
        .unwrap();
    problem_of(res, 400, problem::KEY_MALFORMED).await;
    // 255 characters is fine
    let max = format!("\"{}\"", "x".repeat(255));
    assert_eq!(s.charge("alice", &max, 1).await.status(), 201);
    assert_eq!(s.ledger.count(), 1);
    // GET is not covered: no key needed
    let get = s
        .http
        .get(format!("{}/charges", s.base))
        .bearer_auth("alice")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
}

#[tokio::test]
async fn an_optional_key_lets_requests_without_one_through() {
    let s = serve(layer().optional_key()).await;
    for _ in 0..2 {
        let res = s
            .post("/charges", "alice", None)
            .json(&serde_json::json!({ "amount": 1 }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        assert!(!replayed(&res));
    }
    assert_eq!(s.ledger.count(), 2, "unprotected: both ran");
    // a malformed key is still refused
    problem_of(
        s.charge("alice", "\"", 1).await,
        400,
        problem::KEY_MALFORMED,
    )
    .await;
}

#[tokio::test]
async fn a_5xx_releases_the_key_and_a_retry_runs_again() {
    let s = serve(layer()).await;
    let send = || {
        s.post("/flaky", "alice", Some("\"flaky-1\""))
            .body("payload")
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 500);
    assert_eq!(first.text().await.unwrap(), "the gateway timed out");
    let retry = send().await.unwrap();
    assert_eq!(
        retry.status(),
        201,
        "the key was released: the handler ran again"
    );
    assert!(!replayed(&retry));
    assert_eq!(retry.text().await.unwrap(), "done after 2 calls: payload");
    let third = send().await.unwrap();
    assert!(replayed(&third));
    assert_eq!(third.text().await.unwrap(), "done after 2 calls: payload");
    assert_eq!(s.ledger.flaky_calls.lock().unwrap()["alice"], 2);
}

#[tokio::test]
async fn a_4xx_is_stored_by_default_and_the_policy_can_release_it() {
    let s = serve(layer()).await;
    for _ in 0..3 {
        let res = s
            .post("/declined", "alice", Some("\"d\""))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 402);
        assert_eq!(res.text().await.unwrap(), "card declined (call 1)");
    }
    assert_eq!(s.ledger.declined_calls.load(Ordering::SeqCst), 1);

    let releasing = layer().store_if(|status| {
        if status.is_success() {
            OnError::Keep
        } else {
            OnError::Release
        }
    });
    let s = serve(releasing).await;
    for n in 1..=3 {
        let res = s
            .post("/declined", "alice", Some("\"d\""))
            .send()
            .await
            .unwrap();
        assert!(!replayed(&res));
        assert_eq!(
            res.text().await.unwrap(),
            format!("card declined (call {n})")
        );
    }
    assert_eq!(s.ledger.declined_calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_body_above_the_limit_is_413() {
    let s = serve(layer().body_limit(64)).await;
    let big = serde_json::json!({ "amount": 1, "pad": "x".repeat(100) });
    let res = s
        .post("/charges", "alice", Some("\"big\""))
        .json(&big)
        .send()
        .await
        .unwrap();
    problem_of(res, 413, problem::BODY_TOO_LARGE).await;
    // without a Content-Length too (a streamed body)
    let chunks: Vec<Result<String, std::io::Error>> = vec![
        Ok("{\"amount\":1,\"pad\":\"".into()),
        Ok("y".repeat(100)),
        Ok("\"}".into()),
    ];
    let res = s
        .post("/charges", "alice", Some("\"big-stream\""))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    problem_of(res, 413, problem::BODY_TOO_LARGE).await;
    assert_eq!(s.ledger.count(), 0);
    assert_eq!(s.charge("alice", "\"small\"", 1).await.status(), 201);
}

#[tokio::test]
async fn without_a_principal_the_layer_refuses_unless_anonymous_is_allowed() {
    // the layer applied outside the authentication: it sees no principal
    let app = |layer: IdempotencyLayer| {
        Router::new()
            .route("/ping", post(|| async { (StatusCode::CREATED, "pong") }))
            .layer(layer)
    };
    for (allow, status) in [(false, 500), (true, 201)] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = app(layer().allow_anonymous(allow));
        let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let res = reqwest::Client::new()
            .post(format!("http://{addr}/ping"))
            .header("Idempotency-Key", "\"p\"")
            .send()
            .await
            .unwrap();
        if allow {
            assert_eq!(res.status().as_u16(), status);
        } else {
            problem_of(res, status, problem::PRINCIPAL_MISSING).await;
        }
        task.abort();
    }
}

#[tokio::test]
async fn a_handler_keeps_a_response_out_of_storage() {
    use idem::http::axum::NoStore;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let secret = move || {
        let runs = counted.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (Extension(NoStore), format!("one-time secret {n}"))
        }
    };
    let no_store = || async { ([(header::CACHE_CONTROL, "no-store")], "private") };
    let app = Router::new()
        .route("/secret", post(secret))
        .route("/private", post(no_store))
        .layer(layer().allow_anonymous(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let send = |path: &'static str| {
        reqwest::Client::new()
            .post(format!("http://{addr}{path}"))
            .header("Idempotency-Key", "\"s\"")
            .send()
    };
    for n in 1..=2 {
        let res = send("/secret").await.unwrap();
        assert!(!replayed(&res));
        assert_eq!(res.text().await.unwrap(), format!("one-time secret {n}"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Cache-Control: no-store is stored like any response unless respect_no_store(true)
    let res = send("/private").await.unwrap();
    assert!(!replayed(&res));
    let res = send("/private").await.unwrap();
    assert!(replayed(&res));
    assert_eq!(res.headers()[header::CACHE_CONTROL], "no-store");
    task.abort();
}
