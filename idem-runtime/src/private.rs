//! What `#[idempotent]` expansions call. Not public API: semver-exempt, may change in any release.

// The expansion's plumbing is never printed; a `Debug` bound on it would only constrain the
// user's types.
#![allow(missing_debug_implementations)]

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

/// Checks one argument of the default key; the span of the call is the argument's, so an
/// argument that is not `Serialize` is reported there, with [`KeyPart`]'s message.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(v: &T) -> &T {
    v
}

/// One argument of the default key, as the key tuple holds it:
/// `(&Arg(&a)).__idem_part()` is `&a` when `a` is `Serialize` ([`SerializeArg`]), and a
/// placeholder otherwise ([`OtherArg`], autoref specialization). The placeholder keeps the tuple
/// `Serialize`, so the only error is the one [`key_part`] reports at the argument.
pub struct Arg<'a, T: ?Sized>(pub &'a T);

/// See [`Arg`].
pub trait SerializeArg<'a, T: ?Sized> {
    /// The argument.
    fn __idem_part(&self) -> &'a T;
}
impl<'a, T: Serialize + ?Sized> SerializeArg<'a, T> for Arg<'a, T> {
    #[inline(always)]
    fn __idem_part(&self) -> &'a T {
        self.0
    }
}

/// See [`Arg`].
pub trait OtherArg {
    /// A placeholder: the argument is not `Serialize`, which [`key_part`] reports.
    fn __idem_part(&self) -> NotSerialize;
}
impl<T: ?Sized> OtherArg for &Arg<'_, T> {
    fn __idem_part(&self) -> NotSerialize {
        NotSerialize
    }
}

/// The placeholder of an argument that is not `Serialize` (a compile error already).
pub struct NotSerialize;
impl Serialize for NotSerialize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
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

/// The `Ok` type of an `#[idempotent]` function: it is stored, and replayed on a repeat.
#[diagnostic::on_unimplemented(
    message = "the `Ok` type `{Self}` of an #[idempotent] function must be `Serialize` and `DeserializeOwned`",
    label = "the `Ok` value is stored and replayed on a repeat call",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, or return a type that is (an id, a DTO)"
)]
pub trait StoredValue: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> StoredValue for T {}

/// Runs an expanded function's body.
pub fn run<T, E, P, Fut>(call: Call, policy: P, body: Fut) -> impl Future<Output = Result<T, E>>
where
    T: StoredValue,
    E: FromIdemError,
    P: ErrorPolicy<E>,
    Fut: Future<Output = Result<T, E>>,
{
    let call = call.execute(policy, body, E::from_idem);
    async move { call.await.map(Outcome::into_inner) }
}

/// `reconcile = …`: marks the call as one whose body starts with [`reconcile`].
pub fn reconciling(call: Call) -> Call {
    call.reconciled()
}

/// The start of a body with `reconcile = …`: on a takeover of an abandoned attempt, runs the
/// reconcile; `Some(result)` is the call's result without running the body.
pub fn reconcile<T, E, F>(reconcile: F) -> impl Future<Output = Option<Result<T, E>>>
where
    F: Future<Output = Result<Option<T>, E>>,
{
    crate::call::reconcile(reconcile)
}

/// What `reconcile = …` must produce: `Result<Option<T>, E>` with the function's `T` and `E`.
#[diagnostic::on_unimplemented(
    message = "`reconcile = …` must be a future of `Result<Option<T>, E>` (the function's `Ok` and error types), not of `{Self}`",
    label = "this reconcile's output",
    note = "return `Ok(Some(value))` when the earlier attempt's effect happened (its result), `Ok(None)` when it did not (the body runs), `Err(e)` when you cannot tell yet"
)]
pub trait ReconcileOutput<T, E> {
    /// The reconcile's answer.
    fn into_found(self) -> Result<Option<T>, E>;
}
impl<T, E> ReconcileOutput<T, E> for Result<Option<T>, E> {
    fn into_found(self) -> Result<Option<T>, E> {
        self
    }
}

/// Checks a reconcile's output type at its span (see [`ReconcileOutput`]).
#[inline(always)]
pub fn reconcile_output<T, E>(out: impl ReconcileOutput<T, E>) -> Result<Option<T>, E> {
    out.into_found()
}

/// `on_abandoned = park`.
pub fn park(call: Call) -> Call {
    call.on_abandoned(crate::policy::OnAbandoned::Park)
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

/// What `#[idempotent(transaction = tx)]` expands to (features `postgres`, `mysql`): the
/// engine's two phases around a body that uses the transaction itself (`Call::in_transaction`
/// takes a closure instead). The module's name is what a build without either feature
/// reports: "could not find `transaction_needs_the_postgres_or_mysql_feature` in `__private`".
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod transaction_needs_the_postgres_or_mysql_feature {
    use super::{FromIdemError, StoredValue};
    use crate::call::Outcome;
    use crate::policy::ErrorPolicy;
    use crate::transaction::{TxAttempt, TxBegun};
    use std::future::Future;

    pub use crate::transaction::InTransaction as TxConnection;

    /// The connection of the `transaction = …` argument, reborrowed for one statement.
    #[inline(always)]
    pub fn conn<C: TxConnection + ?Sized>(c: &mut C) -> &mut C::Connection {
        c.__idem_connection()
    }

    /// The claimed attempt: run the body in [`scope`], then [`finish`].
    pub struct Claim(Box<TxAttempt>);

    /// What the claim found: run the body, or return without running it.
    pub enum Step<T, E> {
        /// This transaction holds the key.
        Run(Claim),
        /// A committed result (replayed), or an idempotency failure.
        Done(Result<T, E>),
    }

    /// Claims the key on `conn`, with the handle's store (of the transaction's database).
    pub async fn claim<T, E, P>(
        call: crate::call::Call,
        conn: &mut (impl TxConnection + ?Sized),
        policy: &P,
    ) -> Step<T, E>
    where
        T: StoredValue,
        E: FromIdemError,
        P: ErrorPolicy<E>,
    {
        match TxAttempt::claim(call, conn, policy, E::from_idem).await {
            TxBegun::Run(attempt) => Step::Run(Claim(attempt)),
            TxBegun::Done(done) => Step::Done(done.map(Outcome::into_inner)),
        }
    }

    /// Runs `body` as the claim's body (so `current_key` answers in it).
    pub fn scope<'a, F: Future + 'a>(
        claim: &'a Claim,
        body: F,
    ) -> impl Future<Output = F::Output> + 'a {
        claim.0.scope(body)
    }

    /// Stores the body's result on `conn` (or releases the key), and returns it.
    pub async fn finish<T, E, P>(
        claim: Claim,
        conn: &mut (impl TxConnection + ?Sized),
        policy: &P,
        result: Result<T, E>,
    ) -> Result<T, E>
    where
        T: StoredValue,
        E: FromIdemError,
        P: ErrorPolicy<E>,
    {
        claim
            .0
            .finish(conn, result, policy, E::from_idem)
            .await
            .map(Outcome::into_inner)
    }
}

/// `#[idempotent(resume)]`: what the expansion registers and calls (see [`crate::resume`]).
pub mod resume {
    use crate::call::Call;
    use crate::error::Error;
    use serde::{de::DeserializeOwned, Serialize};

    pub use crate::resume::{Need, Provided, Resumable, Resumed};
    pub use crate::store::BoxFuture;
    pub use inventory;

    /// Keeps the call's arguments (but the skipped ones) with its claim.
    pub fn resumable<A: Serialize + ?Sized>(call: Call, args: &A) -> Call {
        call.resumable(args)
    }

    /// What a resumable function's stored argument must be to be stored.
    #[diagnostic::on_unimplemented(
        message = "argument of type `{Self}` is stored for `resume`, but it is not `Serialize`",
        label = "a resumable function's arguments are stored with the claim",
        note = "derive `serde::Serialize` (and `Deserialize`) for it, or add it to `skip(...)` and give the resumer one with `.provide(value)`"
    )]
    pub trait StoredOut {}
    impl<T: Serialize + ?Sized> StoredOut for T {}

    /// Checks one stored argument at its span (see [`StoredOut`]).
    #[inline(always)]
    pub fn stored<T: StoredOut + ?Sized>(v: &T) -> &T {
        v
    }

    /// A stored argument of a resumable function: it is kept with the claim and decoded again
    /// when a resumer calls the function.
    #[diagnostic::on_unimplemented(
        message = "argument of type `{Self}` is stored for `resume`, but it cannot be decoded again (it is not `DeserializeOwned`)",
        label = "a resumable function's arguments are stored with the claim and decoded by the resumer",
        note = "derive `serde::Deserialize` for it (a reference argument `&T` is decoded as `T::Owned`), or add it to `skip(...)` and give the resumer one with `.provide(value)`"
    )]
    pub trait StoredArg: DeserializeOwned {}
    impl<T: DeserializeOwned> StoredArg for T {}

    /// A skipped argument of a resumable function, which the application provides to the
    /// resumer by type.
    #[diagnostic::on_unimplemented(
        message = "a resumable function's skipped argument of type `{Self}` cannot be provided to the resumer",
        label = "skipped arguments of a `resume` function are provided by type: `Resumer::provide(value)`",
        note = "the provided type must be `Clone + Send + Sync + 'static` (take `&T` to borrow it instead of a clone)"
    )]
    pub trait ProvidedArg: Clone + Send + Sync + 'static {}
    impl<T: Clone + Send + Sync + 'static> ProvidedArg for T {}

    /// A skipped argument taken by reference (`&T`): the provided `T`.
    #[diagnostic::on_unimplemented(
        message = "a resumable function's skipped argument of type `&{Self}` cannot be provided to the resumer",
        label = "skipped arguments of a `resume` function are provided by type: `Resumer::provide(value)`",
        note = "the provided type must be `Send + Sync + 'static`"
    )]
    pub trait ProvidedRef: Send + Sync + 'static {}
    impl<T: Send + Sync + 'static> ProvidedRef for T {}

    /// The need of a provided `T`.
    pub fn need<T: Send + Sync + 'static>() -> Need {
        Need::of::<T>()
    }

    /// The provided value of a skipped `T` argument (a clone).
    pub fn provided<T: ProvidedArg>(p: &Provided) -> Result<T, &'static str> {
        p.get::<T>().cloned().ok_or(std::any::type_name::<T>())
    }

    /// The provided value of a skipped `&T` argument.
    pub fn provided_ref<T: ProvidedRef>(p: &Provided) -> Result<&T, &'static str> {
        p.get::<T>().ok_or(std::any::type_name::<T>())
    }

    /// The stored arguments, decoded one at a time (each into its own type, so that a type
    /// that does not fit is reported alone).
    pub struct Args(std::vec::IntoIter<serde_json::Value>);

    impl Args {
        /// The stored (opened) arguments of a call.
        pub fn open(plain: &[u8]) -> Result<Args, Error> {
            // A function without stored arguments stores `()`, which is `null`.
            let values: Option<Vec<serde_json::Value>> = crate::codec::decode_args(plain)?;
            Ok(Args(values.unwrap_or_default().into_iter()))
        }

        /// The next argument, as a `T`.
        pub fn take<T: StoredArg>(&mut self) -> Result<T, Error> {
            let value = self.0.next().ok_or_else(|| {
                Error::codec(
                    crate::CodecErrorKind::TypeChanged,
                    std::any::type_name::<T>(),
                    "fewer arguments stored than the function takes (its signature changed)".into(),
                )
            })?;
            serde_json::from_value(value).map_err(|e| {
                Error::codec(
                    crate::CodecErrorKind::TypeChanged,
                    std::any::type_name::<T>(),
                    e.to_string(),
                )
            })
        }

        /// After the last argument: `Ok` when none is left over.
        pub fn end(self) -> Result<(), Error> {
            if self.0.len() == 0 {
                Ok(())
            } else {
                Err(Error::codec(
                    crate::CodecErrorKind::TypeChanged,
                    "the arguments of a resumable call",
                    "more arguments stored than the function takes (its signature changed)".into(),
                ))
            }
        }
    }

    /// An error of a resumed function, described: its `Debug` text when it has one
    /// ([`DebugError`]), its type's name otherwise ([`OtherError`], autoref specialization).
    pub struct Describe<'a, E>(pub &'a E);

    /// See [`Describe`].
    pub trait DebugError {
        /// The error's `Debug` text.
        fn __idem_describe(&self) -> String;
    }
    impl<E: std::fmt::Debug> DebugError for Describe<'_, E> {
        fn __idem_describe(&self) -> String {
            format!("{:?}", self.0)
        }
    }

    /// See [`Describe`].
    pub trait OtherError {
        /// The error's type name.
        fn __idem_describe(&self) -> String;
    }
    impl<E> OtherError for &Describe<'_, E> {
        fn __idem_describe(&self) -> String {
            format!("an error of type {}", std::any::type_name::<E>())
        }
    }
}
