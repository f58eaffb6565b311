//! The `Idempotency-Key` layer on a real tonic gRPC server (a TCP socket on 127.0.0.1), with a
//! real tonic client: replays marked in metadata, refusals as gRPC status codes, and a call
//! cancelled by its client that still finishes once.

#[path = "../examples/grpc/payments.rs"]
mod payments;

use idem::http::grpc::{GRPC_RETRY_PUSHBACK_MS, IDEMPOTENCY_PROBLEM};
use idem::http::{problem, IdempotencyLayer};
use idem::Idem;
use payments::{ChargeRequest, Ledger, PaymentsClient, PaymentsServer};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Status};

struct Server {
    client: PaymentsClient,
    ledger: Ledger,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(layer: IdempotencyLayer) -> Server {
    let server = PaymentsServer::default();
    let ledger = server.ledger.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer.allow_anonymous(true))
            .add_service(server)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Server {
        client: PaymentsClient::new(channel),
        ledger,
        task,
    }
}

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::grpc(Idem::memory())
}

fn charge(order: &str, amount: u64) -> ChargeRequest {
    ChargeRequest {
        order: order.into(),
        amount,
        hold: false,
    }
}

fn replayed(md: &tonic::metadata::MetadataMap) -> bool {
    md.get("idempotent-replayed").is_some_and(|v| v == "true")
}

fn problem_type(status: &Status) -> &str {
    status
        .metadata()
        .get(IDEMPOTENCY_PROBLEM.as_str())
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A guard against a hang (not an assertion on time).
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_is_replayed_and_marked_in_metadata() {
    let mut s = serve(layer()).await;
    let first = s
        .client
        .charge(Some("\"o-1\""), charge("o-1", 1200))
        .await
        .unwrap();
    assert!(!replayed(first.metadata()));
    let first = first.into_inner();
    let again = s
        .client
        .charge(Some("o-1"), charge("o-1", 1200))
        .await
        .unwrap();
    assert!(replayed(again.metadata()), "the bare key is the same key");
    assert_eq!(again.into_inner(), first);
    assert_eq!(s.ledger.charges.load(Ordering::SeqCst), 1);
    assert_eq!(s.ledger.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_grpc_status_codes() {
    let mut s = serve(layer()).await;
    let missing = s.client.charge(None, charge("o", 1)).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument, "{missing:?}");
    assert_eq!(problem_type(&missing), problem::KEY_MISSING);
    let malformed = s
        .client
        .charge(Some("a b"), charge("o", 1))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(problem_type(&malformed), problem::KEY_MALFORMED);

    s.client.charge(Some("k"), charge("o", 5)).await.unwrap();
    let reused = s
        .client
        .charge(Some("k"), charge("o", 6))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(problem_type(&reused), problem::KEY_REUSED);
    assert_eq!(
        s.ledger.calls.load(Ordering::SeqCst),
        1,
        "only the first ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_progress_is_aborted_with_pushback() {
    let mut s = serve(layer()).await;
    let mut first_client = s.client.clone();
    let held = ChargeRequest {
        hold: true,
        ..charge("o-2", 10)
    };
    let first = tokio::spawn(async move { first_client.charge(Some("o-2"), held).await });
    within("the first call's start", async {
        while s.ledger.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let dup = ChargeRequest {
        hold: true,
        ..charge("o-2", 10)
    };
    let busy = s.client.charge(Some("o-2"), dup).await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert_eq!(problem_type(&busy), problem::IN_PROGRESS);
    let secs: u64 = busy
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&secs), "retry-after {secs}");
    let pushback = busy
        .metadata()
        .get(GRPC_RETRY_PUSHBACK_MS.as_str())
        .unwrap();
    assert_eq!(pushback.to_str().unwrap(), (secs * 1000).to_string());
    s.ledger.gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.into_inner().id, 1);
    assert_eq!(s.ledger.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_that_says_try_again_releases_the_key_and_a_decided_one_is_stored() {
    let mut s = serve(layer()).await;
    let down = s
        .client
        .charge(Some("o-13"), charge("o-13", 13))
        .await
        .unwrap_err();
    assert_eq!(down.code(), Code::Unavailable);
    assert!(!replayed(down.metadata()));
    let retry = s
        .client
        .charge(Some("o-13"), charge("o-13", 13))
        .await
        .unwrap();
    assert!(
        !replayed(retry.metadata()),
        "released: the method ran again"
    );
    assert_eq!(retry.into_inner().amount, 13);

    let invalid = s
        .client
        .charge(Some("o-0"), charge("o-0", 0))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    let again = s
        .client
        .charge(Some("o-0"), charge("o-0", 0))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::InvalidArgument);
    assert_eq!(again.message(), "amount must be positive");
    assert!(
        replayed(again.metadata()),
        "the status (a trailer) is replayed"
    );
    assert_eq!(s.ledger.calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_client_cancels_finishes_once_and_its_retry_is_replayed() {
    let mut s = serve(layer().wait(Duration::from_secs(20))).await;
    let mut first_client = s.client.clone();
    let held = ChargeRequest {
        hold: true,
        ..charge("o-3", 30)
    };
    let first = tokio::spawn(async move { first_client.charge(Some("o-3"), held).await });
    within("the first call's start", async {
        while s.ledger.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // the client gives up (its future dropped: tonic resets the HTTP/2 stream)
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    s.ledger.gate.add_permits(1);
    let retry = ChargeRequest {
        hold: true,
        ..charge("o-3", 30)
    };
    let retry = within("the retry", s.client.charge(Some("o-3"), retry))
        .await
        .unwrap();
    assert!(replayed(retry.metadata()));
    assert_eq!(retry.into_inner().id, 1);
    assert_eq!(
        s.ledger.calls.load(Ordering::SeqCst),
        1,
        "the method ran once"
    );
    assert_eq!(s.ledger.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_abandoned_mid_method_parks_its_key_with_failed_precondition() {
    // Not detached: the client's cancel cuts the method; its claim lapses after the lease.
    let layer = layer()
        .detached(false)
        .lease(Duration::from_millis(300))
        .on_abandoned(idem::OnAbandoned::Park);
    let mut s = serve(layer).await;
    let mut first_client = s.client.clone();
    let held = ChargeRequest {
        hold: true,
        ..charge("o-4", 40)
    };
    let first = tokio::spawn(async move { first_client.charge(Some("o-4"), held).await });
    within("the first call's start", async {
        while s.ledger.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..2 {
        // The same request (a parked key's method would wait at the gate: it must not run).
        let again = ChargeRequest {
            hold: true,
            ..charge("o-4", 40)
        };
        let parked = within("the retry", s.client.charge(Some("o-4"), again))
            .await
            .unwrap_err();
        assert_eq!(parked.code(), Code::FailedPrecondition, "{parked:?}");
        assert_eq!(problem_type(&parked), problem::OUTCOME_UNKNOWN);
    }
    assert_eq!(s.ledger.calls.load(Ordering::SeqCst), 1, "no method rerun");
    assert_eq!(s.ledger.charges.load(Ordering::SeqCst), 0);
}
