//! The problem types of the `Idempotency-Key` layer's error responses.
//!
//! Every error the layer answers itself is an `application/problem+json` document (RFC 9457):
//!
//! ```json
//! {"type": "https://docs.rs/idem-rs/latest/idem/http/problem/index.html#request-in-progress",
//!  "title": "Request in progress", "status": 409,
//!  "detail": "a request with this Idempotency-Key is being processed; retry it later"}
//! ```
//!
//! Its `type` is the address of one of the sections below, which says what happened and what
//! a client does about it; the constants of this module hold them, so a client written in Rust
//! can match on them.
//!
//! # Idempotency key missing
//!
//! `400 Bad Request`, [`KEY_MISSING`]. The route is idempotent and requires an
//! `Idempotency-Key` field, and the request has none. Send one: a value unique to this
//! operation, the same on every retry of it, e.g.
//! `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`.
//!
//! # Idempotency key malformed
//!
//! `400 Bad Request`, [`KEY_MALFORMED`]. The `Idempotency-Key` is not a structured-field
//! string (or bare value) of 1–255 printable ASCII characters, or the request has more than one
//! such field. The `detail` says which.
//!
//! # Request in progress
//!
//! `409 Conflict`, [`IN_PROGRESS`]. A request with this key is being processed. Retry it,
//! with the same key, after the `Retry-After` seconds: it then gets the first request's
//! response.
//!
//! # Body too large
//!
//! `413 Content Too Large`, [`BODY_TOO_LARGE`]. The request body is above the layer's limit
//! (`IdempotencyLayer::body_limit`); the request did not run.
//!
//! # Idempotency key reused
//!
//! `422 Unprocessable Content`, [`KEY_REUSED`]. The key was used before with another request
//! (another method, path, query or body); the request did not run. Use a new key for a new
//! request.
//!
//! # Outcome unknown
//!
//! `423 Locked`, [`OUTCOME_UNKNOWN`]. An earlier attempt of this request was abandoned (its
//! server died, or its lease lapsed, after the handler started and before its response was
//! stored), the layer parks such keys ([`IdempotencyLayer::on_abandoned`]) and nobody knows
//! whether its effect happened. The key is locked until an operator resolves it (`idem pending`,
//! `idem resolve`, or the board): then a retry gets the response the operator stored, or runs
//! the request. Do not retry blindly, and do not send the operation again under a new key: it
//! may have happened. Not a `409` (clients retry a `409` after `Retry-After`, and there is none
//! to give) nor a `5xx` (retry policies retry those): `423` is a state of the key that retrying
//! does not change.
//!
//! [`IdempotencyLayer::on_abandoned`]: super::IdempotencyLayer::on_abandoned
//!
//! # Outcome undecided
//!
//! `503 Service Unavailable`, [`OUTCOME_UNDECIDED`]. An earlier attempt of this request was
//! abandoned and the server's reconcile hook could not find out yet whether its effect happened
//! (the service it asks failed); the request did not run. Retry it later (`Retry-After`) with
//! the same key: the next attempt asks again.
//! # Idempotency key expired
//!
//! `410 Gone`, [`KEY_EXPIRED`]. The key was used before, and its response is no longer kept
//! (its TTL passed); the layer keeps a tombstone of it (`IdempotencyLayer::tombstone`), so the
//! request did not run again. A late retry of an operation that already ran: do not retry it;
//! use a new key only for a new request.
//!
//! # Principal missing
//!
//! `500 Internal Server Error`, [`PRINCIPAL_MISSING`]. The layer found no principal to scope
//! the key by, and anonymous requests are not allowed: the server's authentication middleware
//! is missing or runs inside the layer. A server-side misconfiguration; the request did not run.
//!
//! # Internal
//!
//! `500 Internal Server Error`, [`INTERNAL`]. A stored response no longer decodes, or the
//! handler's response body failed (its key is then released).
//!
//! # Store unavailable
//!
//! `503 Service Unavailable`, [`STORE_UNAVAILABLE`]. The idempotency store failed; the request
//! did not run. Retry it later (`Retry-After`) with the same key.
//!
//! # Overloaded
//!
//! `503 Service Unavailable`, [`OVERLOADED`]. The server runs as many idempotent requests as
//! it allows (`IdempotencyLayer::max_in_flight`); the request did not run. Retry it later
//! (`Retry-After`) with the same key.
//!
//! # Shutting down
//!
//! `503 Service Unavailable`, [`SHUTTING_DOWN`]. The server is shutting down and waits for the
//! requests it runs; this one did not run. Retry it (`Retry-After`) with the same key: another
//! instance, or this one restarted, runs it.

use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;
use std::time::Duration;

/// The `type` of a problem: the address of its section in this module's documentation.
macro_rules! problem_type {
    ($anchor:literal) => {
        concat!(
            "https://docs.rs/idem-rs/latest/idem/http/problem/index.html#",
            $anchor
        )
    };
}

/// 400: the route requires an `Idempotency-Key` and the request has none.
pub const KEY_MISSING: &str = problem_type!("idempotency-key-missing");
/// 400: the `Idempotency-Key` is not a structured-field string (or bare value) of 1–255
/// printable ASCII characters, or the request has more than one.
pub const KEY_MALFORMED: &str = problem_type!("idempotency-key-malformed");
/// 409: a request with this key is being processed; retry after `Retry-After` seconds.
pub const IN_PROGRESS: &str = problem_type!("request-in-progress");
/// 413: the request body is larger than the layer's limit.
pub const BODY_TOO_LARGE: &str = problem_type!("body-too-large");
/// 422: the key was used before with another request (method, path, query or body).
pub const KEY_REUSED: &str = problem_type!("idempotency-key-reused");
/// 423: an abandoned attempt's outcome is unknown and the key is parked until an operator
/// resolves it; do not retry blindly.
pub const OUTCOME_UNKNOWN: &str = problem_type!("outcome-unknown");
/// 503: an abandoned attempt's outcome could not be reconciled yet; retry later, same key.
pub const OUTCOME_UNDECIDED: &str = problem_type!("outcome-undecided");
/// 410: the key was used before and its response expired; its tombstone refuses a late retry.
pub const KEY_EXPIRED: &str = problem_type!("idempotency-key-expired");
/// 500: the layer found no principal and anonymous requests are not allowed.
pub const PRINCIPAL_MISSING: &str = problem_type!("principal-missing");
/// 500: a stored response no longer decodes, or the handler's response body failed.
pub const INTERNAL: &str = problem_type!("internal");
/// 503: the idempotency store failed; the request did not run. Retry later.
pub const STORE_UNAVAILABLE: &str = problem_type!("store-unavailable");
/// 503: the layer runs `max_in_flight` requests already; the request did not run.
pub const OVERLOADED: &str = problem_type!("overloaded");
/// 503: the server is shutting down; the request did not run.
pub const SHUTTING_DOWN: &str = problem_type!("shutting-down");

/// A refusal or failure the layer answers itself, before it is written in the protocol's
/// terms (a problem document, or a gRPC status).
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    /// One of this module's constants (or `about:blank`).
    pub(crate) type_: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: std::borrow::Cow<'static, str>,
    pub(crate) retry_after: Option<Duration>,
}

impl Problem {
    pub(crate) fn new(
        status: StatusCode,
        type_: &'static str,
        title: &'static str,
        detail: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Problem {
        Problem {
            status,
            type_,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A 500 [`INTERNAL`].
    pub(crate) fn internal(detail: &'static str) -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            INTERNAL,
            "Internal Server Error",
            detail,
        )
    }

    /// With `Retry-After: after`.
    pub(crate) fn retry_after(mut self, after: Duration) -> Problem {
        self.retry_after = Some(after);
        self
    }

    /// The `application/problem+json` response.
    pub(crate) fn into_response<B: From<Vec<u8>>>(self) -> Response<B> {
        let res = response(self.status, self.type_, self.title, &self.detail);
        match self.retry_after {
            Some(after) => with_retry_after(res, after),
            None => res,
        }
    }
}

/// `after` as whole seconds, rounded up, at least 1: the one rounding of every `Retry-After`.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_millis().div_ceil(1000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX)
}

#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    type_: &'a str,
    title: &'a str,
    status: u16,
    detail: &'a str,
}

/// An `application/problem+json` response.
pub(crate) fn response<B: From<Vec<u8>>>(
    status: StatusCode,
    type_: &str,
    title: &str,
    detail: &str,
) -> Response<B> {
    let body = serde_json::to_vec(&Document {
        type_,
        title,
        status: status.as_u16(),
        detail,
    })
    .unwrap_or_default();
    let mut res = Response::new(B::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// `res` with `Retry-After: ` `after`, rounded up to whole seconds (at least 1: the field has
/// no finer unit, and `0` would invite an immediate retry loop).
pub(crate) fn with_retry_after<B>(mut res: Response<B>, after: Duration) -> Response<B> {
    res.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs(after)),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The anchor rustdoc gives a heading: lower case, words joined by `-`.
    fn anchor(heading: &str) -> String {
        heading
            .to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join("-")
    }

    #[test]
    fn every_type_is_the_address_of_a_section_of_these_docs() {
        let source = include_str!("problem.rs");
        let anchors: Vec<String> = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! # "))
            .map(anchor)
            .collect();
        let types = [
            KEY_MISSING,
            KEY_MALFORMED,
            IN_PROGRESS,
            BODY_TOO_LARGE,
            KEY_REUSED,
            OUTCOME_UNKNOWN,
            OUTCOME_UNDECIDED,
            KEY_EXPIRED,
            PRINCIPAL_MISSING,
            INTERNAL,
            STORE_UNAVAILABLE,
            OVERLOADED,
            SHUTTING_DOWN,
        ];
        assert_eq!(anchors.len(), types.len(), "{anchors:?}");
        for t in types {
            let (page, fragment) = t.split_once('#').unwrap();
            assert_eq!(
                page,
                "https://docs.rs/idem-rs/latest/idem/http/problem/index.html"
            );
            assert!(anchors.iter().any(|a| a == fragment), "{t} in {anchors:?}");
        }
    }

    #[test]
    fn a_document_has_its_status_and_type() {
        let res: Response<Vec<u8>> = response(StatusCode::CONFLICT, IN_PROGRESS, "t", "d");
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(
            res.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let doc: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(doc["type"], IN_PROGRESS);
        assert_eq!(doc["status"], 409);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let after = |d: Duration| {
            let res = with_retry_after(Response::new(()), d);
            res.headers()[header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(after(Duration::ZERO), "1");
        assert_eq!(after(Duration::from_millis(300)), "1");
        assert_eq!(after(Duration::from_millis(1000)), "1");
        assert_eq!(after(Duration::from_millis(1001)), "2");
    }
}
