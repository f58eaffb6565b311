//! Abandoned attempts: what a call does when its claim took over one (an attempt whose lease
//! lapsed before it stored a result or released its key), and an operator's verdict on a key
//! parked for that reason.
//!
//! A takeover is decided, never guessed: a reconcile finds out whether the earlier effect
//! happened (its value is then stored, fenced like a body's result; or the body runs; or,
//! undecided, the key is left abandoned for the next call to reconcile again); without one the
//! function's [`OnAbandoned`] reruns the body or parks the key until an operator resolves it.

use super::resuming::{self, AfterFailure};
use super::{Call, Failed, Outcome, Prepared, Ran};
use crate::codec;
use crate::context::{self, Reconciled, Recovery, CURRENT};
use crate::error::Error;
use crate::handle::Idem;
use crate::lease::Held;
use crate::observe::{Ended, Obs};
use crate::policy::{ErrorPolicy, OnAbandoned, OnError, ReleaseErrors};
use crate::store::{Executor, Resolve, Resolved, Status, Takeover};
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::sync::atomic::AtomicU8;

impl Prepared {
    /// The claim took over an abandoned attempt: park the key (`on_abandoned = park`, no
    /// reconcile), or go on with the attempt's [`Recovery`].
    pub(crate) async fn take_over<E>(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        takeover: Takeover,
    ) -> Result<Option<Recovery>, Failed<E>> {
        if self.on_abandoned == OnAbandoned::Park && !self.reconciles {
            obs.takeover("parked");
            let parked = obs.store("park", exec.park(&self.key, token)).await?;
            if !parked {
                // Another attempt took the key over meanwhile (this one stalled past its lease).
                return Err(self.lease_lost(token).into());
            }
            super::resuming::note_parked(&self.key);
            return Err(self.outcome_unknown().into());
        }
        Ok(Some(Recovery::new(takeover.attempt, takeover.abandoned_at)))
    }

    /// After the body of an attempt that holds the key: what its reconcile decided, then
    /// [`Prepared::finish`] — except for an undecided reconcile, whose error is returned and
    /// whose key is left abandoned (not released), for the next call to reconcile again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn settle<T, E, P>(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        policy: &P,
        result: Result<T, E>,
        recovery: Option<Recovery>,
        reconciled: &AtomicU8,
    ) -> Ran<T, E>
    where
        T: Serialize,
        P: ErrorPolicy<E>,
    {
        match (context::reconciled(reconciled), result) {
            (Reconciled::Undecided, Err(e)) => {
                obs.takeover("undecided");
                let step = obs.store("abandon", exec.abandon(&self.key, token));
                let abandoned = match held {
                    Some(held) => held.bound(step).await,
                    None => Some(step.await),
                };
                if !matches!(abandoned, Some(Ok(true))) {
                    // The key lapses after its lease anyway, as abandoned.
                    tracing::debug!(idem.name = &*self.name, "idem: an undecided reconcile could not end the claim at once; it lapses after its lease");
                }
                obs.done(Ended::Undecided);
                Err(Failed::Body(e))
            }
            (_, Err(e)) if self.resumed_failure(&e, policy, recovery).is_some() => {
                let after = self.resumed_failure(&e, policy, recovery);
                self.leave_failed(exec, obs, token, held, after).await;
                Err(Failed::Body(e))
            }
            (decided, result) => {
                if decided == Reconciled::Applied {
                    obs.takeover("adopted");
                } else if recovery.is_some() {
                    obs.takeover("rerun");
                }
                self.finish(exec, obs, token, held, policy, result).await
            }
        }
    }

    /// For a resumed call's `Err` that the policy would release: what it leaves instead
    /// (abandoned for the resumer's next try, or parked when its retry budget is spent).
    fn resumed_failure<E, P: ErrorPolicy<E>>(
        &self,
        e: &E,
        policy: &P,
        recovery: Option<Recovery>,
    ) -> Option<AfterFailure> {
        if policy.on_error(e) != OnError::Release {
            return None;
        }
        resuming::after_failure(&self.key, recovery.map_or(1, |r| r.attempt()))
    }

    /// Leaves a failed resumed attempt's key abandoned or parked, as `after` says.
    async fn leave_failed(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        after: Option<AfterFailure>,
    ) {
        let (op, ended) = match after {
            Some(AfterFailure::Park) => ("park", Ended::Parked),
            _ => ("abandon", Ended::Undecided),
        };
        let step = match after {
            Some(AfterFailure::Park) => obs.store(op, exec.park(&self.key, token)),
            _ => obs.store(op, exec.abandon(&self.key, token)),
        };
        let left = match held {
            Some(held) => held.bound(step).await,
            None => Some(step.await),
        };
        if !matches!(left, Some(Ok(true))) {
            // The claim lapses after its lease anyway, as abandoned: the resumer tries again.
            tracing::debug!(idem.name = &*self.name, op, "idem: a failed resumed attempt could not leave its key at once; it lapses after its lease");
        }
        obs.done(ended);
    }

    pub(super) fn outcome_unknown(&self) -> Error {
        Error::OutcomeUnknown {
            name: self.name.to_string(),
            key: self.key.to_hex(),
        }
    }

    pub(super) fn lease_lost(&self, token: u64) -> Error {
        Error::LeaseLost {
            name: self.name.to_string(),
            key: self.key.to_hex(),
            token,
        }
    }
}

/// What a reconcile found, as the body sees it: `None` when there is nothing to reconcile (a
/// first attempt) or the earlier effect did not happen, so the body runs; `Some(result)` for
/// the call's result without running the body: `Ok(v)`, the earlier effect's value, stored as
/// the body's would be; `Err(e)`, undecided, returned with the key left abandoned.
pub(crate) async fn reconcile<T, E, F>(reconcile: F) -> Option<Result<T, E>>
where
    F: Future<Output = Result<Option<T>, E>>,
{
    let taking_over = CURRENT.try_with(|c| c.recovery.is_some()).unwrap_or(false);
    if !taking_over {
        return None;
    }
    let (found, decided) = match reconcile.await {
        Ok(Some(v)) => (Some(Ok(v)), Reconciled::Applied),
        Ok(None) => (None, Reconciled::No),
        Err(e) => (Some(Err(e)), Reconciled::Undecided),
    };
    let _ = CURRENT.try_with(|c| c.reconciled(decided));
    found
}

/// An idempotent call with a reconcile: see [`Call::reconcile`].
#[derive(Debug)]
#[must_use = "a Call does nothing until `run`"]
pub struct Reconciling<R> {
    call: Call,
    reconcile: R,
}

impl Call {
    /// Decides a takeover of an abandoned attempt instead of guessing: when this call takes
    /// one over, `reconcile` runs before the body, inside the call ([`crate::current_key`]
    /// and [`crate::recovery`] answer), and finds out whether the earlier effect happened —
    /// typically by asking the downstream service for the operation it was sent under
    /// `current_key()`:
    ///
    /// * `Ok(Some(v))`: it happened; `v` is stored (fenced, like a body's result) and returned,
    ///   and the body does not run;
    /// * `Ok(None)`: it did not; the body runs;
    /// * `Err(e)`: undecided; `e` is returned and the key stays abandoned, so the next call
    ///   reconciles again.
    ///
    /// A first attempt never runs it. A crash during a reconcile leaves the key abandoned too.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem::Error> {
    /// # let idem = idem::Idem::memory();
    /// async fn charge_made(order: u64) -> Result<Option<u64>, idem::Error> { Ok(None) }
    /// let charge = idem
    ///     .call("charges.v1")
    ///     .key(&42u64)
    ///     .reconcile(|| charge_made(42))
    ///     .run(async { Ok::<_, idem::Error>(4200u64) })
    ///     .await?;
    /// # let _ = charge; Ok(()) }
    /// ```
    pub fn reconcile<R, F, T, E>(mut self, reconcile: R) -> Reconciling<R>
    where
        R: FnOnce() -> F,
        F: Future<Output = Result<Option<T>, E>>,
    {
        self.0.reconciles = true;
        Reconciling {
            call: self,
            reconcile,
        }
    }

    /// Marks this call as starting its body with a reconcile (what `reconcile = …` expands
    /// to, around the body).
    pub(crate) fn reconciled(mut self) -> Self {
        self.0.reconciles = true;
        self
    }

    /// An operator's verdict on this call's key when it is parked (see [`Idem::resolve`]; this
    /// form reaches scoped keys): `T` is the function's result type.
    pub async fn resolve<T: Serialize>(self, outcome: Resolution<T>) -> Result<(), Error> {
        let call = self.prepare()?;
        let encoded;
        let resolve = match &outcome {
            Resolution::Applied(value) => {
                let plain = codec::encode_ok(value)?;
                encoded = call.idem.codec().seal(
                    std::any::type_name::<T>(),
                    &call.name,
                    &call.key,
                    plain,
                )?;
                Resolve::Applied {
                    value: &encoded,
                    ttl: call.ttl,
                }
            }
            Resolution::NotApplied => Resolve::NotApplied,
        };
        match call.idem.store().resolve(&call.key, resolve).await? {
            Resolved::Done(_) => Ok(()),
            Resolved::NotParked(found) => Err(Error::Config(format!(
                "{}/{}: not parked, nothing changed: the key is {}",
                call.name,
                call.key.to_hex(),
                match found.map(|r| r.status) {
                    None => "free",
                    Some(Status::Completed) => "completed",
                    Some(Status::InProgress) => "in progress",
                    Some(_) => "not parked",
                }
            ))),
        }
    }
}

impl<R> Reconciling<R> {
    /// [`Call::run`] with the reconcile.
    pub async fn run<T, E, F, Fut>(self, body: Fut) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        R: FnOnce() -> F,
        F: Future<Output = Result<Option<T>, E>>,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_with(ReleaseErrors, body).await
    }

    /// [`Call::run_with`] with the reconcile.
    pub async fn run_with<T, E, P, F, Fut>(self, policy: P, body: Fut) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        P: ErrorPolicy<E>,
        R: FnOnce() -> F,
        F: Future<Output = Result<Option<T>, E>>,
        Fut: Future<Output = Result<T, E>>,
    {
        let Reconciling { call, reconcile } = self;
        let body = async move {
            if let Some(found) = self::reconcile(async move { reconcile().await }).await {
                return found;
            }
            body.await
        };
        call.run_with(policy, body).await
    }
}

/// An operator's verdict on a parked key ([`Idem::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution<T> {
    /// The abandoned attempt's effect happened, with this result: callers get it as if the
    /// body had returned it.
    Applied(T),
    /// It did not happen: the next call runs the body.
    NotApplied,
}

impl Idem {
    /// An operator's verdict on a parked key of namespace `name` (an unscoped key; the builder's
    /// [`Call::resolve`] and the CLI reach scoped ones): [`Resolution::Applied`] stores the value
    /// (encoded as `T`, the function's result type, and kept for the handle's default TTL),
    /// [`Resolution::NotApplied`] frees the key. A key that is not parked (free, running,
    /// completed) is refused with [`Error::Config`] naming its state, and nothing changes. A
    /// value that does not decode as the function's type is an [`Error::Codec`] on the next
    /// call, never a panic.
    pub async fn resolve<K, T>(
        &self,
        name: &str,
        key: &K,
        outcome: Resolution<T>,
    ) -> Result<(), Error>
    where
        K: Serialize + ?Sized,
        T: Serialize,
    {
        self.call(name.to_owned()).key(key).resolve(outcome).await
    }
}
