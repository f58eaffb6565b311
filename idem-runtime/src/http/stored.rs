//! The stored response: what of a handler's response is kept, in which format, and how a
//! replay is made from it.
//!
//! The format is JSON, readable by an operator: the status, the headers that
//! belong to the response, and the body, as text when it is UTF-8 and base64 otherwise.

use super::body::Buffered;
use base64::Engine as _;
use bytes::Bytes;
use http::response::Parts as ResponseParts;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// The response header that marks a replayed response: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Bytes as stored: text when they are UTF-8 (readable by an operator), base64 otherwise.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Blob {
    Text(String),
    Base64 { b64: String },
}

impl Blob {
    fn new(bytes: &[u8]) -> Blob {
        match std::str::from_utf8(bytes) {
            Ok(s) => Blob::Text(s.to_owned()),
            Err(_) => Blob::Base64 {
                b64: base64::engine::general_purpose::STANDARD.encode(bytes),
            },
        }
    }

    fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Blob::Text(s) => Some(s.into_bytes()),
            Blob::Base64 { b64 } => base64::engine::general_purpose::STANDARD.decode(b64).ok(),
        }
    }
}

/// A response the inner service made, buffered: its head, its bytes, its trailers.
pub(super) struct FreshResponse {
    pub(super) parts: ResponseParts,
    pub(super) body: Bytes,
    pub(super) trailers: Option<HeaderMap>,
}

/// A response as stored.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    headers: Vec<(String, Blob)>,
    body: Blob,
    /// A gRPC response's trailers (`grpc-status`, `grpc-message`…); absent in records written
    /// before trailers were kept, and for responses without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trailers: Vec<(String, Blob)>,
}

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// A restrictive allow-list of response fields: the representation's metadata
/// (`Content-Type`, `Content-Encoding`, `Content-Language`, `Content-Location`), its validators
/// (`ETag`, `Last-Modified`), `Location`, `Link` and `Cache-Control`. It was the default before
/// a replay carried every field; pass it to
/// [`IdempotencyLayer::replay_headers`](super::IdempotencyLayer::replay_headers) to keep a
/// service's other fields (tracing ids, rate-limit counters) to its first response.
pub const STORED_HEADERS: [HeaderName; 9] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::CONTENT_LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LOCATION,
    header::LINK,
    header::CACHE_CONTROL,
];

/// What a gRPC layer stores besides [`STORED_HEADERS`]: the message's compression and the
/// call's status (trailers, or headers of a trailers-only response).
#[cfg(feature = "grpc")]
pub(crate) const GRPC_STORED_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("grpc-encoding"),
    HeaderName::from_static("grpc-status"),
    HeaderName::from_static("grpc-message"),
    HeaderName::from_static("grpc-status-details-bin"),
];

/// Fields never stored, whatever the allow-list says: `Set-Cookie` (a replay must not hand a
/// session to whoever holds the key), the hop-by-hop fields (`Proxy-*` among them), `Date`,
/// `Server` and `Content-Length` (the server sets them for the replay), and the replay marker.
fn never_stored(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
        || name.as_str().starts_with("proxy-")
        || *name == header::SET_COOKIE
        || *name == header::DATE
        || *name == header::SERVER
        || *name == header::CONTENT_LENGTH
        || *name == IDEMPOTENT_REPLAYED
}

/// The fields of `headers` stored: those of the allow-list, or all without one, less the
/// fields never stored.
fn stored_headers(headers: &HeaderMap, allow: Option<&[HeaderName]>) -> Vec<(String, Blob)> {
    headers
        .iter()
        .filter(|(name, _)| allow.is_none_or(|allow| allow.contains(name)) && !never_stored(name))
        .map(|(name, value)| (name.as_str().to_owned(), Blob::new(value.as_bytes())))
        .collect()
}

impl StoredResponse {
    /// The stored form of `fresh`, with the fields in `allow` (all without it).
    pub(crate) fn new(fresh: &FreshResponse, allow: Option<&[HeaderName]>) -> StoredResponse {
        StoredResponse::of(&fresh.parts, &fresh.body, fresh.trailers.as_ref(), allow)
    }

    fn of(
        parts: &ResponseParts,
        body: &[u8],
        trailers: Option<&HeaderMap>,
        allow: Option<&[HeaderName]>,
    ) -> StoredResponse {
        StoredResponse {
            status: parts.status.as_u16(),
            headers: stored_headers(&parts.headers, allow),
            body: Blob::new(body),
            trailers: trailers
                .map(|t| stored_headers(t, allow))
                .unwrap_or_default(),
        }
    }

    /// The replayed response, or `None` when the stored record does not make one.
    pub(crate) fn into_response(self) -> Option<Response<Buffered>> {
        let trailers = match self.trailers.is_empty() {
            true => None,
            false => Some(header_map(self.trailers)?),
        };
        let body = Buffered::new(Bytes::from(self.body.into_bytes()?), trailers);
        let mut res = Response::new(body);
        *res.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = res.headers_mut();
        *headers = header_map(self.headers)?;
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Some(res)
    }
}

/// Stored fields back into a header map, or `None` when one is not a valid field.
fn header_map(fields: Vec<(String, Blob)>) -> Option<HeaderMap> {
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(&value.into_bytes()?).ok()?;
        // records written before the allow-list may hold a Set-Cookie: never replayed
        if !never_stored(&name) {
            headers.append(name, value);
        }
    }
    Some(headers)
}

/// Decodes stored bytes into the response a replay would send, or `None` when they do not
/// make one (the fuzz target's entry point; never panics).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn decode_stored_response(bytes: &[u8]) -> Option<Response<Buffered>> {
    serde_json::from_slice::<StoredResponse>(bytes)
        .ok()?
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_but_the_deny_list_is_stored_or_only_the_allow_list() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::LOCATION, HeaderValue::from_static("/charges/1"));
        h.insert(
            header::DATE,
            HeaderValue::from_static("Tue, 01 Jul 2025 00:00:00 GMT"),
        );
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert(header::SET_COOKIE, HeaderValue::from_static("session=1"));
        h.insert("x-trace", HeaderValue::from_static("t1"));
        h.insert(header::SERVER, HeaderValue::from_static("upstream/1"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-bin", HeaderValue::from_bytes(&[0xff, b'a']).unwrap());
        let names = |allow: Option<&[HeaderName]>| -> Vec<String> {
            stored_headers(&h, allow)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(Some(&STORED_HEADERS)), ["content-type", "location"]);
        // by default every field but Set-Cookie, Date, Server, Content-Length and hop-by-hop
        assert_eq!(
            names(None),
            ["content-type", "location", "x-trace", "x-bin"]
        );
        // listed or not, the deny-list is never kept
        let mut all: Vec<HeaderName> = h.keys().cloned().collect();
        all.push(header::CONTENT_TYPE);
        assert_eq!(
            names(Some(&all)),
            ["content-type", "location", "x-trace", "x-bin"]
        );

        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::CREATED;
        parts.headers = h.clone();
        let stored = StoredResponse::of(&parts, &[0, 159, 146, 150], None, None);
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let res = back.into_response().unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()["x-bin"].as_bytes(), [0xff, b'a']);
        assert_eq!(res.headers()[IDEMPOTENT_REPLAYED], "true");
        assert!(res.headers().get(header::DATE).is_none());
        assert!(res.headers().get(header::SET_COOKIE).is_none());
    }

    #[test]
    fn a_record_without_trailers_still_decodes_and_an_old_set_cookie_is_dropped() {
        let json = r#"{"status":200,"headers":[["content-type","text/plain"],["set-cookie","s=1"]],"body":"hi"}"#;
        let res = serde_json::from_str::<StoredResponse>(json)
            .unwrap()
            .into_response()
            .unwrap();
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/plain");
        assert!(res.headers().get(header::SET_COOKIE).is_none());
    }
}
