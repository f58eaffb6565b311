//! Abandoned requests over a real socket: a handler cut mid-request (not detached, its client
//! gone) leaves its key abandoned once the lease lapses, and the retry does what the layer was
//! told: rerun the handler (which reads `idem::recovery()`), park the key (423
//! `outcome-unknown` until an operator resolves it), or ask the reconcile hook.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::axum::{problem, AbandonedRequest, IdempotencyLayer};
use idem::{Idem, OnAbandoned, Resolution};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};

/// The lease of the layer's claims, and a wait that outlasts it on a loaded machine.
const LEASE: Duration = Duration::from_millis(300);
const LAPSE: Duration = Duration::from_millis(1200);

/// A guard that reports when it is dropped: the handler's future cut where it was.
struct OnDrop(Option<mpsc::UnboundedSender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// The charges made, by the idempotency key the handler passed down.
type Gateway = Arc<Mutex<HashMap<String, usize>>>;

/// The handler's side effects (the "gateway"), and the test's hold on it.
#[derive(Clone)]
struct App {
    gateway: Gateway,
    /// How many times the handler ran.
    ran: Arc<AtomicUsize>,
    /// Never released: the first run for a key of a `hang` request waits here until it is cut.
    gate: Arc<Semaphore>,
    /// The keys whose first run hung.
    hung: Arc<Mutex<std::collections::HashSet<String>>>,
    started: mpsc::UnboundedSender<()>,
    cut: mpsc::UnboundedSender<()>,
    /// What `idem::recovery()` said in each run (the attempt, 1 on a first one).
    attempts: Arc<Mutex<Vec<u32>>>,
}

/// Charges (a body starting with `charge`), then, the first time it runs for a key of a body
/// that says `hang`, waits until its connection is cut.
async fn pay(State(app): State<App>, headers: HeaderMap, body: String) -> Response {
    let attempt = idem::recovery().map_or(1, |r| r.attempt());
    app.attempts.lock().unwrap().push(attempt);
    let key = idem::http::parse_key(&headers).unwrap().unwrap();
    let n = app.ran.fetch_add(1, Ordering::SeqCst) + 1;
    if body.starts_with("charge") {
        app.gateway.lock().unwrap().insert(key.clone(), n);
    }
    if body.contains("hang") && app.hung.lock().unwrap().insert(key) {
        let guard = OnDrop(Some(app.cut.clone()));
        let _ = app.started.send(());
        app.gate.acquire().await.unwrap().forget();
        drop(guard);
    }
    (
        StatusCode::CREATED,
        [("x-attempt", attempt.to_string())],
        format!("payment {n}"),
    )
        .into_response()
}

struct Server {
    addr: std::net::SocketAddr,
    app: App,
    started: mpsc::UnboundedReceiver<()>,
    cut: mpsc::UnboundedReceiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The layer under test: not detached (a client that goes away cuts the handler), a short
/// lease, anonymous requests in one scope.
fn layer(idem: Idem) -> IdempotencyLayer {
    IdempotencyLayer::new(idem)
        .detached(false)
        .lease(LEASE)
        .allow_anonymous(true)
}

async fn serve(layer: IdempotencyLayer, gateway: Gateway) -> Server {
    let (started_tx, started) = mpsc::unbounded_channel();
    let (cut_tx, cut) = mpsc::unbounded_channel();
    let app = App {
        gateway,
        ran: Arc::default(),
        gate: Arc::new(Semaphore::new(0)),
        hung: Arc::default(),
        started: started_tx,
        cut: cut_tx,
        attempts: Arc::default(),
    };
    let router = Router::new()
        .route("/pay", post(pay))
        .layer(layer)
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Server {
        addr,
        app,
        started,
        cut,
        task,
    }
}

/// A guard against a hang (not an assertion on time).
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

impl Server {
    /// A first attempt that dies: a keyed POST on a raw socket, closed once its handler runs;
    /// then the handler's drop, and a wait until its lease has lapsed: the key is abandoned.
    async fn abandon(&mut self, key: &str, body: &str) {
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "POST /pay HTTP/1.1\r\nHost: {}\r\nIdempotency-Key: \"{key}\"\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        stream.write_all(req.as_bytes()).await.unwrap();
        within("the handler's start", self.started.recv()).await;
        drop(stream);
        within("the handler's cut", self.cut.recv()).await;
        tokio::time::sleep(LAPSE).await;
    }

    async fn post(&self, key: &str, body: &str) -> reqwest::Response {
        let req = reqwest::Client::new()
            .post(format!("http://{}/pay", self.addr))
            .header("Idempotency-Key", format!("\"{key}\""))
            .body(body.to_string())
            .send();
        within("the response", req).await.unwrap()
    }

    fn ran(&self) -> usize {
        self.app.ran.load(Ordering::SeqCst)
    }
}

fn replayed(res: &reqwest::Response) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

async fn problem_of(res: reqwest::Response, status: u16, type_: &str) -> Value {
    assert_eq!(res.status().as_u16(), status);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["type"], type_, "{body}");
    assert_eq!(body["status"], status);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_retry_reruns_the_handler_which_reads_its_recovery() {
    let mut s = serve(layer(Idem::memory()), Gateway::default()).await;
    s.abandon("pay-1", "charge, hang").await;
    assert_eq!(s.ran(), 1);
    let retry = s.post("pay-1", "charge, hang").await;
    assert_eq!(retry.status(), 201);
    assert!(!replayed(&retry));
    assert_eq!(
        retry.headers()["x-attempt"],
        "2",
        "idem::recovery() in the handler"
    );
    assert_eq!(retry.text().await.unwrap(), "payment 2");
    assert_eq!(s.ran(), 2, "rerun: the effect may be doubled");
    assert_eq!(*s.app.attempts.lock().unwrap(), vec![1, 2]);
    // A first attempt has no recovery.
    let fresh = s.post("pay-2", "charge").await;
    assert_eq!(fresh.headers()["x-attempt"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_the_retry_gets_outcome_unknown_until_an_operator_resolves() {
    let idem = Idem::memory();
    let mut s = serve(
        layer(idem.clone()).on_abandoned(OnAbandoned::Park),
        Gateway::default(),
    )
    .await;
    for (key, applied) in [("pay-3", true), ("pay-4", false)] {
        s.abandon(key, "charge, hang").await;
        let ran = s.ran();
        for _ in 0..2 {
            let res = s.post(key, "charge, hang").await;
            assert!(
                res.headers().get(header::RETRY_AFTER).is_none(),
                "no retry invited"
            );
            let doc = problem_of(res, 423, problem::OUTCOME_UNKNOWN).await;
            assert!(
                doc["detail"].as_str().unwrap().contains("operator"),
                "{doc}"
            );
        }
        assert_eq!(s.ran(), ran, "a parked key runs no handler");
        // The operator's verdict (an unscoped key: anonymous requests).
        let call = idem.call("http").key(key);
        if applied {
            // The response as the layer stores it: status, fields, body.
            let stored = json!({"status": 201, "headers": [["x-found", "gateway"]],
                "body": "payment found at the gateway"});
            call.resolve(Resolution::Applied(stored)).await.unwrap();
            let res = s.post(key, "charge, hang").await;
            assert_eq!(res.status(), 201);
            assert!(replayed(&res));
            assert_eq!(res.headers()["x-found"], "gateway");
            assert_eq!(res.text().await.unwrap(), "payment found at the gateway");
            assert_eq!(s.ran(), ran);
        } else {
            call.resolve(Resolution::<()>::NotApplied).await.unwrap();
            let res = s.post(key, "charge, hang").await;
            assert_eq!(res.status(), 201);
            assert!(!replayed(&res));
            assert_eq!(res.headers()["x-attempt"], "1", "a fresh attempt");
            assert_eq!(s.ran(), ran + 1);
        }
    }
}

/// The hook the reconcile test installs: the gateway's charge made under the request's key
/// (`idem::current_key()` and `idem::recovery()` answer inside it); a key `flaky` fails the
/// first time it is asked.
fn reconcile_layer(idem: Idem, gateway: Gateway) -> IdempotencyLayer {
    let asked = Arc::new(AtomicUsize::new(0));
    layer(idem).reconcile(move |req: AbandonedRequest| {
        let gateway = gateway.clone();
        let asked = asked.clone();
        async move {
            assert!(idem::current_key().is_some(), "inside the call");
            // 2 for the first takeover; 3 after an undecided one.
            assert_eq!(idem::recovery(), Some(req.recovery));
            assert!(req.recovery.attempt() >= 2);
            assert_eq!((req.method.as_str(), req.uri.path()), ("POST", "/pay"));
            if req.key == "flaky" && asked.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err("the gateway is down".into());
            }
            let found = gateway.lock().unwrap().get(&req.key).copied();
            Ok(found.map(|n| {
                http::Response::builder()
                    .status(201)
                    .header("x-reconciled", "true")
                    .body(bytes::Bytes::from(format!("payment {n} (found)")))
                    .unwrap()
            }))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_hook_adopts_the_effect_it_finds_and_runs_the_handler_otherwise() {
    let gateway = Arc::new(Mutex::new(HashMap::new()));
    let mut s = serve(reconcile_layer(Idem::memory(), gateway.clone()), gateway).await;

    // The effect happened before the cut: the hook's response, stored; the handler not rerun.
    s.abandon("pay-5", "charge, hang").await;
    assert_eq!(s.ran(), 1);
    let res = s.post("pay-5", "charge, hang").await;
    assert_eq!(res.status(), 201);
    assert!(!replayed(&res));
    assert_eq!(res.headers()["x-reconciled"], "true");
    assert_eq!(res.text().await.unwrap(), "payment 1 (found)");
    assert_eq!(s.ran(), 1, "the handler did not run again");
    let again = s.post("pay-5", "charge, hang").await;
    assert!(replayed(&again));
    assert_eq!(again.text().await.unwrap(), "payment 1 (found)");

    // It did not happen (cut before the charge): the handler runs, and knows it took over.
    s.abandon("pay-6", "hang").await;
    let res = s.post("pay-6", "hang").await;
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["x-attempt"], "2");
    assert_eq!(s.ran(), 3);

    // Undecided: 503 outcome-undecided, the key stays abandoned; the next retry asks again.
    s.abandon("flaky", "charge, hang").await;
    let ran = s.ran();
    let res = s.post("flaky", "charge, hang").await;
    assert!(res.headers().get(header::RETRY_AFTER).is_some());
    problem_of(res, 503, problem::OUTCOME_UNDECIDED).await;
    let res = s.post("flaky", "charge, hang").await;
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["x-reconciled"], "true");
    assert_eq!(s.ran(), ran, "never rerun");
}
