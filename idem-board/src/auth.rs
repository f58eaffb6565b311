//! Who may see the board and act from it: the token (bearer or login cookie), the loopback
//! host check of a board without one, and the CSRF token of every action.

use axum::http::{header, HeaderMap};
use idem::Error;
use subtle::ConstantTimeEq;

/// The name of the login cookie.
pub(crate) const COOKIE: &str = "idem_board";

/// The board's secrets, fixed for the life of the process.
pub(crate) struct Auth {
    /// The token requests must carry, if any.
    token: Option<String>,
    /// What the login cookie holds: random, so the token itself never sits in a cookie.
    session: String,
    /// The CSRF token every action's form carries.
    pub(crate) csrf: String,
}

/// 32 random bytes as hex.
fn random_hex() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::config(format!("no randomness for the board's secrets: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Constant-time equality of two secrets (their length is not secret).
fn same(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

impl Auth {
    pub(crate) fn new(token: Option<String>) -> Result<Auth, Error> {
        Ok(Auth {
            token,
            session: random_hex()?,
            csrf: random_hex()?,
        })
    }

    /// True when a token is required.
    pub(crate) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// True when `given` is the token.
    pub(crate) fn token_matches(&self, given: &str) -> bool {
        self.token.as_deref().is_some_and(|t| same(t, given))
    }

    /// The `Set-Cookie` value a successful login answers with.
    pub(crate) fn login_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
            self.session
        )
    }

    /// True when the request may see the board: no token is required, or it carries the
    /// token as a bearer, or the login cookie.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|v| v.to_str().ok()?.strip_prefix("Bearer "))
            .any(|given| same(token, given.trim()));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(|given| same(&self.session, given));
        bearer || cookie
    }

    /// True when `given` is the CSRF token.
    pub(crate) fn csrf_matches(&self, given: &str) -> bool {
        same(&self.csrf, given)
    }
}

/// True when the `Host` header names this machine's loopback (`127.0.0.1`, `[::1]`,
/// `localhost`, any port): what a board without a token answers, so that a page elsewhere
/// cannot read it through a name rebound to 127.0.0.1.
pub(crate) fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_token_is_needed_once_given() {
        let auth = Auth::new(Some("0123456789abcdef".into())).unwrap();
        assert!(!auth.admits(&headers(&[])));
        assert!(!auth.admits(&headers(&[(
            header::AUTHORIZATION,
            "Bearer 0123456789abcdeX"
        )])));
        assert!(auth.admits(&headers(&[(
            header::AUTHORIZATION,
            "Bearer 0123456789abcdef"
        )])));
        // The token itself is not a session.
        assert!(!auth.admits(&headers(&[(header::COOKIE, "idem_board=0123456789abcdef")])));
        let cookie = auth.login_cookie();
        let value = cookie.split(';').next().unwrap();
        assert!(auth.admits(&headers(&[(header::COOKIE, &format!("a=b; {value}"))])));
        assert!(Auth::new(None).unwrap().admits(&headers(&[])));
    }

    #[test]
    fn only_loopback_names_reach_a_board_without_token() {
        for ok in ["127.0.0.1:9090", "localhost:1", "[::1]:9090", "127.0.0.1"] {
            assert!(loopback_host(&headers(&[(header::HOST, ok)])), "{ok}");
        }
        for bad in ["evil.example:9090", "10.0.0.1:9090", ""] {
            assert!(!loopback_host(&headers(&[(header::HOST, bad)])), "{bad}");
        }
        assert!(!loopback_host(&headers(&[])));
    }
}
