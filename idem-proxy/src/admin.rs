//! The admin listener: `/metrics` (Prometheus text) and `/healthz`.

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use idem::http::Buffered;
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;

/// Whether the proxy is serving (`/healthz` says 503 once a shutdown begins).
pub type Healthy = Arc<AtomicBool>;

fn respond(
    req: &Request<hyper::body::Incoming>,
    metrics: &PrometheusHandle,
    healthy: &Healthy,
) -> Response<Buffered> {
    let (status, ctype, body) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        "/healthz" if healthy.load(Ordering::Acquire) => {
            (StatusCode::OK, "text/plain", "ok\n".to_owned())
        }
        "/healthz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "shutting down\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut res = Response::new(Buffered::from(body.into_bytes()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    res
}

/// Serves the admin endpoints on `listener` (until the process ends).
pub async fn serve(listener: TcpListener, metrics: PrometheusHandle, healthy: Healthy) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let metrics = metrics.clone();
        let healthy = healthy.clone();
        let service = hyper::service::service_fn(move |req| {
            let res = respond(&req, &metrics, &healthy);
            async move { Ok::<_, Infallible>(res) }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
