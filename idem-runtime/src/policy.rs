//! Policy: default TTL, lease and wait, and what an `Err` from the body does to its key.

use crate::codec;
use crate::error::Error;
use serde::{de::DeserializeOwned, Serialize};
use std::time::Duration;

/// What an `Err` returned by the body does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Free the key, so that the next call with it runs the body again (an honest retry).
    Release,
    /// Store the error and replay it like an `Ok`, for errors known to be final.
    Keep,
}

/// What a call does when it takes over an abandoned attempt (one whose lease lapsed before it
/// stored a result or released its key: its effect may or may not have happened) and has no
/// `reconcile` to find out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnAbandoned {
    /// Run the body again (the default): right when the effect is itself idempotent
    /// downstream (the key passed on with [`crate::current_key`]) or harmless to repeat.
    #[default]
    Rerun,
    /// Run nothing: this call and every later one with the key get
    /// [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) until an operator resolves it
    /// ([`crate::Idem::resolve`], `idem resolve`). A parked key is kept until then.
    Park,
}

/// Decides, per error, between [`OnError::Release`] and [`OnError::Keep`], and stores kept
/// errors. Implemented by [`ReleaseErrors`], [`KeepErrors`] and [`DecideErrors`].
pub trait ErrorPolicy<E>: Send {
    /// What to do with this error.
    fn on_error(&self, error: &E) -> OnError;
    /// Encodes an error that is kept.
    fn encode(&self, error: &E) -> Result<Vec<u8>, Error>;
    /// Decodes a stored error.
    fn decode(&self, json: &[u8]) -> Result<E, Error>;
}

/// The default: every `Err` releases its key. Needs nothing of `E`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReleaseErrors;

/// Every `Err` is stored and replayed. Needs `E: Serialize + DeserializeOwned`.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeepErrors;

/// A function decides per error.
#[derive(Debug, Clone, Copy)]
pub struct DecideErrors<F>(pub F);

fn no_stored_errors<E>() -> Error {
    Error::Codec(crate::error::CodecError {
        kind: crate::error::CodecErrorKind::TypeChanged,
        type_name: std::any::type_name::<E>(),
        message: "the record holds a kept error, but this call releases errors \
                  (on_error = release) and cannot decode one"
            .into(),
    })
}

impl<E> ErrorPolicy<E> for ReleaseErrors {
    fn on_error(&self, _: &E) -> OnError {
        OnError::Release
    }
    fn encode(&self, _: &E) -> Result<Vec<u8>, Error> {
        Err(no_stored_errors::<E>())
    }
    fn decode(&self, _: &[u8]) -> Result<E, Error> {
        Err(no_stored_errors::<E>())
    }
}

impl<E: Serialize + DeserializeOwned> ErrorPolicy<E> for KeepErrors {
    fn on_error(&self, _: &E) -> OnError {
        OnError::Keep
    }
    fn encode(&self, error: &E) -> Result<Vec<u8>, Error> {
        codec::encode_err(error)
    }
    fn decode(&self, json: &[u8]) -> Result<E, Error> {
        codec::decode(json)
    }
}

impl<E, F> ErrorPolicy<E> for DecideErrors<F>
where
    E: Serialize + DeserializeOwned,
    F: Fn(&E) -> OnError + Send,
{
    fn on_error(&self, error: &E) -> OnError {
        (self.0)(error)
    }
    fn encode(&self, error: &E) -> Result<Vec<u8>, Error> {
        codec::encode_err(error)
    }
    fn decode(&self, json: &[u8]) -> Result<E, Error> {
        codec::decode(json)
    }
}

/// The defaults of a handle, used where a call does not set its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// How long a finished result is kept and replayed (default 24 h).
    pub ttl: Duration,
    /// How long a claim lives without renewal (default 30 s).
    pub lease: Duration,
    /// How long a duplicate waits for the attempt in flight (default: not at all).
    pub wait: Option<Duration>,
    /// How long a key's digest and fingerprint are kept after its result expires, so that a
    /// late repeat gets `Error::Expired` instead of running again (default: none, the key is
    /// free again after `ttl`).
    pub tombstone: Option<Duration>,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            wait: None,
            tombstone: None,
        }
    }
}

/// Parses a duration such as `"30s"`, `"5m"`, `"24h"`, `"40d"` or `"250ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| Error::Config(format!("duration `{s}` has no unit (s, m, h, d, ms)")))?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| Error::Config(format!("duration `{s}` does not start with a number")))?;
    let secs = |mul: u64| {
        n.checked_mul(mul)
            .map(Duration::from_secs)
            .ok_or_else(|| Error::Config(format!("duration `{s}` is too large")))
    };
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86400),
        _ => Err(Error::Config(format!(
            "duration `{s}` has an unknown unit `{unit}`: use ms, s, m, h or d"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(
            parse_duration("40d").unwrap(),
            Duration::from_secs(40 * 86400)
        );
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("5y").is_err());
    }
}
