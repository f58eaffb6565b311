//! What a repeat of a request must match: its method, path, query and body.

use http::header;
use http::request::Parts as RequestParts;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::borrow::Cow;

/// How the layer fingerprints a request's query and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FingerprintMode {
    /// The query string and body bytes as they are (the default): a JSON body with its fields
    /// in another order is another request.
    #[default]
    Raw,
    /// Canonical forms: a JSON body (`application/json`, `application/*+json`) is fingerprinted
    /// by its parsed value, so field order and whitespace do not matter
    /// (`{"a":1,"b":2}` and `{ "b": 2, "a": 1 }` are one request); query parameters are
    /// sorted. Other bodies, and JSON that does not parse, by their bytes.
    Canonical,
}

/// What the fingerprint covers. The body enters as its sha256 (the canonical encoding of a
/// byte string would be long).
#[derive(Serialize)]
pub(crate) struct Fingerprint<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<Cow<'a, str>>,
    body_sha256: String,
}

impl<'a> Fingerprint<'a> {
    /// The fingerprint of a request made of `parts` and `body`.
    pub(crate) fn of(parts: &'a RequestParts, body: &[u8], mode: FingerprintMode) -> Self {
        let (query, canonical_body) = match mode {
            FingerprintMode::Raw => (parts.uri.query().map(Cow::Borrowed), None),
            FingerprintMode::Canonical => (
                parts.uri.query().map(sorted_query),
                is_json(parts).then(|| canonical_json(body)).flatten(),
            ),
        };
        let body = canonical_body.as_deref().unwrap_or(body);
        Fingerprint {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query,
            body_sha256: crate::key::Digest(Sha256::digest(body).into()).to_hex(),
        }
    }
}

/// The query's parameters in sorted order (`b=2&a=1` and `a=1&b=2` are one query); repeated
/// parameters keep their values, sorted too.
fn sorted_query(query: &str) -> Cow<'static, str> {
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    params.sort_unstable();
    Cow::Owned(params.join("&"))
}

fn is_json(parts: &RequestParts) -> bool {
    let Some(ct) = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The canonical bytes of a JSON body: objects' keys sorted, no whitespace; `None` when the
/// body is not JSON.
fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out);
    Some(out)
}

/// Writes `value` with sorted keys by hand: serde_json's `Map` keeps insertion order when any
/// crate in the build enables its `preserve_order` feature, so its own output is not canonical.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // A string always serializes.
                let _ = serde_json::to_writer(&mut *out, k);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(uri: &str, ct: &str, body: &str, mode: FingerprintMode) -> String {
        let (parts, ()) = http::Request::post(uri)
            .header(header::CONTENT_TYPE, ct)
            .body(())
            .unwrap()
            .into_parts();
        serde_json::to_string(&Fingerprint::of(&parts, body.as_bytes(), mode)).unwrap()
    }

    #[test]
    fn canonical_json_ignores_field_order_and_whitespace() {
        let c = FingerprintMode::Canonical;
        let a = fp(
            "/x",
            "application/json",
            r#"{"a":1,"b":{"d":[1,2],"c":2}}"#,
            c,
        );
        let b = fp(
            "/x",
            "application/json; charset=utf-8",
            "{ \"b\": {\"c\":2, \"d\": [1, 2]}, \"a\": 1 }",
            c,
        );
        assert_eq!(a, b);
        // values still matter, array order too
        assert_ne!(
            a,
            fp(
                "/x",
                "application/json",
                r#"{"a":1,"b":{"d":[2,1],"c":2}}"#,
                c
            )
        );
        assert_ne!(
            a,
            fp(
                "/x",
                "application/json",
                r#"{"a":2,"b":{"d":[1,2],"c":2}}"#,
                c
            )
        );
        // raw: another order is another request
        let r = FingerprintMode::Raw;
        assert_ne!(
            fp("/x", "application/json", r#"{"a":1,"b":2}"#, r),
            fp("/x", "application/json", r#"{"b":2,"a":1}"#, r)
        );
        // not JSON by its type: bytes
        assert_ne!(
            fp("/x", "text/plain", r#"{"a":1,"b":2}"#, c),
            fp("/x", "text/plain", r#"{"b":2,"a":1}"#, c)
        );
        assert_eq!(
            fp("/x", "application/merge-patch+json", r#"{"a":1,"b":2}"#, c),
            fp("/x", "application/merge-patch+json", r#"{"b":2,"a":1}"#, c)
        );
    }

    #[test]
    fn canonical_sorts_the_query_and_raw_is_unchanged() {
        let c = FingerprintMode::Canonical;
        assert_eq!(
            fp("/x?b=2&a=1", "text/plain", "", c),
            fp("/x?a=1&b=2", "text/plain", "", c)
        );
        let r = FingerprintMode::Raw;
        assert_ne!(
            fp("/x?b=2&a=1", "text/plain", "", r),
            fp("/x?a=1&b=2", "text/plain", "", r)
        );
        // the raw fingerprint is the one keys were stored under before modes existed
        assert_eq!(
            fp("/x?q=1", "text/plain", "hi", r),
            format!(
                r#"{{"method":"POST","path":"/x","query":"q=1","body_sha256":"{}"}}"#,
                crate::key::Digest(Sha256::digest(b"hi").into()).to_hex()
            )
        );
    }
}
