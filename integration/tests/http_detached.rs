//! Detached handlers over a real socket: a client that closes its connection mid-handler does
//! not cut the handler, `max_in_flight` answers 503, and a shutdown waits for running handlers.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::axum::{problem, IdempotencyLayer, StillRunning};
use idem::Idem;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};

/// A guard that reports on a channel when it is dropped before it is disarmed: a future cut
/// where it was.
struct OnDrop(Option<mpsc::UnboundedSender<()>>);

impl OnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// The handler's side effect and the test's hold on it.
#[derive(Clone)]
struct Gate {
    /// One permit per handler allowed past the gate.
    release: Arc<Semaphore>,
    /// How many handlers passed the gate (the side effect).
    ran: Arc<AtomicUsize>,
    started: mpsc::UnboundedSender<()>,
    /// A handler's future dropped before it finished.
    handler_cut: mpsc::UnboundedSender<()>,
    /// The connection's future (outside the layer) dropped before it answered.
    connection_cut: mpsc::UnboundedSender<()>,
}

async fn slow(State(gate): State<Gate>) -> Response {
    let cut = OnDrop(Some(gate.handler_cut.clone()));
    let _ = gate.started.send(());
    gate.release.acquire().await.unwrap().forget();
    let n = gate.ran.fetch_add(1, Ordering::SeqCst) + 1;
    cut.disarm();
    (
        StatusCode::CREATED,
        [(header::LOCATION, format!("/payments/{n}"))],
        format!("payment {n}"),
    )
        .into_response()
}

/// Outside the idempotency layer: tells when the server dropped the request's future (the
/// client went away).
async fn watch(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let cut = OnDrop(Some(gate.connection_cut.clone()));
    let res = next.run(req).await;
    cut.disarm();
    res
}

struct Server {
    addr: std::net::SocketAddr,
    gate: Gate,
    started: mpsc::UnboundedReceiver<()>,
    handler_cut: mpsc::UnboundedReceiver<()>,
    connection_cut: mpsc::UnboundedReceiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(layer: IdempotencyLayer) -> Server {
    let (started_tx, started) = mpsc::unbounded_channel();
    let (handler_tx, handler_cut) = mpsc::unbounded_channel();
    let (conn_tx, connection_cut) = mpsc::unbounded_channel();
    let gate = Gate {
        release: Arc::new(Semaphore::new(0)),
        ran: Arc::default(),
        started: started_tx,
        handler_cut: handler_tx,
        connection_cut: conn_tx,
    };
    let app = Router::new()
        .route("/pay", post(slow))
        .layer(layer.allow_anonymous(true))
        .layer(middleware::from_fn_with_state(gate.clone(), watch))
        .with_state(gate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        addr,
        gate,
        started,
        handler_cut,
        connection_cut,
        task,
    }
}

/// A guard against a hang (not an assertion on time): what the test waits for must happen.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

impl Server {
    /// Sends a keyed POST on a raw socket, waits until its handler runs, and closes the socket.
    async fn send_and_disconnect(&mut self, key: &str) {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "POST /pay HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: \"{key}\"\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
            self.addr
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        within("the handler's start", self.started.recv()).await;
        drop(stream);
    }

    fn post(&self, key: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .post(format!("http://{}/pay", self.addr))
            .header("Idempotency-Key", format!("\"{key}\""))
            .header(header::CONTENT_TYPE, "application/json")
            .body("{}")
    }
}

fn replayed(res: &reqwest::Response) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

async fn problem_of(res: reqwest::Response, status: u16, type_: &str) -> Value {
    assert_eq!(res.status().as_u16(), status);
    let retry_after = res.headers().get(header::RETRY_AFTER).cloned();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["type"], type_, "{body}");
    if status == 503 {
        assert_eq!(retry_after.unwrap(), "1", "the layer's retry_after, 1 s");
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_handler_gets_the_stored_response_on_retry() {
    let mut s = serve(IdempotencyLayer::new(Idem::memory()).wait(Duration::from_secs(20))).await;
    s.send_and_disconnect("pay-1").await;
    // the server noticed: it dropped the request's future outside the layer
    within("the connection's drop", s.connection_cut.recv()).await;
    // the handler goes on: let it finish its side effect
    s.gate.release.add_permits(1);
    let retry = within("the retry", s.post("pay-1").send()).await.unwrap();
    assert_eq!(retry.status(), 201);
    assert!(replayed(&retry), "the retry gets the stored response");
    assert_eq!(retry.headers()[header::LOCATION], "/payments/1");
    assert_eq!(retry.text().await.unwrap(), "payment 1");
    assert_eq!(s.gate.ran.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(
        s.handler_cut.try_recv().is_err(),
        "the handler was never cut"
    );
    // and again: a replay, no second run
    let again = s.post("pay-1").send().await.unwrap();
    assert!(replayed(&again));
    assert_eq!(s.gate.ran.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_detached_a_disconnect_cuts_the_handler() {
    let mut s = serve(IdempotencyLayer::new(Idem::memory()).detached(false)).await;
    s.send_and_disconnect("pay-2").await;
    within("the handler's drop", s.handler_cut.recv()).await;
    assert_eq!(
        s.gate.ran.load(Ordering::SeqCst),
        0,
        "cut before its effect"
    );
    // its claim is held until the lease lapses: a retry meanwhile is told to come back
    let retry = s.post("pay-2").send().await.unwrap();
    problem_of(retry, 409, problem::IN_PROGRESS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_in_flight_a_request_gets_503_and_does_not_run() {
    let mut s = serve(IdempotencyLayer::new(Idem::memory()).max_in_flight(1)).await;
    let first = tokio::spawn(s.post("a").send());
    within("the first handler's start", s.started.recv()).await;
    let second = s.post("b").send().await.unwrap();
    problem_of(second, 503, problem::OVERLOADED).await;
    s.gate.release.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.text().await.unwrap(), "payment 1");
    // the place is free again; "b" was not run, and runs now
    s.gate.release.add_permits(1);
    let second = s.post("b").send().await.unwrap();
    assert_eq!(second.status(), 201);
    assert!(!replayed(&second));
    assert_eq!(s.gate.ran.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_for_running_handlers_and_refuses_new_ones() {
    let layer = IdempotencyLayer::new(Idem::memory());
    let handle = layer.shutdown_handle();
    let mut s = serve(layer).await;
    let first = tokio::spawn(s.post("a").send());
    within("the first handler's start", s.started.recv()).await;
    assert_eq!(handle.in_flight(), 1);

    let shutdown = handle.shutdown(Duration::from_secs(20));
    tokio::pin!(shutdown);
    assert!(
        futures_util::poll!(shutdown.as_mut()).is_pending(),
        "a handler runs: the shutdown waits"
    );
    let refused = s.post("b").send().await.unwrap();
    problem_of(refused, 503, problem::SHUTTING_DOWN).await;

    s.gate.release.add_permits(1);
    within("the shutdown", shutdown).await.unwrap();
    assert_eq!(handle.in_flight(), 0);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(s.gate.ran.load(Ordering::SeqCst), 1, "b never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_deadline_says_how_many_still_run() {
    let layer = IdempotencyLayer::new(Idem::memory());
    let handle = layer.shutdown_handle();
    let mut s = serve(layer).await;
    let _first = tokio::spawn(s.post("a").send());
    within("the handler's start", s.started.recv()).await;
    // the handler is held at its gate: it cannot finish before any deadline
    assert_eq!(
        handle.shutdown(Duration::from_millis(50)).await,
        Err(StillRunning(1))
    );
    s.gate.release.add_permits(1);
}

/// A deterministic pseudo-random sequence (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One attempt on a raw socket: the whole request, or part of it, then either the whole
/// response (`Some((status, replayed, body))`) or a disconnect at a random point (`None`).
async fn attempt(
    addr: std::net::SocketAddr,
    key: &str,
    rng: &mut Rng,
) -> Option<(u16, bool, String)> {
    use tokio::io::AsyncReadExt;
    let body = format!("{{\"order\":\"{key}\"}}");
    let head = format!(
        "POST /count HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"{key}\"\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    match rng.below(4) {
        // gone in the middle of the body: nothing may run
        0 => {
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(&body.as_bytes()[..3]).await.unwrap();
            None
        }
        // gone after the request, at a random point of the handler (or after it)
        1 | 2 => {
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(body.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(rng.below(12))).await;
            None
        }
        _ => {
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(body.as_bytes()).await.unwrap();
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.unwrap();
            let text = String::from_utf8_lossy(&raw).into_owned();
            let status = text.get(9..12)?.parse().ok()?;
            let (head, body) = text.split_once("\r\n\r\n")?;
            let replayed = head
                .to_ascii_lowercase()
                .contains("\r\nidempotent-replayed: true");
            Some((status, replayed, body.to_owned()))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_with_random_disconnects_no_handler_runs_twice_for_a_key() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counted = runs.clone();
    let handler = move |body: String| {
        let runs = counted.clone();
        async move {
            // a handler with a pause in the middle: disconnects land before, in and after it
            tokio::time::sleep(Duration::from_millis(5)).await;
            let n = {
                let mut runs = runs.lock().unwrap();
                let n = runs.entry(body.clone()).or_default();
                *n += 1;
                *n
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
            (StatusCode::CREATED, format!("{body} run {n}"))
        }
    };
    let app = Router::new()
        .route("/count", post(handler))
        .layer(IdempotencyLayer::new(Idem::memory()).allow_anonymous(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let clients: Vec<_> = (0..24u64)
        .map(|k| {
            tokio::spawn(async move {
                let key = format!("order-{k}");
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (k + 1).wrapping_mul(0x2545_F491));
                let mut answers = Vec::new();
                // bounded: at most 60 attempts a key, until one gets its 201
                for _ in 0..60 {
                    match attempt(addr, &key, &mut rng).await {
                        Some((201, replayed, body)) => {
                            answers.push((replayed, body));
                            break;
                        }
                        // in progress: a disconnected attempt's handler still runs
                        Some((409, ..)) | None => {
                            tokio::time::sleep(Duration::from_millis(rng.below(8))).await
                        }
                        Some(other) => panic!("{key}: unexpected {other:?}"),
                    }
                }
                (key, answers)
            })
        })
        .collect();
    for client in clients {
        let (key, answers) = within("the client's attempts", client).await.unwrap();
        let (_, body) = answers.last().unwrap_or_else(|| panic!("{key}: no 201"));
        assert_eq!(body, &format!("{{\"order\":\"{key}\"}} run 1"), "{key}");
    }
    // every handler that started (the disconnected ones included) has finished by now: a
    // retry got a 201 only once the first run's response was stored
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 24);
    for (key, n) in runs.iter() {
        assert_eq!(*n, 1, "{key} ran {n} times");
    }
    server.abort();
}
