//! Requests per second through the `Idempotency-Key` layer, fresh and replayed, against the
//! same axum app without it. In process (`tower::ServiceExt::oneshot`), on the memory store, so
//! it measures the layer, not the socket.
//!
//! ```text
//! cargo bench -p idem-benches --bench http_layer
//! ```

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idem::http::axum::{IdempotencyLayer, Principal};
use std::sync::atomic::{AtomicU64, Ordering};
use tower::ServiceExt;

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
    let mut req = req
        .body(Body::from(
            r#"{"amount":1200,"currency":"eur","customer":"cus_42"}"#,
        ))
        .unwrap();
    req.extensions_mut().insert(Principal("alice".into()));
    req
}

async fn send(app: &Router, req: Request<Body>) {
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let body = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(!body.is_empty());
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plain = Router::new().route("/charges", post(charge));
    let layered = Router::new()
        .route("/charges", post(charge))
        .layer(IdempotencyLayer::new(idem::Idem::memory()));

    let mut g = c.benchmark_group("http_layer");
    g.throughput(Throughput::Elements(1));
    g.bench_function("without_layer", |b| {
        b.to_async(&rt).iter(|| send(&plain, request(None)))
    });
    let n = AtomicU64::new(0);
    g.bench_function("layer_fresh", |b| {
        b.to_async(&rt).iter(|| {
            let key = format!("\"fresh-{}\"", n.fetch_add(1, Ordering::Relaxed));
            send(&layered, request(Some(key)))
        })
    });
    rt.block_on(send(&layered, request(Some("\"replayed\"".into()))));
    g.bench_function("layer_replay", |b| {
        b.to_async(&rt)
            .iter(|| send(&layered, request(Some("\"replayed\"".into()))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
