//! Who sent a request: the scope of its key. A header's value (digested: a credential is never
//! stored or logged), the `sub` of a bearer JWT (verified before anything is claimed), or one
//! anonymous scope.

use http::{header, HeaderMap, HeaderName};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// A key a JWT's signature is checked with.
pub enum JwtKey {
    /// One key, one algorithm.
    Single(Algorithm, DecodingKey),
    /// The keys of a JWKS, by `kid`.
    Set(Vec<(Option<String>, Algorithm, DecodingKey)>),
}

impl JwtKey {
    /// An HS256 shared secret.
    pub fn hs256(secret: &[u8]) -> JwtKey {
        JwtKey::Single(Algorithm::HS256, DecodingKey::from_secret(secret))
    }

    /// An RS256 public key, PEM.
    pub fn rs256_pem(pem: &[u8]) -> Result<JwtKey, String> {
        DecodingKey::from_rsa_pem(pem)
            .map(|k| JwtKey::Single(Algorithm::RS256, k))
            .map_err(|e| format!("not an RSA public key in PEM: {e}"))
    }

    /// The RSA keys of a JWKS document.
    pub fn jwks(json: &[u8]) -> Result<JwtKey, String> {
        let set: JwkSet =
            serde_json::from_slice(json).map_err(|e| format!("not a JWKS document: {e}"))?;
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("a key of the JWKS: {e}"))?;
            keys.push((jwk.common.key_id.clone(), Algorithm::RS256, key));
        }
        if keys.is_empty() {
            return Err("the JWKS has no key".to_owned());
        }
        Ok(JwtKey::Set(keys))
    }
}

/// How bearer JWTs are verified.
pub struct Jwt {
    key: JwtKey,
    issuer: Option<String>,
    audience: Option<String>,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl Jwt {
    /// Verification under `key`, with the `iss` and `aud` a token must have, if any.
    pub fn new(key: JwtKey, issuer: Option<String>, audience: Option<String>) -> Jwt {
        Jwt {
            key,
            issuer,
            audience,
        }
    }

    fn describe(&self) -> String {
        let key = match &self.key {
            JwtKey::Single(alg, _) => format!("{alg:?}"),
            JwtKey::Set(keys) => format!("RS256, a JWKS of {} key(s)", keys.len()),
        };
        let mut s = format!("the `sub` of a bearer JWT ({key}");
        if let Some(iss) = &self.issuer {
            s.push_str(&format!(", iss={iss}"));
        }
        if let Some(aud) = &self.audience {
            s.push_str(&format!(", aud={aud}"));
        }
        s.push(')');
        s
    }

    /// The `sub` of a valid token, or why it is not one.
    fn subject(&self, token: &str) -> Result<String, String> {
        let head = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
        let (alg, key) = match &self.key {
            JwtKey::Single(alg, key) => (*alg, key),
            JwtKey::Set(keys) => {
                let found = match (&head.kid, keys.len()) {
                    (Some(kid), _) => keys.iter().find(|k| k.0.as_deref() == Some(kid)),
                    (None, 1) => keys.first(),
                    (None, _) => None,
                };
                let (_, alg, key) = found.ok_or("no key of the JWKS has the token's kid")?;
                (*alg, key)
            }
        };
        let mut validation = Validation::new(alg);
        match &self.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            validation.set_issuer(&[iss]);
        }
        let data =
            jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|e| e.to_string())?;
        if data.claims.sub.is_empty() {
            return Err("the token's sub is empty".to_owned());
        }
        Ok(data.claims.sub)
    }
}

/// Where the principal of a request comes from.
#[derive(Debug)]
pub enum PrincipalSource {
    /// A request header's value.
    Header(HeaderName),
    /// A bearer JWT's `sub`.
    Jwt(Jwt),
    /// Every request in one anonymous scope.
    Anonymous,
}

/// Why a request has no principal: the 401's detail.
#[derive(Debug)]
pub struct Unauthorized(pub String);

impl PrincipalSource {
    /// For `--check-config`.
    pub fn describe(&self) -> String {
        match self {
            PrincipalSource::Header(name) => format!("the `{name}` header (digested)"),
            PrincipalSource::Jwt(jwt) => jwt.describe(),
            PrincipalSource::Anonymous => "none: one anonymous scope".to_owned(),
        }
    }

    /// The scope of a request's key (`None`: anonymous, where allowed), or why it is refused.
    pub fn scope(
        &self,
        headers: &HeaderMap,
        allow_anonymous: bool,
    ) -> Result<Option<String>, Unauthorized> {
        let missing = |what: String| match allow_anonymous {
            true => Ok(None),
            false => Err(Unauthorized(what)),
        };
        match self {
            PrincipalSource::Anonymous => Ok(None),
            PrincipalSource::Header(name) => match headers.get(name) {
                Some(value) => Ok(Some(format!("h:{}", digest(value.as_bytes())))),
                None => missing(format!("the request has no `{name}` header")),
            },
            PrincipalSource::Jwt(jwt) => {
                let Some(value) = headers.get(header::AUTHORIZATION) else {
                    return missing("the request has no bearer token".to_owned());
                };
                let token = value
                    .to_str()
                    .ok()
                    .and_then(|v| {
                        v.strip_prefix("Bearer ")
                            .or_else(|| v.strip_prefix("bearer "))
                    })
                    .ok_or_else(|| {
                        Unauthorized("Authorization is not a bearer token".to_owned())
                    })?;
                // a token present and bad is refused even where anonymous requests are allowed
                let sub = jwt
                    .subject(token.trim())
                    .map_err(|e| Unauthorized(format!("the bearer token is not valid: {e}")))?;
                Ok(Some(format!("jwt:{}", digest(sub.as_bytes()))))
            }
        }
    }
}

/// A hex SHA-256 of `bytes`, the first 128 bits: what is stored and logged in place of a
/// credential or a key.
pub fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}
