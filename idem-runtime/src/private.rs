//! What `#[idempotent]` expansions call. Not public API: semver-exempt, may change in any release.

use crate::call::{Call, Outcome};
use crate::error::Error;
use crate::policy::ErrorPolicy;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::time::Duration;

pub use crate::call::Call as CallBuilder;
pub use crate::handle::Idem;
pub use crate::policy::{DecideErrors, KeepErrors, OnError, ReleaseErrors};

/// Part of a default key or fingerprint: an argument of the function, which must be
/// `Serialize` unless it is named in `skip(...)`.
#[diagnostic::on_unimplemented(
    message = "argument of type `{Self}` is part of the idempotency key, but it is not `Serialize`",
    label = "this argument is in the default key and fingerprint",
    note = "add it to `skip(...)` in #[idempotent(...)] if it is a client, a pool or a context; \
            or derive `serde::Serialize` for it; or set `key = …` and `fingerprint = …` yourself"
)]
pub trait KeyPart {}
impl<T: Serialize + ?Sized> KeyPart for T {}

/// Checks one argument of the default key; the span of the call is the argument's.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(v: &T) -> &T {
    v
}

/// The error type of an `#[idempotent]` function: it must carry idempotency failures.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of an #[idempotent] function cannot carry an `idem::Error`",
    label = "idempotency failures (in progress, mismatch, store errors) must convert into this type",
    note = "implement `From<idem::Error>` for `{Self}`"
)]
pub trait FromIdemError {
    /// Converts an idempotency failure.
    fn from_idem(e: Error) -> Self;
}
impl<E: From<Error>> FromIdemError for E {
    fn from_idem(e: Error) -> Self {
        E::from(e)
    }
}

/// Runs an expanded function's body.
pub fn run<T, E, P, Fut>(call: Call, policy: P, body: Fut) -> impl Future<Output = Result<T, E>>
where
    T: Serialize + DeserializeOwned,
    E: FromIdemError,
    P: ErrorPolicy<E>,
    Fut: Future<Output = Result<T, E>>,
{
    let call = call.execute(policy, E::from_idem, body);
    async move { call.await.map(Outcome::into_inner) }
}

/// A `Duration` from a value the attribute accepted (a literal converted at compile time, or
/// a user's `Duration` expression).
#[inline(always)]
pub fn duration(d: Duration) -> Duration {
    d
}

/// A decision function for `on_error = path`.
pub fn decide<E, F: Fn(&E) -> OnError + Send>(f: F) -> DecideErrors<F> {
    DecideErrors(f)
}
