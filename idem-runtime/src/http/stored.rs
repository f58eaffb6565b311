//! The stored response: what of a handler's response is kept, in which format, and how a
//! replay is made from it.
//!
//! The format is JSON, readable by an operator: the status, the headers that
//! belong to the response, and the body, as text when it is UTF-8 and base64 otherwise.

use ::axum::body::Body;
use base64::Engine as _;
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

/// A response as stored.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    status: u16,
    headers: Vec<(String, Blob)>,
    body: Blob,
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

/// The headers that belong to the response, as stored.
fn stored_headers(headers: &HeaderMap) -> Vec<(String, Blob)> {
    let named_in_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            !HOP_BY_HOP.contains(name)
                && *name != header::DATE
                && *name != header::CONTENT_LENGTH
                && *name != IDEMPOTENT_REPLAYED
                && !named_in_connection.iter().any(|n| n == name.as_str())
        })
        .map(|(name, value)| (name.as_str().to_owned(), Blob::new(value.as_bytes())))
        .collect()
}

impl StoredResponse {
    pub(crate) fn new(parts: &ResponseParts, body: &[u8]) -> StoredResponse {
        StoredResponse {
            status: parts.status.as_u16(),
            headers: stored_headers(&parts.headers),
            body: Blob::new(body),
        }
    }

    /// The replayed response, or `None` when the stored record does not make one.
    pub(crate) fn into_response(self) -> Option<Response<Body>> {
        let mut res = Response::new(Body::from(self.body.into_bytes()?));
        *res.status_mut() = StatusCode::from_u16(self.status).ok()?;
        let headers = res.headers_mut();
        for (name, value) in self.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let value = HeaderValue::from_bytes(&value.into_bytes()?).ok()?;
            headers.append(name, value);
        }
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        Some(res)
    }
}

/// Decodes stored bytes into the response a replay would send, or `None` when they do not
/// make one (the fuzz target's entry point; never panics).
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub fn decode_stored_response(bytes: &[u8]) -> Option<Response<Body>> {
    serde_json::from_slice::<StoredResponse>(bytes)
        .ok()?
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_headers_leave_out_hop_by_hop_and_date() {
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
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        h.insert("x-bin", HeaderValue::from_bytes(&[0xff, b'a']).unwrap());
        let names: Vec<String> = stored_headers(&h).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["content-type", "location", "x-bin"]);

        let (mut parts, ()) = Response::new(()).into_parts();
        parts.status = StatusCode::CREATED;
        parts.headers = h;
        let stored = StoredResponse::new(&parts, &[0, 159, 146, 150]);
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let res = back.into_response().unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        assert_eq!(res.headers()["x-bin"].as_bytes(), [0xff, b'a']);
        assert_eq!(res.headers()[IDEMPOTENT_REPLAYED], "true");
        assert!(res.headers().get(header::DATE).is_none());
    }
}
