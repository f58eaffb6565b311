//! What a repeat of a request must match: its method, path, query and body.

use http::request::Parts as RequestParts;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// What the fingerprint covers. The body enters as its sha256 (the canonical encoding of a
/// byte string would be long).
#[derive(Serialize)]
pub(crate) struct Fingerprint<'a> {
    method: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    body_sha256: String,
}

impl<'a> Fingerprint<'a> {
    /// The fingerprint of a request made of `parts` and `body`.
    pub(crate) fn of(parts: &'a RequestParts, body: &[u8]) -> Fingerprint<'a> {
        Fingerprint {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            body_sha256: crate::key::Digest(Sha256::digest(body).into()).to_hex(),
        }
    }
}
