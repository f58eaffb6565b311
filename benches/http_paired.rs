//! The `Idempotency-Key` layer against the bare service, as paired ratios (variants measured
//! in alternation, support/paired.rs): an axum app over the memory store and over PostgreSQL
//! (`IDEM_TEST_POSTGRES_URL`; skipped without it), fresh keys and replays, detached and not;
//! and the gRPC layer over a tonic service (unary, hand-written without protoc). In process
//! (`tower::ServiceExt::oneshot`), so it measures the layer, not sockets.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1/test cargo bench -p idem-benches --bench http_paired
//! ```

#[path = "support/drive.rs"]
mod drive;
#[path = "support/notes.rs"]
mod notes;
#[path = "support/paired.rs"]
mod paired;
#[path = "support/postgres.rs"]
mod pg;
// The service of the gRPC test and example: one unary method, prost messages by hand.
#[allow(dead_code)]
#[path = "../integration/examples/grpc/payments.rs"]
mod payments;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use idem::http::IdempotencyLayer;
use idem::Idem;
use prost::Message as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tower::{Layer as _, ServiceExt as _};

async fn charge(Json(body): Json<serde_json::Value>) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::LOCATION, "/charges/ch_1")],
        Json(serde_json::json!({ "id": "ch_1", "amount": body["amount"], "currency": "eur" })),
    )
}

fn request(key: Option<String>) -> Request<Body> {
    let mut req = Request::post("/charges").header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(
        r#"{"amount":1200,"currency":"eur","customer":"cus_42"}"#,
    ))
    .unwrap()
}

async fn send(app: &Router, req: Request<Body>) {
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(!body.is_empty());
}

/// An op sending to `app`: with a fresh key each call, the key `"replayed"`, or none.
fn http_op(app: Router, key: Key) -> paired::Op {
    let n = Arc::new(AtomicU64::new(0));
    Arc::new(move |_| {
        let app = app.clone();
        let key = match key {
            Key::Fresh => Some(format!("\"f-{}\"", n.fetch_add(1, Ordering::Relaxed))),
            Key::Replayed => Some("\"replayed\"".to_owned()),
            Key::None => None,
        };
        Box::pin(async move { send(&app, request(key)).await })
    })
}

#[derive(Clone, Copy)]
enum Key {
    Fresh,
    Replayed,
    None,
}

/// A unary gRPC request of `Charge`: the 5-byte frame header, then the message.
fn grpc_request(key: Option<String>) -> Request<Full<Bytes>> {
    let msg = payments::ChargeRequest {
        order: "order-1001".into(),
        amount: 1200,
        hold: false,
    }
    .encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + msg.len());
    frame.put_u8(0);
    frame.put_u32(msg.len() as u32);
    frame.put_slice(&msg);
    let mut req = Request::post(payments::CHARGE)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Full::new(frame.freeze())).unwrap()
}

fn grpc_op<S, B>(svc: S, key: Key) -> paired::Op
where
    S: tower::Service<Request<Full<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug + Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug + Send,
{
    let n = Arc::new(AtomicU64::new(0));
    Arc::new(move |_| {
        let svc = svc.clone();
        let key = match key {
            Key::Fresh => Some(format!("\"f-{}\"", n.fetch_add(1, Ordering::Relaxed))),
            Key::Replayed => Some("\"replayed\"".to_owned()),
            Key::None => None,
        };
        Box::pin(async move {
            let res = svc.oneshot(grpc_request(key)).await.unwrap();
            let collected = res.into_body().collect().await.unwrap();
            let status = collected
                .trailers()
                .and_then(|t| t.get("grpc-status").cloned());
            assert_eq!(status.unwrap(), "0");
        })
    })
}

fn app(idem: Option<Idem>, detached: bool) -> Router {
    let router = Router::new().route("/charges", post(charge));
    match idem {
        Some(idem) => router.layer(
            IdempotencyLayer::new(idem)
                .allow_anonymous(true)
                .detached(detached),
        ),
        None => router,
    }
}

fn main() {
    let rt = drive::runtime();
    let bare = || http_op(app(None, true), Key::None);
    let mut rows: Vec<(&str, u64, paired::Paired)> = Vec::new();
    let mut stores: Vec<(&str, Idem)> = vec![("memory", Idem::memory())];
    if let Some(url) = pg::bench_url("http_paired") {
        let idem = rt.block_on(Idem::postgres(&url)).unwrap();
        stores.push(("PostgreSQL", idem));
    }
    let labels: &[(&str, &str, &str)] = &[
        ("memory", "memory, fresh key", "memory, replay"),
        ("PostgreSQL", "PostgreSQL, fresh key", "PostgreSQL, replay"),
    ];
    for (store, idem) in &stores {
        let (_, fresh, replay) = labels.iter().find(|l| l.0 == *store).unwrap();
        let layered = app(Some(idem.clone()), true);
        rt.block_on(send(&layered, request(Some("\"replayed\"".into()))));
        for conc in [1, 16] {
            rows.push((
                fresh,
                conc,
                paired::paired(
                    &rt,
                    conc,
                    &[
                        ("layer", http_op(layered.clone(), Key::Fresh)),
                        ("bare", bare()),
                    ],
                ),
            ));
            rows.push((
                replay,
                conc,
                paired::paired(
                    &rt,
                    conc,
                    &[
                        ("layer", http_op(layered.clone(), Key::Replayed)),
                        ("bare", bare()),
                    ],
                ),
            ));
        }
    }
    // What detaching costs: the same layer, detached and not.
    let detached = app(Some(Idem::memory()), true);
    let attached = app(Some(Idem::memory()), false);
    for conc in [1, 16] {
        rows.push((
            "memory, fresh key: detached / not detached",
            conc,
            paired::paired(
                &rt,
                conc,
                &[
                    ("layer", http_op(detached.clone(), Key::Fresh)),
                    ("bare", http_op(attached.clone(), Key::Fresh)),
                ],
            ),
        ));
    }
    // gRPC: the layer over a tonic service against the service alone.
    let service = payments::PaymentsServer::default();
    let layered = IdempotencyLayer::grpc(Idem::memory())
        .allow_anonymous(true)
        .layer(service.clone());
    rt.block_on(grpc_op(layered.clone(), Key::Replayed)(0));
    for conc in [1, 16] {
        for (label, key) in [
            ("gRPC (tonic), memory, fresh key", Key::Fresh),
            ("gRPC (tonic), memory, replay", Key::Replayed),
        ] {
            rows.push((
                label,
                conc,
                paired::paired(
                    &rt,
                    conc,
                    &[
                        ("layer", grpc_op(layered.clone(), key)),
                        ("bare", grpc_op(service.clone(), Key::None)),
                    ],
                ),
            ));
        }
    }
    notes::write_note(
        "http_paired.md",
        &paired::table("the HTTP and gRPC layer against the bare service", &rows),
    );
}
