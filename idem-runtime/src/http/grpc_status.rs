//! gRPC statuses: the codes, the fields that carry them, the trailers-only response of a
//! refusal, and which codes are stored. What the gRPC layer ([`super::grpc`]) and the service
//! read, without either of them.

use super::body::Buffered;
use super::problem::{self, retry_after_secs, Problem};
use crate::policy::OnError;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

/// A gRPC status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // the names are gRPC's own
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code of a `grpc-status` value; an unknown number is [`Code::Unknown`], as the gRPC
    /// specification says.
    pub fn from_i32(n: i32) -> Code {
        use Code::*;
        const ALL: [Code; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        usize::try_from(n)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .unwrap_or(Unknown)
    }
}

/// The `grpc-status` field.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The `grpc-message` field.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// The metadata with the problem type of a refusal (see [`problem`]).
pub const IDEMPOTENCY_PROBLEM: HeaderName = HeaderName::from_static("idempotency-problem");
/// The trailer with which gRPC retry policies are told when to retry.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The default policy of which gRPC responses are stored (see the [module](super::grpc) docs).
pub fn store_policy(code: Code) -> OnError {
    use Code::*;
    match code {
        Ok | InvalidArgument | NotFound | AlreadyExists | PermissionDenied | FailedPrecondition
        | OutOfRange | Unimplemented | Unauthenticated => OnError::Keep,
        _ => OnError::Release,
    }
}

/// The gRPC code of a refusal of the layer.
fn code_of(problem: &Problem) -> Code {
    match problem.type_ {
        problem::IN_PROGRESS => Code::Aborted,
        problem::BODY_TOO_LARGE => Code::ResourceExhausted,
        // A key reused, used and expired (its tombstone), or parked until an operator decides:
        // a retry cannot change the answer.
        problem::KEY_REUSED | problem::KEY_EXPIRED | problem::OUTCOME_UNKNOWN => {
            Code::FailedPrecondition
        }
        problem::PRINCIPAL_MISSING | problem::INTERNAL => Code::Internal,
        problem::STORE_UNAVAILABLE
        | problem::OVERLOADED
        | problem::SHUTTING_DOWN
        | problem::OUTCOME_UNDECIDED => Code::Unavailable,
        // KEY_MISSING, KEY_MALFORMED, an unreadable body
        _ => Code::InvalidArgument,
    }
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII, and `%`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The trailers-only gRPC response of a refusal.
pub(super) fn status_response(problem: Problem) -> Response<Buffered> {
    let mut res = Response::new(Buffered::default());
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS, HeaderValue::from(code_of(&problem) as i32));
    let message = format!("{}: {}", problem.title, problem.detail);
    if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    h.insert(IDEMPOTENCY_PROBLEM, HeaderValue::from_static(problem.type_));
    if let Some(after) = problem.retry_after {
        let secs = retry_after_secs(after);
        h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        h.insert(
            GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from(secs.saturating_mul(1000)),
        );
    }
    res
}

/// The `grpc-status` of a response: in its trailers, or in its headers when it is
/// trailers-only; a response without one did not finish as a gRPC call ([`Code::Unknown`]).
pub(super) fn code_of_response(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    trailers
        .and_then(|t| t.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .map_or(Code::Unknown, Code::from_i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn codes_round_trip_and_unknown_numbers_are_unknown() {
        for n in 0..17 {
            assert_eq!(Code::from_i32(n) as i32, n);
        }
        assert_eq!(Code::from_i32(17), Code::Unknown);
        assert_eq!(Code::from_i32(-1), Code::Unknown);
    }

    #[test]
    fn a_refusal_is_a_trailers_only_status_with_pushback() {
        let p = Problem::new(StatusCode::CONFLICT, problem::IN_PROGRESS, "t", "d 100%")
            .retry_after(std::time::Duration::from_millis(1500));
        let res = status_response(p);
        assert_eq!(res.status(), StatusCode::OK);
        let h = res.headers();
        assert_eq!(h[GRPC_STATUS], "10");
        assert_eq!(h[GRPC_MESSAGE], "t: d 100%25");
        assert_eq!(h[http::header::RETRY_AFTER], "2");
        assert_eq!(h[GRPC_RETRY_PUSHBACK_MS], "2000");
        assert_eq!(h[IDEMPOTENCY_PROBLEM], problem::IN_PROGRESS);
    }

    #[test]
    fn the_status_is_read_from_trailers_then_headers() {
        let mut t = HeaderMap::new();
        t.insert(GRPC_STATUS, HeaderValue::from_static("5"));
        let mut h = HeaderMap::new();
        assert_eq!(code_of_response(&h, Some(&t)), Code::NotFound);
        h.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(code_of_response(&h, None), Code::Unavailable);
        assert_eq!(code_of_response(&HeaderMap::new(), None), Code::Unknown);
        assert_eq!(store_policy(Code::NotFound), OnError::Keep);
        assert_eq!(store_policy(Code::Unavailable), OnError::Release);
    }
}
