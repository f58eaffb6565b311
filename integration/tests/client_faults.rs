//! `idem::client` over real TCP: a reqwest client with the middleware, an axum server under the
//! `Idempotency-Key` layer (memory store), and between them a proxy that loses responses and
//! cuts requests on a schedule the test sets. Each logical request must run its handler once.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::client::{Backoff, Delivery, GaveUp, IdempotencyMiddleware};
use idem::http::axum::IdempotencyLayer;
use idem::Idem;
use reqwest_middleware::ClientWithMiddleware;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MS: Duration = Duration::from_millis(1);

/// A request that reached the server: its key, and the status answered (0: none).
type Arrival = (Option<String>, u16);

/// What the server saw.
#[derive(Clone, Default)]
struct Ledger {
    /// Handler runs per key, with the body each one answered.
    runs: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    /// Every request that reached the server (outside the layer): its key and the status the
    /// layer answered (0: none, the client was gone).
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    /// Runs of /unavailable.
    unavailable: Arc<AtomicUsize>,
    /// Runs of /stream.
    streamed: Arc<AtomicUsize>,
}

impl Ledger {
    fn runs_of(&self, key: &str) -> Vec<Value> {
        self.runs
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }
    fn total_runs(&self) -> usize {
        self.runs.lock().unwrap().values().map(Vec::len).sum()
    }
    fn arrivals_of(&self, key: &str) -> Vec<u16> {
        self.arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.as_deref() == Some(key))
            .map(|(_, s)| *s)
            .collect()
    }
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
}

/// A charge: runs once per key (counted), after `delay_ms`.
async fn charge(
    State(ledger): State<Ledger>,
    headers: HeaderMap,
    Json(req): Json<Value>,
) -> Response {
    if let Some(ms) = req["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let key = key_of(&headers).unwrap_or_default();
    let body = {
        let mut runs = ledger.runs.lock().unwrap();
        let id = runs.values().map(Vec::len).sum::<usize>() + 1;
        let body = json!({ "id": id, "amount": req["amount"], "key": key });
        runs.entry(key).or_default().push(body.clone());
        body
    };
    (StatusCode::CREATED, Json(body)).into_response()
}

/// 503 for its first two runs (the layer releases the key of a 5xx), then 201.
async fn unavailable(State(ledger): State<Ledger>) -> Response {
    let n = ledger.unavailable.fetch_add(1, Ordering::SeqCst) + 1;
    if n <= 2 {
        (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
    } else {
        (StatusCode::CREATED, format!("run {n}")).into_response()
    }
}

/// Always 503.
async fn down() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "down").into_response()
}

async fn stream(State(ledger): State<Ledger>, body: String) -> Response {
    ledger.streamed.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, body).into_response()
}

/// Records each request that reaches the server, outside the layer: its key on arrival, the
/// status once answered (0 while none: the connection was gone first).
async fn record(State(ledger): State<Ledger>, req: Request, next: Next) -> Response {
    let index = {
        let mut arrivals = ledger.arrivals.lock().unwrap();
        arrivals.push((key_of(req.headers()), 0));
        arrivals.len() - 1
    };
    let res = next.run(req).await;
    ledger.arrivals.lock().unwrap()[index].1 = res.status().as_u16();
    res
}

struct Server {
    addr: SocketAddr,
    ledger: Ledger,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve() -> Server {
    let ledger = Ledger::default();
    let app = Router::new()
        .route("/charges", post(charge))
        .route("/unavailable", post(unavailable))
        .route("/down", post(down))
        .route("/stream", post(stream))
        .layer(IdempotencyLayer::new(Idem::memory()).allow_anonymous(true))
        .layer(middleware::from_fn_with_state(ledger.clone(), record))
        .with_state(ledger.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server { addr, ledger, task }
}

/// What the proxy does to one connection.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Forwards both ways.
    Pass,
    /// Forwards the request, waits for the server's first byte of response (the handler has
    /// run), then closes both sides: the response is lost.
    LoseResponse,
    /// Forwards the first 16 bytes of the request and closes both sides: the server never
    /// gets a whole request.
    CutRequest,
}

/// A TCP proxy to a server: each connection it accepts takes the next fault of its schedule
/// (`Pass` once the schedule is empty).
struct Proxy {
    base: String,
    schedule: Arc<Mutex<VecDeque<Fault>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    async fn to(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let schedule = Arc::new(Mutex::new(VecDeque::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (s, c) = (schedule.clone(), connections.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let fault = s.lock().unwrap().pop_front().unwrap_or(Fault::Pass);
                tokio::spawn(relay(client, upstream, fault));
            }
        });
        Proxy {
            base,
            schedule,
            connections,
            task,
        }
    }

    fn set(&self, faults: &[Fault]) {
        let mut s = self.schedule.lock().unwrap();
        s.clear();
        s.extend(faults);
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, fault: Fault) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    match fault {
        Fault::Pass => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        Fault::LoseResponse => {
            let (mut from_client, _) = client.split();
            let (mut from_server, mut to_server) = server.split();
            let mut first = [0u8; 1];
            tokio::select! {
                _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
                _ = from_server.read(&mut first) => {}
            }
        }
        Fault::CutRequest => {
            let mut buf = [0u8; 4096];
            if let Ok(n) = client.read(&mut buf).await {
                let _ = server.write_all(&buf[..n.min(16)]).await;
            }
        }
    }
    // both connections close here
}

/// A client through the middleware, one connection per attempt (no pooling), so that each
/// attempt meets the next fault of the schedule.
fn client(middleware: IdempotencyMiddleware) -> ClientWithMiddleware {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(http)
        .with(middleware)
        .build()
}

fn quick() -> IdempotencyMiddleware {
    IdempotencyMiddleware::new()
        .backoff(Backoff::new(10 * MS, 50 * MS).max_retry_after(Duration::from_secs(3)))
        .max_attempts(6)
        .max_elapsed(Duration::from_secs(20))
}

/// POSTs `body` as JSON to /charges through `proxy`, with the caller's `key` if given.
async fn send_charge(
    client: &ClientWithMiddleware,
    proxy: &Proxy,
    key: Option<&str>,
    body: Value,
) -> reqwest_middleware::Result<reqwest::Response> {
    let req = client.post(proxy.url("/charges")).json(&body);
    match key {
        Some(key) => req.header("Idempotency-Key", key),
        None => req,
    }
    .send()
    .await
}

/// POSTs `body` to `path` through `proxy`.
async fn send(
    client: &ClientWithMiddleware,
    proxy: &Proxy,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest_middleware::Result<reqwest::Response> {
    client.post(proxy.url(path)).body(body).send().await
}

fn delivery(res: &reqwest::Response) -> Delivery {
    res.extensions().get::<Delivery>().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_responses_and_cut_requests_run_each_request_once() {
    use Fault::{CutRequest as Cut, LoseResponse as Lose};
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    let client = client(quick());
    let schedules: [&[Fault]; 7] = [
        &[],
        &[Lose],
        &[Cut],
        &[Cut, Lose],
        &[Lose, Lose],
        &[Cut, Cut, Lose],
        &[Lose, Cut, Lose, Cut],
    ];
    let mut keys = Vec::new();
    for round in 0..2 {
        for (i, faults) in schedules.iter().enumerate() {
            proxy.set(faults);
            let before = proxy.connections.load(Ordering::SeqCst);
            let amount = 100 * round + i as u64;
            let res = send_charge(&client, &proxy, None, json!({ "amount": amount }))
                .await
                .unwrap_or_else(|e| panic!("{faults:?}: {e:?}"));
            let d = delivery(&res);
            assert_eq!(res.status(), 201, "{faults:?}");
            assert_eq!(d.attempts() as usize, faults.len() + 1, "{faults:?}");
            assert_eq!(
                proxy.connections.load(Ordering::SeqCst) - before,
                faults.len() + 1
            );
            // once a response is lost, the answer is the stored one
            assert_eq!(d.replayed(), faults.contains(&Lose), "{faults:?}");
            let key = d.key().expect("a POST gets a key").to_owned();
            let body: Value = res.json().await.unwrap();

            // the handler ran once, and the client got what it answered
            let runs = server.ledger.runs_of(&key);
            assert_eq!(runs.len(), 1, "{faults:?}: {runs:?}");
            assert_eq!(body, runs[0]);
            assert_eq!(body["amount"], amount);
            // every attempt that reached the server carried the same key: the cut ones did
            // not reach it
            let cuts = faults.iter().filter(|f| **f == Cut).count();
            assert_eq!(
                server.ledger.arrivals_of(&key).len(),
                faults.len() + 1 - cuts,
                "{faults:?}"
            );
            keys.push(key);
        }
    }
    let distinct: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "one key per logical request");
    assert_eq!(server.ledger.total_runs(), keys.len());
    // nothing reached the server without a key
    assert!(server
        .ledger
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .all(|(k, _)| k.is_some()));
}

#[tokio::test]
async fn a_callers_key_is_kept_across_retries_and_a_422_is_not_retried() {
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    let client = client(quick());
    proxy.set(&[Fault::LoseResponse, Fault::CutRequest]);
    let first = send_charge(&client, &proxy, Some("order-17"), json!({ "amount": 1 }))
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    let d = delivery(&first);
    assert_eq!(d.key(), Some("order-17"), "the caller's key is kept");
    assert_eq!((d.attempts(), d.replayed()), (3, true));
    // the lost attempt and the replayed one, both under the caller's key
    assert_eq!(server.ledger.arrivals_of("order-17"), [201, 201]);

    // the same key with another body
    let before = proxy.connections.load(Ordering::SeqCst);
    let reused = send_charge(&client, &proxy, Some("order-17"), json!({ "amount": 2 }))
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    let d = delivery(&reused);
    assert_eq!(d.attempts(), 1);
    assert!(!d.replayed());
    assert_eq!(proxy.connections.load(Ordering::SeqCst) - before, 1);
    assert_eq!(server.ledger.runs_of("order-17").len(), 1);
    assert_eq!(server.ledger.arrivals_of("order-17"), [201, 201, 422]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_timeout_is_waited_for_not_repeated() {
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    // two failed attempts at most: polling the request in flight is not one
    let client = client(quick().attempt_timeout(300 * MS).max_attempts(2));
    let started = std::time::Instant::now();
    let res = send_charge(
        &client,
        &proxy,
        None,
        json!({ "amount": 9, "delay_ms": 2200 }),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 201);
    let d = delivery(&res);
    let key = d.key().unwrap().to_owned();
    assert!(d.replayed());
    // a timeout, a 409 a second for the two seconds the handler still ran, then the replay
    assert!(d.attempts() >= 4, "{d:?}");
    let body: Value = res.json().await.unwrap();
    let runs = server.ledger.runs_of(&key);
    assert_eq!(runs, [body]);
    let arrivals = server.ledger.arrivals_of(&key);
    assert_eq!(arrivals.len(), d.attempts() as usize, "{arrivals:?}");
    // the first attempt's answer (201) or none if its connection's close ended it first
    // (the layer runs the handler detached either way)
    assert!([0, 201].contains(&arrivals[0]), "{arrivals:?}");
    assert!(
        arrivals[1..arrivals.len() - 1].iter().all(|s| *s == 409),
        "{arrivals:?}"
    );
    assert!(
        arrivals.len() >= 3 && arrivals[arrivals.len() - 1] == 201,
        "{arrivals:?}"
    );
    // the 409's Retry-After (1 s) was waited for, not hammered
    assert!(started.elapsed() >= 2200 * MS);
    assert!(arrivals.len() <= 5, "{arrivals:?}");
}

#[tokio::test]
async fn a_5xx_is_retried_with_backoff_and_the_budget_ends_retries() {
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    let client = client(quick());
    let res = send(&client, &proxy, "/unavailable", "x").await.unwrap();
    assert_eq!(res.status(), 201);
    let d = delivery(&res);
    assert_eq!(d.attempts(), 3);
    assert!(!d.replayed());
    assert_eq!(server.ledger.unavailable.load(Ordering::SeqCst), 3);
    assert_eq!(server.ledger.arrivals_of(d.key().unwrap()), [503, 503, 201]);

    // always down: the last 503 after max_attempts
    let client = self::client(quick().max_attempts(4));
    let res = send(&client, &proxy, "/down", "x").await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(delivery(&res).attempts(), 4);

    // a time budget smaller than the first wait: one attempt
    let client = self::client(
        IdempotencyMiddleware::new()
            .backoff(Backoff::new(Duration::from_secs(5), Duration::from_secs(5)))
            .max_elapsed(Duration::from_secs(1)),
    );
    let res = send(&client, &proxy, "/down", "x").await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(delivery(&res).attempts(), 1);
}

#[tokio::test]
async fn a_request_that_never_gets_through_gives_up_with_its_attempts() {
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    proxy.set(&[Fault::CutRequest; 8]);
    let client = client(quick().max_attempts(3));
    let err = send_charge(&client, &proxy, None, json!({ "amount": 3 }))
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = &err else {
        panic!("{err:?}");
    };
    let gave_up = e.downcast_ref::<GaveUp>().unwrap();
    assert_eq!(gave_up.attempts(), 3);
    assert!(gave_up.key().is_some());
    assert!(e.downcast_ref::<reqwest::Error>().is_some(), "{e:?}");
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 3);
    assert_eq!(server.ledger.total_runs(), 0);
}

#[tokio::test]
async fn a_streamed_body_is_sent_once() {
    let server = serve().await;
    let proxy = Proxy::to(server.addr).await;
    let client = client(quick());
    let stream = || {
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("one,"), Ok("two")];
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    };

    // it goes through, with a key and one attempt
    let res = send(&client, &proxy, "/stream", stream()).await.unwrap();
    assert_eq!(res.status(), 201);
    let d = delivery(&res);
    assert_eq!(d.attempts(), 1);
    assert!(d.key().is_some());
    assert_eq!(res.text().await.unwrap(), "one,two");

    // a cut is not retried: the error is reqwest's own
    proxy.set(&[Fault::CutRequest]);
    let before = proxy.connections.load(Ordering::SeqCst);
    let err = send(&client, &proxy, "/stream", stream())
        .await
        .unwrap_err();
    assert!(
        matches!(err, reqwest_middleware::Error::Reqwest(_)),
        "{err:?}"
    );
    assert_eq!(proxy.connections.load(Ordering::SeqCst) - before, 1);
    assert_eq!(server.ledger.streamed.load(Ordering::SeqCst), 1);
}
