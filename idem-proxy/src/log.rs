//! One structured line per request (route, outcome, status, latency, key digest: never the key
//! or a credential), and the same as metrics.

use http::{Method, StatusCode};
use std::time::Instant;

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not under a key: streamed to the upstream and back.
    Passthrough,
    /// Under a key, run upstream for the first time.
    Fresh,
    /// Under a key, the stored response replayed.
    Replayed,
    /// Refused by the layer (no key, 409 in flight, 422 other request, 413, 503…).
    Refused,
    /// No principal, or an invalid token.
    Unauthorized,
    /// The upstream could not be reached or did not answer in time.
    UpstreamFailed,
    /// The client went away before its response (a keyed request still runs to its end).
    ClientGone,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Passthrough => "passthrough",
            Outcome::Fresh => "fresh",
            Outcome::Replayed => "replayed",
            Outcome::Refused => "refused",
            Outcome::Unauthorized => "unauthorized",
            Outcome::UpstreamFailed => "upstream_failed",
            Outcome::ClientGone => "client_gone",
        }
    }
}

/// A request being handled: logged when it ends, or when it is dropped (its client left).
pub struct RequestLog {
    route: String,
    method: Method,
    path: String,
    key: Option<String>,
    start: Instant,
    done: bool,
}

impl RequestLog {
    /// A request on `route`, under the key of digest `key`.
    pub fn start(route: &str, method: &Method, path: &str, key: Option<String>) -> RequestLog {
        RequestLog {
            route: route.to_owned(),
            method: method.clone(),
            path: path.to_owned(),
            key,
            start: Instant::now(),
            done: false,
        }
    }

    /// The request ended with `status`.
    pub fn finish(&mut self, outcome: Outcome, status: StatusCode) {
        self.done = true;
        self.emit(outcome, status.as_u16());
    }

    fn emit(&self, outcome: Outcome, status: u16) {
        let latency = self.start.elapsed();
        tracing::info!(
            target: "idem_proxy::request",
            route = %self.route,
            method = %self.method,
            path = %self.path,
            outcome = outcome.as_str(),
            status,
            latency_us = latency.as_micros() as u64,
            key_digest = self.key.as_deref().unwrap_or(""),
            "request"
        );
        let labels = [
            ("route", self.route.clone()),
            ("outcome", outcome.as_str().to_owned()),
            ("status", status.to_string()),
        ];
        metrics::counter!("idem_proxy_requests_total", &labels).increment(1);
        metrics::histogram!(
            "idem_proxy_request_duration_seconds",
            "route" => self.route.clone(),
            "outcome" => outcome.as_str()
        )
        .record(latency.as_secs_f64());
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if !self.done {
            // 499: nginx's "client closed request"
            self.emit(Outcome::ClientGone, 499);
        }
    }
}
