//! A client that retries right (feature `client`): middleware for [`reqwest-middleware`] that
//! gives each logical request one `Idempotency-Key` and keeps it across that request's
//! retries.
//!
//! An idempotency key is only as good as the client that keeps it: a client that mints a new
//! key per attempt, or retries without one, runs the server's side effect twice when a
//! response is lost. [`IdempotencyMiddleware`] mints the key once, before the first attempt
//! (a UUID v4 from the OS's generator; a key the caller set is kept), and retries with it:
//!
//! * on connection errors and timeouts (the request may or may not have run: the key makes
//!   the retry safe);
//! * on `409 Conflict` with `Retry-After` (a request with this key is still in flight, as
//!   `idem`'s HTTP layer answers), after the seconds it asks, capped;
//! * on `429 Too Many Requests` and every `5xx`, after its `Retry-After` (capped) or, without
//!   one, capped exponential backoff with jitter ([`Backoff`]);
//!
//! within a budget of failed attempts and of time ([`IdempotencyMiddleware::max_attempts`],
//! [`IdempotencyMiddleware::max_elapsed`]; waiting on a request in flight is bounded by time
//! alone). Never on `422` (the key was used with another
//! request) or any other `4xx`, nor on a `409` without `Retry-After` (an application's own
//! conflict).
//!
//! Only the methods the server keys get a key (`POST` and `PATCH`, as `idem`'s layer; see
//! [`IdempotencyMiddleware::methods`]). A request of another method is retried if HTTP makes
//! it idempotent (`GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) or if it carries a key
//! the caller set; any other is sent once. A body that cannot be cloned (a stream) cannot be
//! sent again: such a request is sent once, never retried (it still gets its key, which the
//! caller can read from [`Delivery::key`] to retry it by hand).
//!
//! The response carries a [`Delivery`] extension: how many attempts it took, whether it is a
//! replay (`Idempotent-Replayed: true`, which `idem`'s layer sets), and the key. An error after
//! retries is [`reqwest_middleware::Error::Middleware`] holding a [`GaveUp`] over the last
//! attempt's [`reqwest::Error`] (both reachable with `downcast_ref`).
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! use idem::client::{Delivery, IdempotencyMiddleware};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let http = reqwest::Client::builder()
//!     .timeout(Duration::from_secs(10)) // per attempt
//!     .build()?;
//! let client = reqwest_middleware::ClientBuilder::new(http)
//!     .with(IdempotencyMiddleware::new().max_elapsed(Duration::from_secs(60)))
//!     .build();
//! let res = client
//!     .post("http://127.0.0.1:3000/charges")
//!     .body(r#"{"amount": 1200}"#)
//!     .send()
//!     .await?;
//! let delivery = res.extensions().get::<Delivery>().unwrap();
//! println!("{} after {} attempts, replayed: {}", res.status(), delivery.attempts(), delivery.replayed());
//! # Ok(()) }
//! ```
//!
//! Put it last among the middlewares that retry or time out (it is the retry loop): an inner
//! `reqwest-retry` would retry each attempt again.
//!
//! [`reqwest-middleware`]: https://docs.rs/reqwest-middleware

mod backoff;

pub use backoff::Backoff;

use http::Extensions;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Request, Response, StatusCode};
use reqwest_middleware::{Middleware, Next};
use std::fmt;
use std::time::{Duration, Instant};

/// The request header of the key: `Idempotency-Key` (as
/// `idem::http::IDEMPOTENCY_KEY`).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header that marks a replay: `Idempotent-Replayed: true` (as
/// `idem::http::IDEMPOTENT_REPLAYED`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A reqwest middleware that gives each request of the keyed methods one `Idempotency-Key`
/// and retries it, with that key, on failures that may be transient. See the
/// [module](self) documentation.
#[derive(Clone, Debug)]
pub struct IdempotencyMiddleware {
    methods: Vec<Method>,
    max_attempts: u32,
    max_elapsed: Duration,
    backoff: Backoff,
    attempt_timeout: Option<Duration>,
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        IdempotencyMiddleware::new()
    }
}

impl IdempotencyMiddleware {
    /// Keys on `POST` and `PATCH`; at most 5 attempts within 60 s; [`Backoff::default`]; no
    /// timeout of its own (the client's applies to each attempt).
    pub fn new() -> IdempotencyMiddleware {
        IdempotencyMiddleware {
            methods: vec![Method::POST, Method::PATCH],
            max_attempts: 5,
            max_elapsed: Duration::from_secs(60),
            backoff: Backoff::default(),
            attempt_timeout: None,
        }
    }

    /// The methods whose requests get a key (default `POST` and `PATCH`): those the server
    /// keys (`idem`'s `IdempotencyLayer::methods`).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The most attempts of one request that fail (connection errors, timeouts, `429`, `5xx`),
    /// the first included (default 5; at least 1). A `409` in flight is not a failure: the
    /// server is running the request, and waiting for it is bounded by
    /// [`IdempotencyMiddleware::max_elapsed`] alone, so a handler slower than the client's
    /// timeout is waited for rather than given up on after a few polls.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The time budget of one request (default 60 s): no retry is started whose wait would
    /// end past it, counted from the first attempt. The last answer (response or error) is
    /// returned then.
    pub fn max_elapsed(mut self, budget: Duration) -> Self {
        self.max_elapsed = budget;
        self
    }

    /// The waits between attempts (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// A timeout for each attempt of a request that has none of its own
    /// (`RequestBuilder::timeout`); the client's `timeout` applies otherwise. A timed-out
    /// attempt is retried with the same key: a server that is still running the first gets
    /// a `409` and the retry waits, then gets the first attempt's response.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The key of `req`: the caller's, or for a keyed method a fresh one, set on `req`.
    fn key_of(&self, req: &mut Request) -> Option<String> {
        if let Some(value) = req.headers().get(IDEMPOTENCY_KEY) {
            return Some(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
        if !self.methods.contains(req.method()) {
            return None;
        }
        let key = mint_key()?;
        let value = HeaderValue::from_str(&key).ok()?;
        req.headers_mut().insert(IDEMPOTENCY_KEY, value);
        Some(key)
    }
}

/// A new key: a UUID v4 (122 random bits) from the OS's generator, hyphenated. `None` if the
/// generator fails (the request then goes without a key, and is sent once).
fn mint_key() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .hyphenated()
            .to_string(),
    )
}

/// Whether HTTP makes `method` idempotent (RFC 9110 §9.2.2): repeating it changes nothing more.
fn idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Why an answer is retried.
#[derive(Debug, PartialEq)]
enum Retry {
    /// The attempt failed (a transport error, `429`, `5xx`): it counts against
    /// `max_attempts`; the server's `Retry-After`, if any.
    Failed(Option<Duration>),
    /// A request with the key is in flight (`409` with `Retry-After`): poll again after it.
    InFlight(Duration),
}

/// Whether `answer` is retried, and why; `None`: it is final.
fn retry_of(answer: &reqwest_middleware::Result<Response>) -> Option<Retry> {
    match answer {
        Ok(res) => retry_of_status(res.status(), backoff::retry_after(res.headers())),
        // connection refused or reset, the response lost, a timeout; not a request reqwest
        // could not build, a redirect loop, or an error of another middleware
        Err(reqwest_middleware::Error::Reqwest(e)) => {
            (e.is_connect() || e.is_timeout() || e.is_request()).then_some(Retry::Failed(None))
        }
        Err(reqwest_middleware::Error::Middleware(_)) => None,
    }
}

/// Whether a response of `status` with `Retry-After: after` is retried.
fn retry_of_status(status: StatusCode, after: Option<Duration>) -> Option<Retry> {
    if status == StatusCode::CONFLICT {
        // in flight: idem's layer (and Stripe) say when to come back; a 409 without
        // Retry-After is the application's own conflict, which a retry does not cure
        after.map(Retry::InFlight)
    } else if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        Some(Retry::Failed(after))
    } else {
        None
    }
}

/// The attempts behind a response: the [`IdempotencyMiddleware`] sets it as a response
/// extension (`res.extensions().get::<Delivery>()`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    attempts: u32,
    replayed: bool,
    key: Option<String>,
}

impl Delivery {
    /// How many times the request was sent, this one included (1: no retry).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the server replayed a stored response (`Idempotent-Replayed: true`): an
    /// earlier attempt, or an earlier request with the key, ran.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// The request's `Idempotency-Key`: minted or the caller's; `None` for a method that is
    /// not keyed.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

/// The request failed after retries: the error of [`reqwest_middleware::Error::Middleware`],
/// over the last attempt's [`reqwest::Error`].
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # fn check(err: reqwest_middleware::Error) {
/// if let reqwest_middleware::Error::Middleware(e) = &err {
///     if let Some(gave_up) = e.downcast_ref::<idem::client::GaveUp>() {
///         eprintln!("{} attempts under key {:?}", gave_up.attempts(), gave_up.key());
///     }
///     let last: Option<&reqwest::Error> = e.downcast_ref();
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    attempts: u32,
    elapsed: Duration,
    key: Option<String>,
}

impl GaveUp {
    /// How many times the request was sent.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The time from the first attempt to the last one's failure.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The request's `Idempotency-Key`, if it had one: a later retry by hand should send it
    /// again, since any attempt may have run.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempts in {:.1?}",
            self.attempts, self.elapsed
        )?;
        if let Some(key) = &self.key {
            write!(f, " (Idempotency-Key {key})")?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = self.key_of(&mut req);
        if let Some(timeout) = self.attempt_timeout {
            req.timeout_mut().get_or_insert(timeout);
        }
        let retryable = key.is_some() || idempotent_method(req.method());
        let start = Instant::now();
        let mut attempts = 0u32;
        let mut failures = 0u32;
        loop {
            attempts += 1;
            // a copy goes and the original stays for the next attempt; a body that cannot
            // be copied (a stream) goes once
            let Some(copy) = retryable.then(|| req.try_clone()).flatten() else {
                let answer = next.run(req, extensions).await;
                return finish(answer, attempts, start, key);
            };
            let answer = next.clone().run(copy, extensions).await;
            let wait = match retry_of(&answer) {
                Some(Retry::Failed(after)) => {
                    failures += 1;
                    (failures < self.max_attempts).then(|| self.backoff.delay(failures, after))
                }
                Some(Retry::InFlight(after)) => Some(self.backoff.in_flight(after)),
                None => None,
            }
            .filter(|wait| start.elapsed() + *wait <= self.max_elapsed);
            let Some(wait) = wait else {
                return finish(answer, attempts, start, key);
            };
            tracing::debug!(
                attempt = attempts,
                key = key.as_deref(),
                status = answer.as_ref().ok().map(|r| r.status().as_u16()),
                error = answer.as_ref().err().map(tracing::field::display),
                ?wait,
                "retrying the request"
            );
            // the answer's connection goes back (or away) before the wait
            drop(answer);
            tokio::time::sleep(wait).await;
        }
    }
}

/// The answer to return: a response with its [`Delivery`], an error as is after one attempt
/// or under a [`GaveUp`] after several.
fn finish(
    answer: reqwest_middleware::Result<Response>,
    attempts: u32,
    start: Instant,
    key: Option<String>,
) -> reqwest_middleware::Result<Response> {
    match answer {
        Ok(mut res) => {
            let replayed = res
                .headers()
                .get(IDEMPOTENT_REPLAYED)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
            res.extensions_mut().insert(Delivery {
                attempts,
                replayed,
                key,
            });
            Ok(res)
        }
        Err(reqwest_middleware::Error::Reqwest(e)) if attempts > 1 => {
            let gave_up = GaveUp {
                attempts,
                elapsed: start.elapsed(),
                key,
            };
            Err(reqwest_middleware::Error::Middleware(
                anyhow::Error::new(e).context(gave_up),
            ))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_are_uuid_v4_and_distinct() {
        let keys: std::collections::HashSet<String> =
            (0..1000).map(|_| mint_key().unwrap()).collect();
        assert_eq!(keys.len(), 1000);
        for key in &keys {
            let uuid = uuid::Uuid::parse_str(key).unwrap();
            assert_eq!(uuid.get_version_num(), 4, "{key}");
            assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{key}");
            assert_eq!(key.len(), 36);
        }
    }

    fn request(method: Method) -> Request {
        Request::new(method, "http://127.0.0.1:9/x".parse().unwrap())
    }

    #[test]
    fn keyed_methods_get_a_key_and_a_callers_key_is_kept() {
        let m = IdempotencyMiddleware::new();
        let mut post = request(Method::POST);
        let key = m.key_of(&mut post).unwrap();
        assert_eq!(post.headers()[IDEMPOTENCY_KEY], key.as_str());

        let mut get = request(Method::GET);
        assert_eq!(m.key_of(&mut get), None);
        assert!(!get.headers().contains_key(IDEMPOTENCY_KEY));

        let mut own = request(Method::PATCH);
        own.headers_mut()
            .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"order-17\""));
        assert_eq!(m.key_of(&mut own).as_deref(), Some("\"order-17\""));
        assert_eq!(own.headers().get_all(IDEMPOTENCY_KEY).iter().count(), 1);

        // a key the caller set on a method that is not keyed is kept too
        let mut put = request(Method::PUT);
        put.headers_mut()
            .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("p-1"));
        assert_eq!(m.key_of(&mut put).as_deref(), Some("p-1"));

        let only_put = IdempotencyMiddleware::new().methods([Method::PUT]);
        let mut post = request(Method::POST);
        assert_eq!(only_put.key_of(&mut post), None);
        let mut put = request(Method::PUT);
        assert!(only_put.key_of(&mut put).is_some());
    }

    #[test]
    fn only_rfc_idempotent_methods_are_idempotent() {
        for m in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
            assert!(idempotent_method(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!idempotent_method(&m), "{m}");
        }
    }

    #[test]
    fn statuses_retried_and_why() {
        let s = |code| StatusCode::from_u16(code).unwrap();
        let one = Some(Duration::from_secs(1));
        assert_eq!(
            retry_of_status(s(409), one),
            Some(Retry::InFlight(Duration::from_secs(1)))
        );
        assert_eq!(retry_of_status(s(409), None), None);
        assert_eq!(retry_of_status(s(429), one), Some(Retry::Failed(one)));
        assert_eq!(retry_of_status(s(429), None), Some(Retry::Failed(None)));
        for code in [500, 502, 503, 504, 599] {
            assert_eq!(
                retry_of_status(s(code), None),
                Some(Retry::Failed(None)),
                "{code}"
            );
        }
        for code in [200, 201, 204, 302, 304, 400, 401, 403, 404, 410, 413, 422] {
            assert_eq!(retry_of_status(s(code), one), None, "{code}");
        }
    }

    #[test]
    fn max_attempts_is_at_least_one() {
        assert_eq!(IdempotencyMiddleware::new().max_attempts(0).max_attempts, 1);
    }

    #[test]
    fn gave_up_names_the_attempts_and_the_key() {
        let g = GaveUp {
            attempts: 3,
            elapsed: Duration::from_millis(1500),
            key: Some("k-1".into()),
        };
        assert_eq!(
            g.to_string(),
            "gave up after 3 attempts in 1.5s (Idempotency-Key k-1)"
        );
    }

    #[cfg(feature = "http")]
    #[test]
    fn the_header_names_are_the_layers() {
        assert_eq!(
            IDEMPOTENCY_KEY.as_str(),
            crate::http::IDEMPOTENCY_KEY.as_str()
        );
        assert_eq!(
            IDEMPOTENT_REPLAYED.as_str(),
            crate::http::IDEMPOTENT_REPLAYED.as_str()
        );
    }
}
