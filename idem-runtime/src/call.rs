//! One call: key → claim → run the body under a lease → store or release.

mod setup;

use crate::codec;
use crate::context::{self, CallContext, CURRENT};
use crate::error::Error;
use crate::exec::{Decided, Exec};
use crate::handle::Idem;
use crate::key::Digest;
use crate::lease::{self, Held};
use crate::observe::{self, Ended, InSpan, KeyPrefix, Obs};
use crate::policy::{ErrorPolicy, OnError, ReleaseErrors};
use crate::protocol::{self, Decision, Verdict};
use crate::store::memory::MemoryStore;
use crate::store::{Claim, Complete, Store};
use serde::{de::DeserializeOwned, Serialize};
use setup::SetupBox;
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
#[derive(Debug)]
#[must_use = "a Call does nothing until `run`"]
pub struct Call(SetupBox);

/// The builder's entry on the handle: here, beside the builder, so that the handle does not
/// depend on the engine above it.
impl Idem {
    /// Starts an idempotent call in namespace `name`: set its key (and optionally scope,
    /// fingerprint, ttl, lease, wait), then `run` its body.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem::Error> {
    /// let idem = idem::Idem::memory();
    /// let out = idem
    ///     .call("charges.v1")
    ///     .key("order-42")
    ///     .run(async { Ok::<_, idem::Error>(42u32) })
    ///     .await?;
    /// assert!(!out.is_replayed());
    /// # Ok(()) }
    /// ```
    pub fn call(&self, name: impl Into<Cow<'static, str>>) -> Call {
        Call::new(self, name)
    }
}

/// Everything a call needs once it is set up.
pub(crate) struct Prepared {
    pub(crate) idem: Idem,
    pub(crate) name: Cow<'static, str>,
    key: Digest,
    fingerprint: Digest,
    /// What the digests were computed from, for the handle's memo of replayed keys; the scope.
    setup: SetupBox,
    /// The digests came from the memo.
    remembered: bool,
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
        Call(SetupBox::new(idem, name))
    }

    /// The key: the same on every retry of one logical operation. Any `Serialize` value; it is
    /// stored only as a digest, so its size and content (NUL bytes, empty) do not matter.
    pub fn key<K: Serialize + ?Sized>(mut self, key: &K) -> Self {
        let setup = &mut *self.0;
        setup.parts.set_key(&setup.name, key);
        self
    }

    /// A tenant or principal: the same key in two scopes is two different keys.
    pub fn scope<S: Serialize + ?Sized>(mut self, scope: &S) -> Self {
        let setup = &mut *self.0;
        setup.parts.set_scope(&setup.name, scope);
        self
    }

    /// What must match on a repeat with the same key (default: the key itself). A repeat with
    /// another fingerprint is refused with [`Error::Mismatch`].
    pub fn fingerprint<F: Serialize + ?Sized>(mut self, fingerprint: &F) -> Self {
        let setup = &mut *self.0;
        setup.parts.set_fingerprint(&setup.name, fingerprint);
        self
    }

    /// How long the finished result is kept and replayed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.0.ttl = Some(ttl);
        self
    }

    /// How long the claim lives without renewal (renewed every `lease / 3` while the body runs).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.0.lease = Some(lease);
        self
    }

    /// A duplicate waits up to `wait` for the attempt in flight and replays its result.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.0.wait = Some(Some(wait));
        self
    }

    /// Makes this call a step of the idempotent call it runs in: its key is taken under the
    /// parent's logical call (parent's key, this name, this key), and it inherits the parent's
    /// store, scope and TTL unless it sets its own. A completed step replays on the parent's
    /// retry; a failed one runs again. Outside any idempotent call it is an ordinary call.
    pub fn step(mut self) -> Self {
        self.0.step = true;
        self
    }

    /// The namespace as written.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn name(&self) -> &Cow<'static, str> {
        &self.0.name
    }

    /// Resolves the handle, the step's parent, the digests and the defaults.
    pub(crate) fn prepare(self) -> Result<Prepared, Error> {
        let mut setup = self.0;
        if let Some(e) = setup.parts.error.take() {
            return Err(*e);
        }
        let parent = if setup.step { context::current() } else { None };
        if let Some(parent) = &parent {
            setup.name = Cow::Owned(format!("{}/{}", parent.key.to_hex(), setup.name));
            if setup.idem.is_none() {
                setup.idem = Some(parent.idem.clone());
            }
            if setup.parts.scope.is_none() {
                setup.parts.scope = parent.scope.clone();
            }
        }
        let idem = match setup.idem.take() {
            Some(idem) => idem,
            None => Idem::installed().ok_or_else(not_installed)?,
        };
        let name = std::mem::take(&mut setup.name);
        let query = setup.parts.inputs(&name)?;
        let memo = idem.digest_memo().get(&query);
        let remembered = memo.is_some();
        let (key, fingerprint) = memo.unwrap_or_else(|| {
            query.digests(
                #[cfg(feature = "keyed-digests")]
                idem.digest_secret(),
            )
        });
        let defaults = *idem.defaults();
        // A step inherits its parent's TTL; a TTL written on the step is honoured as written.
        let inherited = parent.as_ref().map_or(defaults.ttl, |p| p.ttl);
        let ttl = setup.ttl.unwrap_or(inherited);
        let lease = setup.lease.unwrap_or(defaults.lease);
        if lease.is_zero() {
            return Err(Error::Config(format!("{name}: lease must be above zero")));
        }
        let wait = setup.wait.unwrap_or(defaults.wait);
        Ok(Prepared {
            idem,
            name,
            key,
            fingerprint,
            setup,
            remembered,
            ttl,
            lease,
            wait,
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
        self.execute(policy, E::from, body, std::convert::identity)
    }

    /// The call: set up and claimed at its first poll, without a suspension point where the
    /// executor allows (the memory store), so that a call that ends there (a replay, a
    /// mismatch, an attempt in flight) allocates nothing for its future. Only a call that goes
    /// on (to run its body, to wait, or to ask a store over the network) puts the rest of its
    /// work on the heap, in one allocation: the call's own future holds what it was given and
    /// a pointer, whatever the body does after. `out` maps the outcome (`run` returns the
    /// value alone), inside this future rather than in another around it, which would be one
    /// more copy of it. The call runs in its `idem.call` span, made at the first poll: a
    /// future dropped before it did nothing and reports nothing.
    pub(crate) async fn execute<T, E, P, Fut, O>(
        self,
        policy: P,
        into_err: fn(Error) -> E,
        body: Fut,
        out: fn(Outcome<T>) -> O,
    ) -> Result<O, E>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.first_poll(policy, into_err, body) {
            Ok(done) => done.map(out),
            Err(rest) => rest.await.map(out),
        }
    }

    /// What a call does at its first poll, in its span: its setup and, where it can, its
    /// claim. `Ok`: the call ended there; `Err`: the rest of it, on the heap, in the span. (A
    /// function of its own, not part of `execute`'s future, so that nothing it holds is kept
    /// in that future's state.)
    #[allow(clippy::type_complexity)]
    fn first_poll<T, E, P, Fut>(
        self,
        policy: P,
        into_err: fn(Error) -> E,
        body: Fut,
    ) -> Result<Result<Outcome<T>, E>, InSpan<impl Future<Output = Result<Outcome<T>, E>>>>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = observe::call_span(&self.0.name);
        // Entered until the end: `obs` reports from its drop, before this guard's.
        let _entered = span.as_ref().map(tracing::Span::enter);
        let mut obs = Obs::new(span.clone(), self.0.name.clone());
        let call = match self.prepare() {
            Ok(call) => call,
            Err(e) => return Ok(Err(fail(&mut obs, e, into_err))),
        };
        let begun = match call.begin_now(&mut obs, &policy, into_err) {
            Some(Begun::Done(done)) => return Ok(done),
            begun => begun,
        };
        let rest = call.go_on(begun, obs, policy, into_err, body);
        Err(InSpan::new(span.clone(), Box::pin(rest)))
    }
}

impl Prepared {
    /// The call after its first poll: the claim (unless [`Prepared::begin_now`] took it), then
    /// the body under the claim, its lease renewed meanwhile, then its result stored or the
    /// key released.
    async fn go_on<T, E, P, Fut>(
        self,
        begun: Option<Begun<T, E>>,
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
        let store = self.idem.store();
        let begun = match begun {
            Some(begun) => begun,
            None => self.begin(&mut self.exec(), obs, &policy, into_err).await,
        };
        let (token, sent) = match begun {
            Begun::Run { token, sent } => (token, sent),
            Begun::Done(done) => return done,
        };
        let call = &self;
        let mut exec = Exec::Store(store);
        let held = Held::new(sent, call.lease);
        let attempt = async {
            match lease::caught(CURRENT.scope(call.context(token), body)).await {
                Ok(result) => {
                    let finished = call
                        .finish(
                            &mut exec,
                            obs,
                            token,
                            Some(&held),
                            &policy,
                            result,
                            into_err,
                        )
                        .await;
                    Ok(finished)
                }
                Err(panic) => {
                    call.release(&mut exec, obs, token, Some(&held)).await;
                    obs.done(Ended::Panicked);
                    Err(panic)
                }
            }
        };
        match lease::run_leased(store, &call.name, &call.key, token, &held, attempt).await {
            Ok(finished) => finished,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// The default executor: the handle's store, the memory store read in place.
    fn exec(&self) -> Exec<'_> {
        match self.idem.store_as::<MemoryStore>() {
            Some(memory) => Exec::Memory(memory),
            None => Exec::Store(self.idem.store()),
        }
    }
}

/// Every failure of idem's own goes through here, so that the call reports it.
fn fail<E>(obs: &mut Obs, e: Error, into_err: fn(Error) -> E) -> E {
    obs.fail(&e);
    into_err(e)
}

/// What a call's claim decided.
pub(crate) enum Begun<T, E> {
    /// The call holds the key with `token` (claimed at `sent`): run the body, then finish.
    Run { token: u64, sent: Instant },
    /// Replayed, or an idempotency failure: the body does not run.
    Done(Result<Outcome<T>, E>),
}

/// Where a decided claim leaves a call: begun, or to wait for the attempt in flight.
enum Settled<T, E> {
    Begun(Begun<T, E>),
    Wait,
}

impl Prepared {
    /// Claims the key on `exec` and maps the decision: run, replay, in progress (waiting for
    /// the attempt in flight when the call has a `wait` and the executor a lease), mismatch.
    pub(crate) async fn begin<T, E, P>(
        &self,
        exec: &mut Exec<'_>,
        obs: &mut Obs,
        policy: &P,
        into_err: fn(Error) -> E,
    ) -> Begun<T, E>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        if let Some(plain) = self.start(exec, obs) {
            return Begun::Done(replay(obs, policy, plain.as_ref(), into_err, Ended::Cached));
        }
        let waits = self.wait.zip(exec.leased());
        loop {
            let epoch = self.epoch();
            let decided = obs
                .store("claim", exec.decide(self.claim(), epoch.is_some()))
                .await;
            let (wait, store) =
                match self.settle(decided, epoch, waits.is_some(), obs, policy, into_err) {
                    Settled::Begun(begun) => return begun,
                    Settled::Wait => waits.expect("settle waits only when the call can"),
                };
            // Boxed: a rare branch, kept out of every call's future.
            let decision = match Box::pin(wait_for(store, self, obs, Instant::now() + wait)).await {
                Waited::Decided(Decision::Run { .. }) | Waited::Free => continue,
                Waited::Decided(decision) => decision,
                Waited::Failed(e) => return Begun::Done(Err(fail(obs, e, into_err))),
            };
            // The claim's record was the attempt in flight: the time it had left was its
            // lease, not the TTL of the result waited for, which is not cached.
            let waited = Ok((decision.into(), None, None));
            return match self.settle(waited, epoch, false, obs, policy, into_err) {
                Settled::Begun(begun) => begun,
                Settled::Wait => unreachable!("settle waits only when asked to"),
            };
        }
    }

    /// [`Prepared::begin`] on the default executor, at once where it decides without a
    /// suspension point (the memory store): `None` where it cannot (another store), or where
    /// the call is to wait for the attempt in flight — having changed nothing then (a claim
    /// that finds an attempt in flight writes nothing), so `begin` does it all.
    fn begin_now<T, E, P>(
        &self,
        obs: &mut Obs,
        policy: &P,
        into_err: fn(Error) -> E,
    ) -> Option<Begun<T, E>>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let exec = self.exec();
        if !matches!(exec, Exec::Memory(_)) {
            return None;
        }
        if let Some(plain) = self.start(&exec, obs) {
            let cached = replay(obs, policy, plain.as_ref(), into_err, Ended::Cached);
            return Some(Begun::Done(cached));
        }
        let epoch = self.epoch();
        let decided = obs.store_now("claim", || exec.decide_now(self.claim(), epoch.is_some()))?;
        match self.settle(
            Ok(decided),
            epoch,
            self.wait.is_some(),
            obs,
            policy,
            into_err,
        ) {
            Settled::Begun(begun) => Some(begun),
            Settled::Wait => None,
        }
    }

    /// What every call does before its claim: report it, and find a completed result kept in
    /// this process under this very fingerprint (replayed without asking the store). Anything
    /// else (a miss, another fingerprint) goes to the store, which decides.
    fn start(&self, exec: &Exec<'_>, obs: &mut Obs) -> Option<impl AsRef<[u8]>> {
        obs.prepared(exec.backend(), &self.key);
        self.idem.follow_releases();
        let plain = self.idem.cache()?.get(&self.key, &self.fingerprint)?;
        self.remember();
        Some(plain)
    }

    /// This call's claim.
    fn claim(&self) -> Claim<'_> {
        Claim {
            name: &self.name,
            key: &self.key,
            fingerprint: &self.fingerprint,
            lease: self.lease,
            ttl: self.ttl,
        }
    }

    /// The cache's epoch, read before the claim: a release announced after it keeps the
    /// result uncached.
    fn epoch(&self) -> Option<u64> {
        self.idem.cache().map(|cache| cache.epoch())
    }

    /// What a decided claim means for this call: run (the call holds the key), replay,
    /// mismatch, in progress — or, when `may_wait`, wait for the attempt in flight.
    fn settle<T, E, P, V: AsRef<[u8]>>(
        &self,
        decided: Result<Decided<V>, Error>,
        epoch: Option<u64>,
        may_wait: bool,
        obs: &mut Obs,
        policy: &P,
        into_err: fn(Error) -> E,
    ) -> Settled<T, E>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let (decision, remaining, sent) = match decided {
            Ok(decided) => decided,
            Err(e) => return Settled::Begun(Begun::Done(Err(fail(obs, e, into_err)))),
        };
        let done = match decision {
            Verdict::InProgress { .. } if may_wait => return Settled::Wait,
            Verdict::Run { token } => {
                obs.claimed(token);
                let sent = sent.expect("Exec::decide times every claim it wins");
                return Settled::Begun(Begun::Run { token, sent });
            }
            Verdict::Replay(bytes) => match self.remember().open::<T>(bytes.as_ref()) {
                Ok(plain) => {
                    if let (Some(cache), Some(remaining), Some(epoch), Some(sent)) =
                        (self.idem.cache(), remaining, epoch, sent)
                    {
                        cache.put(
                            self.key,
                            self.fingerprint,
                            &plain,
                            sent.into_std(),
                            remaining,
                            epoch,
                        );
                    }
                    replay(obs, policy, &plain, into_err, Ended::Replayed)
                }
                Err(e) => Err(fail(obs, e, into_err)),
            },
            Verdict::Mismatch => Err(fail(obs, self.mismatch(), into_err)),
            // Until the engine answers a parked key with its own error: never the body.
            Verdict::OutcomeUnknown => Err(fail(
                obs,
                self.in_progress(protocol::MAX_RETRY_AFTER),
                into_err,
            )),
            Verdict::InProgress { retry_after } => {
                Err(fail(obs, self.in_progress(retry_after), into_err))
            }
        };
        Settled::Begun(Begun::Done(done))
    }

    /// Keeps this call's digests in the handle's memo: it was a replay, whose key is likely to
    /// be replayed again (a client retrying), while a fresh key may never come back.
    fn remember(&self) -> &Self {
        if !self.remembered {
            if let Some(query) = self.setup.parts.query(&self.name) {
                self.idem
                    .digest_memo()
                    .put(&query, (self.key, self.fingerprint));
            }
        }
        self
    }

    /// The logical call the body runs in: what `current_key()` reads and steps nest under.
    pub(crate) fn context(&self, token: u64) -> CallContext {
        CallContext {
            key: self.key,
            token,
            idem: self.idem.clone(),
            scope: self.setup.parts.scope.clone(),
            ttl: self.ttl,
            enqueued: Default::default(),
        }
    }

    /// Stores the body's result (an `Ok`, or an `Err` the policy keeps) or releases the key
    /// (an `Err` the policy releases, or a result that cannot be encoded), and returns it.
    /// `held`: the lease the store steps are bounded by, under the default executor.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn finish<T, E, P>(
        &self,
        exec: &mut Exec<'_>,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        policy: &P,
        result: Result<T, E>,
        into_err: fn(Error) -> E,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize,
        P: ErrorPolicy<E>,
    {
        let (keep, result) = match result {
            Ok(value) => {
                let sealed = codec::encode_ok(&value).and_then(|plain| self.seal::<T>(plain));
                (sealed, Ok(Outcome::Fresh(value)))
            }
            Err(error) => match policy.on_error(&error) {
                OnError::Release => {
                    self.release(exec, obs, token, held).await;
                    obs.done(Ended::Released);
                    return Err(error);
                }
                OnError::Keep => {
                    let sealed = policy
                        .encode(&error)
                        .and_then(|plain| self.seal::<E>(plain));
                    (sealed, Err(error))
                }
            },
        };
        let stored = match keep {
            Ok((bytes, plain)) => {
                let sent = std::time::Instant::now();
                let epoch = self.idem.cache().map(|cache| cache.epoch());
                let stored = self.complete(exec, obs, token, held, &bytes).await;
                // Only a result the store holds for good is cached: not one completed inside a
                // caller's transaction, which may yet roll back.
                if let (Ok(()), Some(cache), Some(plain), Some(_), Some(epoch)) =
                    (&stored, self.idem.cache(), plain, exec.leased(), epoch)
                {
                    cache.put(self.key, self.fingerprint, &plain, sent, self.ttl, epoch);
                }
                stored
            }
            Err(e) => {
                // Nothing can be stored, so nothing could be replayed: free the key.
                self.release(exec, obs, token, held).await;
                Err(e)
            }
        };
        match stored {
            Ok(()) => {
                obs.done(Ended::Claimed);
                result
            }
            Err(e) => Err(fail(obs, e, into_err)),
        }
    }

    /// The bytes to store for an encoded result of type `V` (compressed, encrypted and checked
    /// against the size limit as the handle says), and the encoded result itself when the
    /// handle caches results.
    fn seal<V>(&self, plain: Vec<u8>) -> Result<(Vec<u8>, Option<Vec<u8>>), Error> {
        let keep = self.idem.cache().map(|_| plain.clone());
        let stored =
            self.idem
                .codec()
                .seal(std::any::type_name::<V>(), &self.name, &self.key, plain)?;
        Ok((stored, keep))
    }

    /// The encoded result inside a stored value (decrypted, decompressed).
    fn open<'a, T>(&self, stored: &'a [u8]) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
        self.idem
            .codec()
            .open(std::any::type_name::<T>(), &self.name, &self.key, stored)
    }

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
        exec: &mut Exec<'_>,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        value: &[u8],
    ) -> Result<(), Error> {
        let done = Complete {
            key: &self.key,
            token,
            value,
            ttl: self.ttl,
        };
        let step = obs.store("complete", exec.complete(done));
        let completed = match held {
            Some(held) => match held.bound(step).await {
                Some(completed) => completed,
                None => return Err(self.lease_ran_out(exec.backend())),
            },
            None => step.await,
        };
        if completed? {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                name: self.name.to_string(),
                key: self.key.to_hex(),
                token,
            })
        }
    }

    async fn release(&self, exec: &mut Exec<'_>, obs: &mut Obs, token: u64, held: Option<&Held>) {
        let backend = exec.backend();
        let step = obs.store("release", exec.release(&self.name, &self.key, token));
        let abandoned = match held {
            Some(held) => held.bound(step).await.is_none(),
            None => {
                step.await;
                false
            }
        };
        if abandoned {
            tracing::warn!(idem.name = &*self.name, idem.key = %KeyPrefix(&self.key), idem.token = token, error = %self.lease_ran_out(backend), "idem: release abandoned; the key lapses after its lease");
        }
    }

    /// The store kept failing (renewals too) until this attempt's lease ran out.
    fn lease_ran_out(&self, backend: crate::store::Backend) -> Error {
        Error::store_kind(
            backend,
            "complete",
            crate::error::StoreErrorKind::Timeout,
            format!(
                "{}: the store did not answer before this attempt's lease ran out; the key \
                 frees when the lease lapses",
                self.name
            ),
        )
    }
}

/// Decodes an encoded (opened) result; `ended` says where it came from (the store, the cache).
fn replay<T, E, P>(
    obs: &mut Obs,
    policy: &P,
    plain: &[u8],
    into_err: fn(Error) -> E,
    ended: Ended,
) -> Result<Outcome<T>, E>
where
    T: DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let decoded = codec::decode_result::<T, E>(plain, |json| policy.decode(json))
        .map(|result| result.map(Outcome::Replayed));
    match decoded {
        Ok(replayed) => {
            obs.done(ended);
            replayed
        }
        Err(e) => Err(fail(obs, e, into_err)),
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
///         idem::step(("ship", item), || async { Ok::<_, idem::Error>(()) }).await?;
///     }
///     Ok::<_, idem::Error>(())
/// }).await?;
/// # Ok(()) }
/// ```
///
/// Keyed under the parent's logical call (its `current_key()`), the step name `"step"` and
/// `key` (any `Serialize` value, taken by value: `("ship", id)`, `&name`, `order_id`); it
/// inherits the parent's store, scope and TTL. A completed step replays on the
/// parent's retry; a failed one runs again. Outside any idempotent call it is an ordinary
/// call on the installed handle, in namespace `"step"`.
pub fn step<K, T, E, F, Fut>(key: K, body: F) -> impl Future<Output = Result<T, E>>
where
    K: Serialize,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = Call::installed("step").step().key(&key).run(body());
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

#[cfg(test)]
mod tests {
    use crate::{CodecErrorKind, Error, Idem};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Replays answered from the handle's digest memo still check the fingerprint: a changed
    /// argument after several replays of a key is a mismatch, and the body never runs again.
    #[tokio::test]
    async fn a_remembered_key_still_refuses_other_arguments() {
        let idem = Idem::memory();
        let runs = &AtomicUsize::new(0);
        let call = |amount: u64| {
            idem.call("charges")
                .key("order-1")
                .fingerprint(&("order-1", amount))
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Error>(amount)
                })
        };
        assert!(!call(5).await.unwrap().is_replayed());
        for _ in 0..3 {
            let out = call(5).await.unwrap();
            assert!(out.is_replayed());
            assert_eq!(out.into_inner(), 5);
        }
        match call(6).await {
            Err(Error::Mismatch { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// A handle given a digest secret does not answer from the memo of the handle it was made
    /// from: its keys are keyed digests, so a key replayed on the plain handle is a new key on
    /// the keyed one, as without the memo.
    #[cfg(feature = "keyed-digests")]
    #[tokio::test]
    async fn a_keyed_handle_does_not_use_the_plain_handles_memo() {
        let plain = Idem::memory();
        let runs = AtomicUsize::new(0);
        let call = |idem: &Idem| {
            idem.call("charges").key("order-1").run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<u64, Error>(1)
            })
        };
        call(&plain).await.unwrap();
        assert!(call(&plain).await.unwrap().is_replayed());
        assert!(call(&plain).await.unwrap().is_replayed());
        let keyed = plain
            .clone()
            .with_digest_secret(crate::key::DigestSecret::new(&[7; 32]).unwrap());
        assert!(!call(&keyed).await.unwrap().is_replayed());
        assert!(call(&keyed).await.unwrap().is_replayed());
        assert!(call(&keyed).await.unwrap().is_replayed());
        assert!(call(&plain).await.unwrap().is_replayed());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    /// A result that cannot be stored (a NaN, found by the `record_decoding` fuzz target: it was
    /// stored as `null`, which no replay could decode) frees its key: the call fails with the
    /// codec error, and the next call runs the body again.
    #[tokio::test]
    async fn a_result_that_cannot_be_stored_frees_its_key() {
        let idem = Idem::memory();
        let runs = AtomicUsize::new(0);
        for _ in 0..2 {
            let result = idem
                .call("floats")
                .key("k")
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<f64, Error>(f64::NAN)
                })
                .await;
            match result {
                Err(Error::Codec(e)) => assert_eq!(e.kind, CodecErrorKind::Encode, "{e}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
