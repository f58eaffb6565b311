//! The call engine: key → claim → run the body under a lease → store or release; replay,
//! wait, steps. One builder ([`Call`]), one claim path ([`Prepared::begin`], in begin.rs), one
//! finish path ([`Prepared::finish`], in finish.rs). It never names a store: it is given an
//! [`Executor`] — the handle's store, or a caller's transaction (transaction.rs).

mod begin;
mod finish;
pub(crate) mod resuming;
mod takeover;

use crate::context::{self, CallContext, Recovery, CURRENT};
use crate::error::Error;
use crate::handle::Idem;
use crate::key::{Digest, KeyParts};
use crate::lease::{self, Held};
use crate::observe::{self, Ended, Obs};
use crate::policy::{ErrorPolicy, OnAbandoned, ReleaseErrors};
use serde::{de::DeserializeOwned, Serialize};
use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;
use tracing::Instrument;

pub(crate) use begin::Begun;
pub(crate) use takeover::reconcile;
pub use takeover::{Reconciling, Resolution};

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

/// How a call failed inside the engine: with idem's own error, converted into the caller's
/// error type (and reported) once, where the call returns ([`Failed::into_err`]); or with the
/// body's error (or a kept one replayed), which goes back as it is.
pub(crate) enum Failed<E> {
    Idem(Error),
    Body(E),
}

impl<E> From<Error> for Failed<E> {
    fn from(e: Error) -> Self {
        Failed::Idem(e)
    }
}

impl<E> Failed<E> {
    /// The caller's error: idem's own reported as the call's outcome, then converted.
    pub(crate) fn into_err(self, obs: &mut Obs, into: impl FnOnce(Error) -> E) -> E {
        match self {
            Failed::Idem(e) => {
                obs.fail(&e);
                into(e)
            }
            Failed::Body(e) => e,
        }
    }
}

/// What the engine returns inside: the outcome, or how it failed.
pub(crate) type Ran<T, E> = Result<Outcome<T>, Failed<E>>;

/// The builder's fields: what [`Call`]'s methods set. Boxed in `Call`, which the builder's
/// methods take and return by value.
#[derive(Debug, Default)]
struct Setup {
    /// `None`: the parent's handle for a step inside a call, else the installed one.
    idem: Option<Idem>,
    name: Cow<'static, str>,
    step: bool,
    parts: KeyParts,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    wait: Option<Duration>,
    tombstone: Option<Duration>,
    max_value: Option<usize>,
    on_abandoned: OnAbandoned,
    /// The body starts with a reconcile ([`Call::reconcile`], `reconcile = …`).
    reconciles: bool,
    /// A resumable call's encoded arguments, kept with its claim (`#[idempotent(resume)]`).
    resume_args: Option<Result<Vec<u8>, Error>>,
}

/// An idempotent call being set up: see [`Idem::call`].
#[derive(Debug)]
#[must_use = "a Call does nothing until `run`"]
pub struct Call(Box<Setup>);

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
    parts: KeyParts,
    /// The digests came from the memo.
    remembered: bool,
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
    /// How long the key's tombstone is kept after `ttl` (zero: none).
    tombstone: Duration,
    /// This function's own limit on a stored result, below the handle's.
    max_value: Option<usize>,
    on_abandoned: OnAbandoned,
    reconciles: bool,
    /// A resumable call's arguments as stored (sealed as results are).
    resume_args: Option<Vec<u8>>,
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
        Call(Box::new(Setup {
            idem,
            name,
            ..Setup::default()
        }))
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
        self.0.wait = Some(wait);
        self
    }

    /// After `ttl`, keep the key's digest and fingerprint this much longer without the value:
    /// a repeat then gets [`Error::Expired`] instead of running the body again. Without it
    /// (and without the handle's default, [`crate::Defaults::tombstone`]) an expired key is
    /// free again. `Duration::ZERO` turns a handle's default off for this call.
    pub fn tombstone(mut self, tombstone: Duration) -> Self {
        self.0.tombstone = Some(tombstone);
        self
    }

    /// The largest result this call stores, in bytes as stored (after compression and
    /// encryption), below the handle's limit ([`Idem::with_max_value_len`], by default
    /// [`crate::DEFAULT_MAX_VALUE_LEN`], and the store's own): a larger one fails with
    /// [`Error::Codec`] of kind [`crate::CodecErrorKind::TooLarge`], naming the limit and the
    /// size, and the key is released (nothing is stored). A limit above the handle's changes
    /// nothing.
    pub fn max_value(mut self, bytes: usize) -> Self {
        self.0.max_value = Some(bytes);
        self
    }

    /// What a call that takes over an abandoned attempt does when it has no reconcile:
    /// [`OnAbandoned::Rerun`] (the default) or [`OnAbandoned::Park`].
    pub fn on_abandoned(mut self, on_abandoned: OnAbandoned) -> Self {
        self.0.on_abandoned = on_abandoned;
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

    /// Makes this call resumable: `args` (the function's arguments but the skipped ones) are
    /// encoded now and kept with the claim, for a resumer to call the function again with them
    /// if this attempt is abandoned (`#[idempotent(resume)]`).
    pub(crate) fn resumable<A: Serialize + ?Sized>(mut self, args: &A) -> Self {
        self.0.resume_args = Some(crate::codec::encode_args(args));
        self
    }

    /// The namespace as written.
    pub(crate) fn name(&self) -> &Cow<'static, str> {
        &self.0.name
    }

    /// Resolves the handle, the step's parent, the digests and the defaults.
    pub(crate) fn prepare(self) -> Result<Prepared, Error> {
        let mut setup = *self.0;
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
        let name = setup.name;
        let mut parts = setup.parts;
        let query = parts.inputs(&name)?;
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
        // A zero TTL would store a result that is never replayed: every call would run the
        // body, idempotency silently off.
        if ttl.is_zero() {
            return Err(Error::Config(format!(
                "{name}: ttl must be above zero (a result kept for no time is never replayed)"
            )));
        }
        let wait = setup.wait.or(defaults.wait);
        // A step's result lives and dies with its parent's logical call: it takes no tombstone
        // of the handle's, only one written on the step.
        let tombstone = match (&parent, setup.tombstone) {
            (_, Some(t)) => t,
            (Some(_), None) => Duration::ZERO,
            (None, None) => defaults.tombstone.unwrap_or(Duration::ZERO),
        };
        for (what, d) in [
            ("ttl", Some(ttl)),
            ("lease", Some(lease)),
            ("wait", wait),
            ("tombstone", Some(tombstone)),
        ] {
            if d.is_some_and(|d| d > crate::protocol::MAX_DURATION) {
                return Err(Error::Config(format!(
                    "{name}: {what} of {d:?} is above the maximum of 36500 days (100 years)"
                )));
            }
        }
        if setup.reconciles && setup.on_abandoned == OnAbandoned::Park {
            return Err(Error::Config(format!(
                "{name}: a call with a reconcile decides an abandoned attempt itself; \
                 on_abandoned = park does not apply (remove one of them)"
            )));
        }
        let resume_args = match setup.resume_args {
            Some(args) => Some(idem.codec().seal(RESUME_ARGS, &name, &key, args?)?),
            None => None,
        };
        Ok(Prepared {
            idem,
            name,
            key,
            fingerprint,
            parts,
            remembered,
            ttl,
            lease,
            wait,
            tombstone,
            max_value: setup.max_value,
            on_abandoned: setup.on_abandoned,
            reconciles: setup.reconciles,
            resume_args,
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
        self.execute(policy, body, E::from)
    }

    /// The call, in its `idem.call` span, made at its first poll (a future dropped before
    /// did nothing and reports nothing); idem's own errors become the caller's through `into`
    /// here, and nowhere else.
    pub(crate) async fn execute<T, E, P, Fut>(
        self,
        policy: P,
        body: Fut,
        into: fn(Error) -> E,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = observe::call_span(self.name());
        let obs = Obs::new(span.clone(), self.name().clone());
        async move {
            // `obs` reports from its drop, inside the span: a future dropped mid-call too.
            let mut obs = obs;
            // The call's work is boxed: a caller's future then holds a pointer, not the
            // engine's state and the body's, whose sizes add up through nested calls (steps).
            let ran = Box::pin(self.go(&mut obs, policy, body)).await;
            ran.map_err(|failed| failed.into_err(&mut obs, into))
        }
        .instrument(span.unwrap_or_else(tracing::Span::none))
        .await
    }

    /// Set up, claim on the handle's store, then the body under the claim, its lease renewed
    /// meanwhile, then its result stored or the key released.
    async fn go<T, E, P, Fut>(self, obs: &mut Obs, policy: P, body: Fut) -> Ran<T, E>
    where
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
        Fut: Future<Output = Result<T, E>>,
    {
        let call = self.prepare()?;
        let store = call.idem.store();
        let mut exec: &dyn crate::store::Store = store;
        let (token, sent, takeover) = match call.begin(&mut exec, obs, &policy).await {
            Begun::Run {
                token,
                sent,
                takeover,
            } => (token, sent, takeover),
            Begun::Done(done) => return done,
        };
        if let Some(args) = &call.resume_args {
            call.keep_args(store, obs, token, args, takeover.is_some())
                .await?;
        }
        if takeover.is_some() {
            resuming::note_takeover(&call.key);
        }
        let recovery = match takeover {
            Some(takeover) => call.take_over(&mut exec, obs, token, takeover).await?,
            None => None,
        };
        let held = Held::new(sent, call.lease);
        let context = call.context(token, recovery);
        let reconciled = context.reconciled.clone();
        let attempt = async {
            match lease::caught(CURRENT.scope(context, body)).await {
                Ok(result) => Ok(call
                    .settle(
                        &mut exec,
                        obs,
                        token,
                        Some(&held),
                        &policy,
                        result,
                        recovery,
                        &reconciled,
                    )
                    .await),
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
}

/// The "type" a resumable call's stored arguments are sealed and opened as.
pub(crate) const RESUME_ARGS: &str = "the arguments of a resumable call";

impl Prepared {
    /// Keeps a resumable call's arguments with its claim; on a failure nothing was run and the
    /// error is returned: a first attempt's claim is released, a takeover's is abandoned again
    /// (its claim kept the arguments it took over, for the next resumer).
    async fn keep_args(
        &self,
        store: &dyn crate::store::Store,
        obs: &mut Obs,
        token: u64,
        args: &[u8],
        took_over: bool,
    ) -> Result<(), Error> {
        match obs
            .store("keep_args", store.keep_args(&self.key, token, args))
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.lease_lost(token)),
            Err(e) if took_over => {
                let _ = obs.store("abandon", store.abandon(&self.key, token)).await;
                Err(e)
            }
            Err(e) => {
                let mut exec: &dyn crate::store::Store = store;
                self.release(&mut exec, obs, token, None).await;
                Err(e)
            }
        }
    }

    /// The logical call the body runs in: what `current_key()` reads and steps nest under.
    pub(crate) fn context(&self, token: u64, recovery: Option<Recovery>) -> CallContext {
        CallContext {
            key: self.key,
            token,
            idem: self.idem.clone(),
            scope: self.parts.scope.clone(),
            ttl: self.ttl,
            enqueued: Default::default(),
            recovery,
            reconciled: Default::default(),
        }
    }

    /// Keeps this call's digests in the handle's memo: it was a replay, whose key is likely to
    /// be replayed again (a client retrying), while a fresh key may never come back.
    fn remember(&self) {
        if !self.remembered {
            if let Some(query) = self.parts.query(&self.name) {
                self.idem
                    .digest_memo()
                    .put(&query, (self.key, self.fingerprint));
            }
        }
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
            retry_after,
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
/// parent's retry; a failed one runs again.
///
/// Outside any idempotent call it fails with [`Error::Config`] and `body` does not run: its
/// key would be a global one, which unrelated code calling `idem::step` with the same key
/// would share. A call of its own is `idem.call(name).key(..).run(..)`.
pub fn step<K, T, E, F, Fut>(key: K, body: F) -> impl Future<Output = Result<T, E>>
where
    K: Serialize,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let call = Call::installed("step").step().key(&key).run(body());
    async move {
        // Asked at the first poll, where the parent's context is (as `prepare` asks it).
        if context::current().is_none() {
            return Err(E::from(step_outside_a_call()));
        }
        call.await.map(Outcome::into_inner)
    }
}

/// The error of `idem::step` outside an idempotent call.
fn step_outside_a_call() -> Error {
    Error::Config(
        "idem::step runs only inside an idempotent call (an #[idempotent] fn or `Call::run`): \
         outside one its key would be global; make a call of its own with \
         `idem.call(name).key(..)`"
            .into(),
    )
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
    use crate::{CodecErrorKind, Error, ErrorKind, Idem};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A zero TTL (which would turn idempotency off) and a TTL, lease or wait above
    /// `MAX_DURATION` (which the stores would saturate) are refused before the body runs.
    #[tokio::test]
    async fn a_zero_or_absurd_duration_is_a_config_error() {
        use std::time::Duration;
        let idem = Idem::memory();
        let runs = &AtomicUsize::new(0);
        let absurd = crate::protocol::MAX_DURATION + Duration::from_secs(1);
        let calls = [
            idem.call("d").key(&1).ttl(Duration::ZERO),
            idem.call("d").key(&2).ttl(absurd),
            idem.call("d").key(&3).lease(absurd),
            idem.call("d").key(&4).wait(absurd),
        ];
        for call in calls {
            let out = call
                .run(async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u32, Error>(1)
                })
                .await;
            assert_eq!(out.unwrap_err().kind(), ErrorKind::Config);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        let longest = idem.call("d").key(&5).ttl(crate::protocol::MAX_DURATION);
        assert!(longest.run(async { Ok::<u32, Error>(1) }).await.is_ok());
    }

    /// `idem::step` outside an idempotent call is refused and its body does not run, even
    /// with a handle installed; inside one it runs.
    #[tokio::test]
    async fn a_step_outside_a_call_is_an_error() {
        let runs = &AtomicUsize::new(0);
        let body = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(7)
        };
        let outside = super::step("k", body).await;
        assert_eq!(outside.unwrap_err().kind(), ErrorKind::Config);
        assert_eq!(runs.load(Ordering::SeqCst), 0);

        let idem = Idem::memory();
        let inside = idem
            .call("parent")
            .key("p")
            .run(async { super::step("k", body).await })
            .await
            .unwrap();
        assert_eq!(inside.into_inner(), 7);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

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
