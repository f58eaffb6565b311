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

/// What `#[idempotent(transaction = tx)]` expands to (feature `postgres`). The module's name is
/// what a build without the feature reports: "could not find
/// `transaction_needs_the_postgres_feature` in `__private`".
#[cfg(feature = "postgres")]
pub mod transaction_needs_the_postgres_feature {
    use super::{FromIdemError, StoredValue};
    use crate::codec::{self, Stored};
    use crate::error::Error;
    use crate::handle::Idem;
    use crate::policy::ErrorPolicy;
    use crate::store::postgres::{StoredResult, TxCall, TxClaim, TxStep};
    use serde::Serialize;
    use sqlx::{PgConnection, Postgres, Transaction};
    use std::borrow::Cow;
    use std::future::Future;
    use std::time::Duration;

    /// A transactional call being set up: the same builder methods as [`super::CallBuilder`],
    /// on the handle given by `store = …` or the installed one.
    #[must_use]
    pub struct TxBuilder {
        idem: Option<Idem>,
        call: TxCall,
        ttl: Option<Duration>,
        lease: Option<Duration>,
    }

    impl TxBuilder {
        /// On `idem`.
        pub fn new(idem: &Idem, name: impl Into<Cow<'static, str>>) -> TxBuilder {
            TxBuilder::on(Some(idem.clone()), name.into())
        }

        /// On the installed handle.
        pub fn installed(name: impl Into<Cow<'static, str>>) -> TxBuilder {
            TxBuilder::on(None, name.into())
        }

        fn on(idem: Option<Idem>, name: Cow<'static, str>) -> TxBuilder {
            TxBuilder {
                idem,
                call: TxCall::new(name),
                ttl: None,
                lease: None,
            }
        }

        /// The key.
        pub fn key<K: Serialize + ?Sized>(mut self, key: &K) -> Self {
            self.call = self.call.key(key);
            self
        }

        /// The scope.
        pub fn scope<S: Serialize + ?Sized>(mut self, scope: &S) -> Self {
            self.call = self.call.scope(scope);
            self
        }

        /// The fingerprint.
        pub fn fingerprint<F: Serialize + ?Sized>(mut self, fingerprint: &F) -> Self {
            self.call = self.call.fingerprint(fingerprint);
            self
        }

        /// How long the committed result is kept (default: the handle's).
        pub fn ttl(mut self, ttl: Duration) -> Self {
            self.ttl = Some(ttl);
            self
        }

        /// How long a claim committed without its result lives (default: the handle's).
        pub fn lease(mut self, lease: Duration) -> Self {
            self.lease = Some(lease);
            self
        }
    }

    /// The argument named by `transaction = …`.
    #[diagnostic::on_unimplemented(
        message = "`transaction = …` names an argument of type `&mut {Self}`, which is not a PostgreSQL transaction",
        label = "the claim and the result are written on this argument's transaction",
        note = "the argument must be a `&mut sqlx::Transaction<'_, sqlx::Postgres>` (or a `&mut sqlx::PgConnection` inside a transaction)"
    )]
    pub trait TxConnection {
        /// The connection the transaction runs on.
        fn __idem_conn(&mut self) -> &mut PgConnection;
    }
    impl TxConnection for Transaction<'_, Postgres> {
        fn __idem_conn(&mut self) -> &mut PgConnection {
            self
        }
    }
    impl TxConnection for PgConnection {
        fn __idem_conn(&mut self) -> &mut PgConnection {
            self
        }
    }

    /// The connection of the `transaction = …` argument, reborrowed for one statement.
    #[inline(always)]
    pub fn conn<C: TxConnection + ?Sized>(c: &mut C) -> &mut PgConnection {
        c.__idem_conn()
    }

    /// What the claim found: run the body, or return without running it.
    pub enum Step<T, E> {
        /// This transaction holds the key.
        Run(TxClaim),
        /// A committed result (replayed), or an idempotency failure.
        Done(Result<T, E>),
    }

    /// Claims the key on `conn`, with the handle's PostgreSQL store.
    pub async fn claim<T, E, P>(call: TxBuilder, conn: &mut PgConnection, policy: &P) -> Step<T, E>
    where
        T: StoredValue,
        E: FromIdemError,
        P: ErrorPolicy<E>,
    {
        match try_claim(call, conn).await {
            Ok(TxStep::Run(claim)) => Step::Run(claim),
            Ok(TxStep::Replay(stored)) => Step::Done(replay(&stored, policy)),
            Err(e) => Step::Done(Err(E::from_idem(e))),
        }
    }

    async fn try_claim(call: TxBuilder, conn: &mut PgConnection) -> Result<TxStep, Error> {
        let TxBuilder {
            idem,
            call,
            ttl,
            lease,
        } = call;
        let idem = match idem {
            Some(idem) => idem,
            None => Idem::installed().ok_or_else(crate::call::not_installed)?,
        };
        let Some(store) = idem.store().as_postgres() else {
            return Err(Error::Config(format!(
                "#[idempotent(transaction = …)] needs a PostgreSQL store; this handle's store \
                 is `{}`",
                idem.store().backend()
            )));
        };
        let defaults = *idem.defaults();
        call.ttl(ttl.unwrap_or(defaults.ttl))
            .lease(lease.unwrap_or(defaults.lease))
            .claim(store, conn)
            .await
    }

    fn replay<T: StoredValue, E: FromIdemError, P: ErrorPolicy<E>>(
        stored: &StoredResult,
        policy: &P,
    ) -> Result<T, E> {
        let decoded = codec::split::<T>(stored.as_bytes()).and_then(|s| match s {
            Stored::Ok(json) => codec::decode(json).map(Ok),
            Stored::Err(json) => policy.decode(json).map(Err),
        });
        decoded.unwrap_or_else(|e| Err(E::from_idem(e)))
    }

    /// Runs `body` as the claim's body (so `current_key` answers in it).
    pub fn scope<'a, F: Future + 'a>(
        claim: &'a TxClaim,
        body: F,
    ) -> impl Future<Output = F::Output> + 'a {
        claim.scope(body)
    }

    /// Stores the body's result on `conn` (or releases the key), and returns it.
    pub fn finish<'a, T, E, P>(
        claim: TxClaim,
        conn: &'a mut PgConnection,
        policy: &'a P,
        result: Result<T, E>,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        T: StoredValue + 'a,
        E: FromIdemError + 'a,
        P: ErrorPolicy<E>,
    {
        claim.finish_with(conn, policy, result, E::from_idem)
    }
}
