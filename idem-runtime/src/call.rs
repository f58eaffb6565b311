//! One call: key → claim → run the body under a lease → store or release.

use crate::codec::{self, Stored};
use crate::context::{self, CallContext, CURRENT};
use crate::error::Error;
use crate::handle::Idem;
use crate::key::{self, Digest};
use crate::lease::{run_leased, Finished};
use crate::observe::{self, Ended, InSpan, KeyPrefix, Obs};
use crate::policy::{ErrorPolicy, OnError, ReleaseErrors};
use crate::protocol::{self, Decision};
use crate::store::{Claim, Complete, Store};
use serde::{de::DeserializeOwned, Serialize};
use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// What a call returned, and whether it ran the body or replayed a stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The body ran in this call.
    Fresh(T),
    /// A finished earlier attempt's stored result; the body did not run.
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The value, fresh or replayed.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Fresh(v) | Outcome::Replayed(v) => v,
        }
    }

    /// True when the value was replayed from the store.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }
}

/// An idempotent call being set up: see [`Idem::call`].
#[must_use = "a Call does nothing until `run`"]
pub struct Call {
    /// `None`: the parent's handle for a step inside a call, else the installed one.
    idem: Option<Idem>,
    name: Cow<'static, str>,
    step: bool,
    parts: key::KeyParts,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Option<Duration>>,
}

/// Everything a call needs once it is set up.
struct Prepared {
    idem: Idem,
    name: Cow<'static, str>,
    key: Digest,
    fingerprint: Digest,
    scope: Option<Vec<u8>>,
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
}

impl Call {
    /// A call on `idem` in namespace `name`.
    pub fn new(idem: &Idem, name: impl Into<Cow<'static, str>>) -> Call {
        Call::on(Some(idem.clone()), name.into())
    }

    /// A call on the installed handle ([`Idem::install`]); fails at `run` if there is none.
    /// (A step inside an idempotent call uses its parent's handle instead.)
    pub fn installed(name: impl Into<Cow<'static, str>>) -> Call {
        Call::on(None, name.into())
    }

    fn on(idem: Option<Idem>, name: Cow<'static, str>) -> Call {
        Call {
            idem,
            name,
            step: false,
            parts: key::KeyParts::default(),
            ttl: None,
            lease: None,
            wait: None,
        }
    }

    /// The key: the same on every retry of one logical operation. Any `Serialize` value; it is
    /// stored only as a digest, so its size and content (NUL bytes, empty) do not matter.
    pub fn key<K: Serialize + ?Sized>(mut self, key: &K) -> Self {
        self.parts.key = self.parts.encode(&self.name, "key", key);
        self
    }

    /// A tenant or principal: the same key in two scopes is two different keys.
    pub fn scope<S: Serialize + ?Sized>(mut self, scope: &S) -> Self {
        self.parts.scope = self.parts.encode(&self.name, "scope", scope);
        self
    }

    /// What must match on a repeat with the same key (default: the key itself). A repeat with
    /// another fingerprint is refused with [`Error::Mismatch`].
    pub fn fingerprint<F: Serialize + ?Sized>(mut self, fingerprint: &F) -> Self {
        self.parts.fingerprint = self.parts.encode(&self.name, "fingerprint", fingerprint);
        self
    }

    /// How long the finished result is kept and replayed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long the claim lives without renewal (renewed every `lease / 3` while the body runs).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// A duplicate waits up to `wait` for the attempt in flight and replays its result.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(Some(wait));
        self
    }

    /// Makes this call a step of the idempotent call it runs in: its key is taken under the
    /// parent's logical call (parent's key, this name, this key), and it inherits the parent's
    /// store, scope and TTL unless it sets its own. A completed step replays on the parent's
    /// retry; a failed one runs again. Outside any idempotent call it is an ordinary call.
    pub fn step(mut self) -> Self {
        self.step = true;
        self
    }

    fn prepare(mut self) -> Result<Prepared, Error> {
        if let Some(e) = self.parts.error.take() {
            return Err(e);
        }
        let parent = if self.step { context::current() } else { None };
        if let Some(parent) = &parent {
            self.name = Cow::Owned(format!("{}/{}", parent.key.to_hex(), self.name));
            self.idem = self.idem.or_else(|| parent.idem.clone());
            self.parts.scope = self.parts.scope.or_else(|| parent.scope.clone());
        }
        let idem = match self.idem.take() {
            Some(idem) => idem,
            None => Idem::installed().ok_or_else(not_installed)?,
        };
        let (key, fingerprint) = self.parts.digests(&self.name)?;
        let defaults = *idem.defaults();
        let mut ttl = self.ttl.unwrap_or(defaults.ttl);
        if let Some(parent) = &parent {
            // A step's record never outlives its parent's by more than the parent's TTL.
            ttl = self.ttl.map_or(parent.ttl, |t| t.min(parent.ttl));
        }
        let lease = self.lease.unwrap_or(defaults.lease);
        if lease.is_zero() {
            return Err(Error::Config(format!(
                "{}: lease must be above zero",
                self.name
            )));
        }
        Ok(Prepared {
            idem,
            name: self.name,
            key,
            fingerprint,
            scope: self.parts.scope,
            ttl,
            lease,
            wait: self.wait.unwrap_or(defaults.wait),
        })
    }

    /// Runs `body` at most once per key: the first call runs it and stores its `Ok` value; a
    /// repeat replays it. An `Err` releases the key. Idempotency failures become `E::from`.
    pub fn run<T, E, Fut>(self, body: Fut) -> impl Future<Output = Result<Outcome<T>, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_with(ReleaseErrors, body)
    }

    /// Like [`Call::run`], with an error policy: [`crate::KeepErrors`] stores every `Err`,
    /// [`crate::DecideErrors`] decides per error.
    pub fn run_with<T, E, P, Fut>(
        self,
        policy: P,
        body: Fut,
    ) -> impl Future<Output = Result<Outcome<T>, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute(policy, E::from, body)
    }

    /// The call, body included, goes on the heap at once (one allocation): its future is then
    /// two words and a span whatever the body, so calls nested in bodies (steps) grow by a
    /// constant, and moving the future (into `run`, the caller's state, a spawn) copies a
    /// pointer instead of the whole state machine. The call runs in its `idem.call` span.
    pub(crate) fn execute<T, E, P, Fut>(
        self,
        policy: P,
        into_err: fn(Error) -> E,
        body: Fut,
    ) -> impl Future<Output = Result<Outcome<T>, E>>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = observe::call_span(&self.name);
        let obs = Obs::new(span.clone(), self.name.clone());
        InSpan::new(
            span,
            Box::pin(self.execute_boxed(obs, policy, into_err, body)),
        )
    }

    async fn execute_boxed<T, E, P, Fut>(
        self,
        mut obs: Obs,
        policy: P,
        into_err: fn(Error) -> E,
        body: Fut,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        let obs = &mut obs;
        // Every failure of idem's own goes through here, so that the call reports it.
        let fail = |obs: &mut Obs, e: Error| {
            obs.fail(&e);
            into_err(e)
        };
        let call = self.prepare().map_err(|e| fail(obs, e))?;
        let store = call.idem.store();
        obs.prepared(store.backend(), &call.key);
        let token = loop {
            let claim = Claim {
                name: &call.name,
                key: &call.key,
                fingerprint: &call.fingerprint,
                lease: call.lease,
            };
            let outcome = obs
                .store("claim", store.claim(claim))
                .await
                .map_err(|e| fail(obs, e))?;
            match protocol::decide(outcome, &call.fingerprint) {
                Decision::Run { token } => break token,
                Decision::Replay(bytes) => return replay(obs, &policy, &bytes, into_err),
                Decision::Mismatch => return Err(fail(obs, call.mismatch())),
                Decision::InProgress { retry_after } => {
                    let Some(wait) = call.wait else {
                        return Err(fail(obs, call.in_progress(retry_after)));
                    };
                    match wait_for(store, &call, obs, Instant::now() + wait).await {
                        Waited::Decided(Decision::Replay(bytes)) => {
                            return replay(obs, &policy, &bytes, into_err)
                        }
                        Waited::Decided(Decision::Mismatch) => {
                            return Err(fail(obs, call.mismatch()))
                        }
                        Waited::Decided(Decision::InProgress { retry_after }) => {
                            return Err(fail(obs, call.in_progress(retry_after)))
                        }
                        Waited::Decided(Decision::Run { .. }) | Waited::Free => continue,
                        Waited::Failed(e) => return Err(fail(obs, e)),
                    }
                }
            }
        };
        obs.claimed(token);

        let ctx = CallContext {
            key: call.key,
            token,
            idem: Some(call.idem.clone()),
            scope: call.scope.clone(),
            ttl: call.ttl,
        };
        let finished = run_leased(
            store,
            &call.name,
            &call.key,
            token,
            call.lease,
            CURRENT.scope(ctx, body),
        )
        .await;
        match finished {
            Finished::Panicked(payload) => {
                call.release(store, obs, token).await;
                obs.done(Ended::Panicked);
                std::panic::resume_unwind(payload)
            }
            Finished::Done(Ok(value)) => match codec::encode_ok(&value) {
                Ok(bytes) => {
                    call.complete(store, obs, token, &bytes)
                        .await
                        .map_err(|e| fail(obs, e))?;
                    obs.done(Ended::Claimed);
                    Ok(Outcome::Fresh(value))
                }
                Err(e) => {
                    // Nothing can be stored, so nothing could be replayed: free the key.
                    call.release(store, obs, token).await;
                    Err(fail(obs, e))
                }
            },
            Finished::Done(Err(error)) => match policy.on_error(&error) {
                OnError::Release => {
                    call.release(store, obs, token).await;
                    obs.done(Ended::Released);
                    Err(error)
                }
                OnError::Keep => match policy.encode(&error) {
                    Ok(bytes) => {
                        call.complete(store, obs, token, &bytes)
                            .await
                            .map_err(|e| fail(obs, e))?;
                        obs.done(Ended::Claimed);
                        Err(error)
                    }
                    Err(e) => {
                        call.release(store, obs, token).await;
                        Err(fail(obs, e))
                    }
                },
            },
        }
    }
}

impl Prepared {
    fn mismatch(&self) -> Error {
        Error::Mismatch {
            name: self.name.to_string(),
            key: self.key.to_hex(),
        }
    }

    fn in_progress(&self, retry_after: Duration) -> Error {
        Error::InProgress {
            name: self.name.to_string(),
            key: self.key.to_hex(),
            retry_after: Some(retry_after),
        }
    }

    async fn complete(
        &self,
        store: &dyn Store,
        obs: &mut Obs,
        token: u64,
        value: &[u8],
    ) -> Result<(), Error> {
        let done = Complete {
            key: &self.key,
            token,
            value,
            ttl: self.ttl,
        };
        if obs.store("complete", store.complete(done)).await? {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                name: self.name.to_string(),
                key: self.key.to_hex(),
                token,
            })
        }
    }

    /// Frees the key. A failure here is logged, not returned: the caller's own error (or panic)
    /// matters more, and the claim lapses after its lease anyway.
    async fn release(&self, store: &dyn Store, obs: &mut Obs, token: u64) {
        match obs.store("release", store.release(&self.key, token)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(idem.name = &*self.name, idem.key = %KeyPrefix(&self.key), idem.token = token, "idem: release found the key taken over")
            }
            Err(e) => {
                tracing::warn!(idem.name = &*self.name, idem.key = %KeyPrefix(&self.key), idem.token = token, error = %e, "idem: release failed; the key lapses after its lease")
            }
        }
    }
}

fn replay<T, E, P>(
    obs: &mut Obs,
    policy: &P,
    bytes: &[u8],
    into_err: fn(Error) -> E,
) -> Result<Outcome<T>, E>
where
    T: DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let decoded = codec::split::<T>(bytes).and_then(|stored| match stored {
        Stored::Ok(json) => codec::decode(json).map(|v| Ok(Outcome::Replayed(v))),
        Stored::Err(json) => policy.decode(json).map(Err),
    });
    match decoded {
        Ok(replayed) => {
            obs.done(Ended::Replayed);
            replayed
        }
        Err(e) => {
            obs.fail(&e);
            Err(into_err(e))
        }
    }
}

enum Waited {
    Decided(Decision),
    /// The record is gone (released, or lapsed): claim again.
    Free,
    Failed(Error),
}

/// Waits until the attempt in flight finishes or `deadline` passes.
async fn wait_for(store: &dyn Store, call: &Prepared, obs: &mut Obs, deadline: Instant) -> Waited {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return match obs.store("get", store.get(&call.key)).await {
                Ok(Some(r)) => Waited::Decided(protocol::decide_existing(r, &call.fingerprint)),
                Ok(None) => Waited::Free,
                Err(e) => Waited::Failed(e),
            };
        }
        store.changed(&call.key, deadline - now).await;
        match obs.store("get", store.get(&call.key)).await {
            Ok(None) => return Waited::Free,
            Ok(Some(r)) => match protocol::decide_existing(r, &call.fingerprint) {
                Decision::InProgress { .. } => continue,
                d => return Waited::Decided(d),
            },
            Err(e) => return Waited::Failed(e),
        }
    }
}

/// A step of the idempotent call it runs in, for a block not worth its own function:
///
/// ```
/// # extern crate idem_runtime as idem;
/// # async fn demo() -> Result<(), idem::Error> {
/// # let idem = idem::Idem::memory();
/// idem.call("checkout").key("order-1").run(async {
///     let reserved = idem::step("reserve", || async { Ok::<_, idem::Error>(3u32) }).await?;
///     for item in 0..reserved {
///         idem::step(&("ship", item), || async { Ok::<_, idem::Error>(()) }).await?;
///     }
///     Ok::<_, idem::Error>(())
/// }).await?;
/// # Ok(()) }
/// ```
///
/// Keyed under the parent's logical call (its `current_key()`), the step name `"step"` and
/// `key`; it inherits the parent's store, scope and TTL. A completed step replays on the
/// parent's retry; a failed one runs again. Outside any idempotent call it is an ordinary
/// call on the installed handle, in namespace `"step"`.
pub fn step<K, T, E, F, Fut>(key: &K, body: F) -> impl Future<Output = Result<T, E>>
where
    K: Serialize + ?Sized,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = Call::installed("step").step().key(key).run(body());
    async move { call.await.map(Outcome::into_inner) }
}

/// The error of a call on the installed handle when none is installed.
pub(crate) fn not_installed() -> Error {
    Error::Config(
        "no idem store is installed: call `Idem::install` at start-up, or pass `store = …` to \
         #[idempotent]"
            .into(),
    )
}
