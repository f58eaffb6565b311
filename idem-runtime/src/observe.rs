//! Tracing and metrics of calls: one span per call, one outcome per call, store latency.
//!
//! Every call runs in an INFO span `idem.call` with the fields `idem.name`, `idem.store`,
//! `idem.key` (a 12-hex-digit prefix of the key's digest: never the key or an argument),
//! `idem.token`, `idem.outcome` and `idem.store_latency_us`. When no subscriber wants the span
//! (`Span::is_disabled`), nothing is recorded, formatted or timed, so the hot path costs one
//! callsite check. The call ends with one event: DEBUG for the ordinary outcomes, INFO for a
//! mismatch (a client reusing a key), WARN for the failures an operator acts on.
//!
//! A replay served by the handle's local cache (feature `cache`) ends with the outcome `cached`
//! instead of `replayed`: it made no round trip to the store.
//!
//! With the cargo feature `metrics` the same outcomes feed the `metrics` facade:
//! `idem_calls_total{name, outcome}`, `idem_store_latency_seconds{backend, op}`,
//! `idem_live_claims` (set by the reaper) and `idem_reaper_purged_total`; a resumer's
//! `idem_resume_found_total`, `idem_resume_calls_total{name, outcome}` and the lag gauge
//! `idem_resume_lag_seconds`, each resumed call in an INFO span `idem.resume`.

use crate::error::Error;
use crate::key::Digest;
use crate::store::Backend;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};
use tracing::field::Empty;
use tracing::level_filters::LevelFilter;
use tracing::Span;

/// How a call ended: the `idem.outcome` field and the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The body ran and its result (an `Ok`, or an `Err` a keep policy stores) was stored.
    Claimed,
    /// A finished attempt's stored result was returned; the body did not run.
    Replayed,
    /// A finished attempt's result was returned from the handle's local cache, without a
    /// round trip to the store; the body did not run.
    Cached,
    /// Another attempt holds the key (after `wait`, if any).
    InProgress,
    /// The key was used with another fingerprint.
    Mismatch,
    /// The body returned an `Err` and the key was released for a retry.
    Released,
    /// The attempt outlived its lease; its completion was refused.
    LeaseLost,
    /// A store step failed.
    StoreError,
    /// A result did not encode, or a stored one did not decode.
    CodecError,
    /// The body panicked; the key was released and the panic goes on.
    Panicked,
    /// The call was not set up: no installed handle, no key, a key that does not serialize.
    Invalid,
    /// The caller dropped the future before it finished; a claim it held lapses after its lease.
    Dropped,
    /// The call took over an abandoned attempt and parked the key, or found it parked.
    Parked,
    /// The call took over an abandoned attempt and its reconcile could not decide.
    Undecided,
    /// The key's result expired and its tombstone refused the call.
    Expired,
}

impl Ended {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ended::Claimed => "claimed",
            Ended::Replayed => "replayed",
            Ended::Cached => "cached",
            Ended::InProgress => "in-progress",
            Ended::Mismatch => "mismatch",
            Ended::Released => "released",
            Ended::LeaseLost => "lease-lost",
            Ended::StoreError => "store-error",
            Ended::CodecError => "codec-error",
            Ended::Panicked => "panicked",
            Ended::Invalid => "invalid",
            Ended::Dropped => "dropped",
            Ended::Parked => "parked",
            Ended::Undecided => "undecided",
            Ended::Expired => "expired",
        }
    }
}

/// How many hex digits of the key's digest traces show: enough to find the key in the store
/// (`current_key()` and errors carry the whole digest), short enough for a log line.
const KEY_PREFIX_HEX: usize = 12;

/// Displays the first [`KEY_PREFIX_HEX`] hex digits of a digest, without allocating.
pub(crate) struct KeyPrefix<'a>(pub(crate) &'a Digest);

impl fmt::Display for KeyPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; KEY_PREFIX_HEX];
        for (i, b) in self.0 .0.iter().take(KEY_PREFIX_HEX / 2).enumerate() {
            buf[2 * i] = HEX[(b >> 4) as usize];
            buf[2 * i + 1] = HEX[(b & 0xf) as usize];
        }
        // Only ASCII hex digits were written.
        f.write_str(std::str::from_utf8(&buf).unwrap_or_default())
    }
}

/// The span of one call, or `None` when no subscriber wants it. Created before the call is
/// set up, so that a call that fails to set up is traced too; the rest of its fields are
/// recorded as they become known.
pub(crate) fn call_span(name: &str) -> Option<Span> {
    // The macro's first check, done here so that without a subscriber at INFO nothing else
    // runs: not the disabled span's `log`-compatibility path (tracing's `log` feature is on,
    // sqlx turns it on), not its enter, exit and drop on every poll.
    if tracing::Level::INFO > LevelFilter::current() {
        return None;
    }
    let span = tracing::info_span!(
        "idem.call",
        idem.name = name,
        idem.store = Empty,
        idem.key = Empty,
        idem.token = Empty,
        idem.outcome = Empty,
        idem.takeover = Empty,
        idem.store_latency_us = Empty,
    );
    (!span.is_disabled()).then_some(span)
}

/// What one call reports: its outcome, token and store time, into its span and the metrics.
/// Reports on drop, so that every way out of a call (a return, a panic going on, the caller
/// dropping the future) reports exactly once.
pub(crate) struct Obs {
    /// Fields are recorded only when a subscriber wants the span.
    span: Option<Span>,
    /// Store steps are timed when they are traced or counted, not otherwise.
    timed: bool,
    /// The namespace as written (for a step: without its parent's key).
    name: Cow<'static, str>,
    backend: Backend,
    key: Option<Digest>,
    token: Option<u64>,
    store_time: Duration,
    outcome: Option<Ended>,
    /// This call counts in the process's live-claims gauge until it reports.
    #[cfg(feature = "metrics")]
    holds_claim: bool,
}

impl Obs {
    pub(crate) fn new(span: Option<Span>, name: Cow<'static, str>) -> Obs {
        Obs {
            timed: span.is_some() || cfg!(feature = "metrics"),
            span,
            name,
            backend: Backend::Other(""),
            key: None,
            token: None,
            store_time: Duration::ZERO,
            outcome: None,
            #[cfg(feature = "metrics")]
            holds_claim: false,
        }
    }

    /// The call is set up: its store and key are known.
    pub(crate) fn prepared(&mut self, backend: Backend, key: &Digest) {
        self.backend = backend;
        self.key = Some(*key);
        if let Some(span) = &self.span {
            span.record("idem.store", backend.name());
            span.record("idem.key", tracing::field::display(KeyPrefix(key)));
        }
    }

    /// This call holds the key with `token`: it runs the body.
    pub(crate) fn claimed(&mut self, token: u64) {
        self.token = Some(token);
        if let Some(span) = &self.span {
            span.record("idem.token", token);
        }
        #[cfg(feature = "metrics")]
        {
            self.holds_claim = true;
            metrics_impl::LIVE_CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// This call took over an abandoned attempt, and `outcome` is what it did: `adopted` (its
    /// reconcile found the effect), `rerun`, `parked` or `undecided`. The span's
    /// `idem.takeover` field and the `idem_takeovers_total{name, outcome}` counter.
    pub(crate) fn takeover(&mut self, outcome: &'static str) {
        if let Some(span) = &self.span {
            span.record("idem.takeover", outcome);
        }
        tracing::info!(
            idem.takeover = outcome,
            "idem: took over an abandoned attempt"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!("idem_takeovers_total", "name" => self.name.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// Runs one store step, adding its round trip to this call's store time.
    pub(crate) async fn store<F: Future>(&mut self, op: &'static str, step: F) -> F::Output {
        let start = self.timed.then(Instant::now);
        let out = step.await;
        self.took(op, start);
        out
    }

    /// Counts the store step `op` started at `start` (when store steps are timed).
    fn took(&mut self, op: &'static str, start: Option<Instant>) {
        if let Some(start) = start {
            let took = start.elapsed();
            self.store_time += took;
            store_latency(self.backend, op, took);
        }
    }

    /// The call ends with `outcome` (not an error of its own).
    pub(crate) fn done(&mut self, outcome: Ended) {
        self.outcome = Some(outcome);
    }

    /// The call ends with `e`. The failures an operator acts on get a WARN event here, where
    /// the error is still at hand; none of them carries a key or an argument value.
    pub(crate) fn fail(&mut self, e: &Error) {
        let ended = match e {
            Error::InProgress { .. } => Ended::InProgress,
            Error::Mismatch { .. } => Ended::Mismatch,
            Error::LeaseLost { .. } => Ended::LeaseLost,
            Error::OutcomeUnknown { .. } => Ended::Parked,
            Error::Expired { .. } => Ended::Expired,
            Error::Store(_) => Ended::StoreError,
            Error::Codec(_) => Ended::CodecError,
            Error::Key(_) | Error::Config(_) => Ended::Invalid,
        };
        self.outcome = Some(ended);
        let outcome = ended.as_str();
        let key = self.key.as_ref().map(KeyPrefix);
        let key = tracing::field::display(OptDisplay(key));
        let token = tracing::field::display(OptDisplay(self.token));
        match e {
            Error::LeaseLost { token, .. } => tracing::warn!(
                idem.name = &*self.name, idem.key = key, idem.token = *token,
                idem.outcome = outcome,
                "idem: the call outlived its lease and another attempt took over; its result was not stored"
            ),
            // The backend's message names the step and what went wrong; keys reach stores only
            // as digests, so it cannot hold a key's value.
            Error::Store(err) => tracing::warn!(
                idem.name = &*self.name, idem.key = key, idem.token = token,
                idem.outcome = outcome, error = %err,
                "idem: store failed"
            ),
            // Not the codec's message: it may quote the value (a result or an `Err`).
            Error::Codec(err) => tracing::warn!(
                idem.name = &*self.name, idem.key = key, idem.token = token,
                idem.outcome = outcome, kind = ?err.kind, type_name = err.type_name,
                "idem: a result did not encode, or a stored result did not decode"
            ),
            // A configuration message names no value; a key's serialization error may quote one.
            Error::Config(msg) => tracing::warn!(
                idem.name = &*self.name, idem.outcome = outcome, error = %msg,
                "idem: call not set up"
            ),
            Error::Key(_) => tracing::warn!(
                idem.name = &*self.name, idem.outcome = outcome,
                "idem: the key, scope or fingerprint could not be serialized"
            ),
            Error::OutcomeUnknown { .. } => tracing::warn!(
                idem.name = &*self.name, idem.key = key, idem.outcome = outcome,
                "idem: the key is parked: an abandoned attempt's outcome is unknown until an operator resolves it"
            ),
            Error::InProgress { .. } | Error::Mismatch { .. } | Error::Expired { .. } => {}
        }
    }
}

impl Drop for Obs {
    fn drop(&mut self) {
        let ended = self.outcome.unwrap_or(Ended::Dropped);
        let outcome = ended.as_str();
        let latency_us = u64::try_from(self.store_time.as_micros()).unwrap_or(u64::MAX);
        if let Some(span) = &self.span {
            span.record("idem.outcome", outcome);
            span.record("idem.store_latency_us", latency_us);
        }
        // The WARN outcomes had their event in `fail`; the rest get theirs here, inside the
        // span, which carries the name, key and token.
        match ended {
            Ended::Mismatch => tracing::info!(
                idem.outcome = outcome,
                idem.store_latency_us = latency_us,
                "idem: key reused with other arguments"
            ),
            Ended::Expired => tracing::info!(
                idem.outcome = outcome,
                idem.store_latency_us = latency_us,
                "idem: a late repeat of an expired key, refused by its tombstone"
            ),
            Ended::Panicked => tracing::warn!(
                idem.name = &*self.name,
                idem.key = %OptDisplay(self.key.as_ref().map(KeyPrefix)),
                idem.token = %OptDisplay(self.token),
                idem.outcome = outcome,
                "idem: the body panicked; key released"
            ),
            Ended::Claimed
            | Ended::Replayed
            | Ended::Cached
            | Ended::InProgress
            | Ended::Released
            | Ended::Dropped => tracing::debug!(
                idem.outcome = outcome,
                idem.store_latency_us = latency_us,
                "idem: call finished"
            ),
            Ended::Undecided => tracing::warn!(
                idem.name = &*self.name,
                idem.outcome = outcome,
                "idem: a reconcile could not decide an abandoned attempt; the key stays abandoned"
            ),
            Ended::LeaseLost
            | Ended::StoreError
            | Ended::CodecError
            | Ended::Invalid
            | Ended::Parked => {}
        }
        #[cfg(feature = "metrics")]
        {
            if self.holds_claim {
                metrics_impl::LIVE_CLAIMS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
            metrics_impl::count_call(std::mem::take(&mut self.name), outcome);
        }
    }
}

/// `Some(v)` as `v`, `None` as `-`.
struct OptDisplay<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for OptDisplay<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// Records one store round trip in `idem_store_latency_seconds` (feature `metrics`).
#[inline]
pub(crate) fn store_latency(backend: Backend, op: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics_impl::store_latency(backend, op, took);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, op, took);
}

/// Whether store steps outside a call (renewals, purges) are timed: only for metrics.
pub(crate) const TIME_BACKGROUND: bool = cfg!(feature = "metrics");

/// One reaper pass: `purged` records deleted; refreshes the live-claims gauge.
pub(crate) fn reaper_tick(purged: u64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("idem_reaper_purged_total").increment(purged);
        let live = metrics_impl::LIVE_CLAIMS.load(std::sync::atomic::Ordering::Relaxed);
        metrics::gauge!("idem_live_claims").set(live as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = purged;
}

/// One resumer pass (feature `metrics`): `idem_resume_found_total` counts the abandoned calls
/// found, and `idem_resume_lag_seconds` is how long the oldest of them has been abandoned
/// (0 when none was found).
pub(crate) fn resume_found(found: usize, lag: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("idem_resume_found_total").increment(found as u64);
        metrics::gauge!("idem_resume_lag_seconds").set(lag.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (found, lag);
}

/// One abandoned call a resumer handled (feature `metrics`):
/// `idem_resume_calls_total{name, outcome}`, `outcome` being `resumed`, `parked`, `failed` (to
/// be tried again) or `skipped` (another resumer or a caller had it).
pub(crate) fn resume_outcome(name: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_resume_calls_total", "name" => name.to_string(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome);
}

/// The outbox's gauges (feature `metrics`): messages pending, dead letters, and the age of the
/// oldest pending message (0 when none is pending), labelled with the outbox table.
#[cfg(any(feature = "outbox", feature = "outbox-mysql"))]
pub(crate) fn outbox_gauges(
    table: &str,
    pending: u64,
    dead: u64,
    oldest_pending: Option<std::time::Duration>,
) {
    #[cfg(feature = "metrics")]
    {
        let table = table.to_string();
        metrics::gauge!("idem_outbox_pending", "table" => table.clone()).set(pending as f64);
        metrics::gauge!("idem_outbox_dead", "table" => table.clone()).set(dead as f64);
        metrics::gauge!("idem_outbox_oldest_pending_seconds", "table" => table)
            .set(oldest_pending.map_or(0.0, |d| d.as_secs_f64()));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (table, pending, dead, oldest_pending);
}

/// Messages a relay handled (feature `metrics`): `idem_outbox_messages_total{table, outcome}`,
/// `outcome` being `delivered`, `failed` (to be retried) or `dead`.
#[cfg(any(feature = "outbox", feature = "outbox-mysql"))]
pub(crate) fn outbox_handled(table: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_outbox_messages_total", "table" => table.to_string(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (table, outcome);
}

#[cfg(feature = "metrics")]
mod metrics_impl {
    //! The metrics macros, given labels that are not literals, allocate a label vector and
    //! hash it on every emission, whether or not a recorder is installed: on the memory store
    //! that is a large part of a call's own work. The labels of a store step and of a call's
    //! outcome are the same every time, so their keys are built once: at compile time for the
    //! built-in stores' steps, once per thread for a call site.

    use crate::store::Backend;
    use metrics::{Key, Label, Level, Metadata};
    use std::borrow::Cow;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::hash::{BuildHasherDefault, Hasher};
    use std::sync::atomic::AtomicI64;
    use std::time::Duration;

    /// Calls of this process that hold a claim and run their body. Process-local: a store-wide
    /// count would need a query of every store, and the stores do not have one.
    pub(super) static LIVE_CLAIMS: AtomicI64 = AtomicI64::new(0);

    /// What the `counter!` and `histogram!` macros would pass for this module.
    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    const LATENCY: &str = "idem_store_latency_seconds";
    const CALLS: &str = "idem_calls_total";
    const OPS: [&str; 6] = ["claim", "complete", "release", "renew", "get", "purge"];

    /// One backend's row of `LATENCY_KEYS`, in the order of `OPS`.
    macro_rules! latency_row {
        ($backend:literal) => {
            latency_row!($backend; "claim", "complete", "release", "renew", "get", "purge")
        };
        ($backend:literal; $($op:literal),*) => {
            [$({
                static LABELS: [Label; 2] =
                    [Label::from_static_parts("backend", $backend), Label::from_static_parts("op", $op)];
                Key::from_static_parts(LATENCY, &LABELS)
            }),*]
        };
    }

    /// `idem_store_latency_seconds{backend, op}` of the built-in stores, in the order of
    /// `Backend::BUILT_IN` and `OPS`.
    static LATENCY_KEYS: [[Key; OPS.len()]; Backend::BUILT_IN.len()] = [
        latency_row!("memory"),
        latency_row!("sqlite"),
        latency_row!("postgres"),
        latency_row!("redis"),
        latency_row!("mysql"),
        latency_row!("dynamodb"),
    ];

    pub(super) fn store_latency(backend: Backend, op: &'static str, took: Duration) {
        let b = backend.built_in_index();
        let o = OPS.iter().position(|o| *o == op);
        match (b, o) {
            (Some(b), Some(o)) => {
                metrics::with_recorder(|r| r.register_histogram(&LATENCY_KEYS[b][o], &METADATA))
                    .record(took.as_secs_f64())
            }
            // Another store's backend name: built per emission.
            _ => metrics::histogram!(LATENCY, "backend" => backend.name(), "op" => op)
                .record(took.as_secs_f64()),
        }
    }

    /// How many call keys a thread keeps; past that, keys are built per emission.
    const CALL_KEYS_PER_THREAD: usize = 256;

    /// The address and length of a static name and the address of an outcome: a `&'static
    /// str` never changes, so its address stands for its content (two addresses of one text
    /// only make two entries).
    type CallId = (usize, usize, usize);
    type CallKeys = HashMap<CallId, Key, BuildHasherDefault<AddrHasher>>;

    /// Hashes addresses with one multiply each: SipHash took most of a cached emission.
    #[derive(Default)]
    struct AddrHasher(u64);

    impl Hasher for AddrHasher {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.write_u64(u64::from(*b));
            }
        }
        fn write_usize(&mut self, n: usize) {
            self.write_u64(n as u64);
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    thread_local! {
        /// `idem_calls_total{name, outcome}` keys of static names.
        static CALL_KEYS: RefCell<CallKeys> = RefCell::new(CallKeys::default());
    }

    pub(super) fn count_call(name: Cow<'static, str>, outcome: &'static str) {
        if let Cow::Borrowed(name) = name {
            if CALL_KEYS.with(|keys| count_cached(keys, name, outcome)) {
                return;
            }
        }
        metrics::counter!(CALLS, "name" => name, "outcome" => outcome).increment(1);
    }

    /// Counts the call with this thread's key of (`name`, `outcome`); false when the cache is
    /// full, or busy (a recorder that counts an idempotent call of its own while it registers).
    fn count_cached(keys: &RefCell<CallKeys>, name: &'static str, outcome: &'static str) -> bool {
        let Ok(mut keys) = keys.try_borrow_mut() else {
            return false;
        };
        let id = (
            name.as_ptr() as usize,
            name.len(),
            outcome.as_ptr() as usize,
        );
        // The length first: a cached key (every call but the first) is looked up once, below.
        if keys.len() >= CALL_KEYS_PER_THREAD && !keys.contains_key(&id) {
            return false;
        }
        let key = keys.entry(id).or_insert_with(|| {
            let labels = [
                Label::from_static_parts("name", name),
                Label::from_static_parts("outcome", outcome),
            ];
            Key::from_parts(CALLS, labels.to_vec())
        });
        let counter = metrics::with_recorder(|r| r.register_counter(key, &METADATA));
        drop(keys);
        counter.increment(1);
        true
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn latency_keys_carry_their_backend_and_op() {
            for (b, backend) in Backend::BUILT_IN.iter().enumerate() {
                for (o, op) in OPS.iter().enumerate() {
                    let key = &LATENCY_KEYS[b][o];
                    let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
                    assert_eq!(key.name(), LATENCY);
                    assert_eq!(labels, [("backend", backend.name()), ("op", *op)]);
                }
            }
        }

        #[test]
        fn a_cached_call_key_is_the_macros_key() {
            let keys = RefCell::new(CallKeys::default());
            assert!(count_cached(&keys, "pay", "claimed"));
            assert!(count_cached(&keys, "pay", "claimed"));
            assert!(count_cached(&keys, "pay", "replayed"));
            let keys = keys.borrow();
            assert_eq!(keys.len(), 2);
            let expected = |outcome| {
                Key::from_parts(
                    CALLS,
                    vec![Label::new("name", "pay"), Label::new("outcome", outcome)],
                )
            };
            let mut found: Vec<_> = keys.values().cloned().collect();
            found.sort_by_key(|k| k.labels().nth(1).map(|l| l.value().to_owned()));
            assert_eq!(found, [expected("claimed"), expected("replayed")]);
        }

        #[test]
        fn a_full_or_busy_cache_leaves_the_key_to_the_macro() {
            let keys = RefCell::new(CallKeys::default());
            for i in 0..CALL_KEYS_PER_THREAD {
                let name: &'static str = Box::leak(format!("site-{i}").into_boxed_str());
                assert!(count_cached(&keys, name, "claimed"));
            }
            assert!(!count_cached(&keys, "one-more", "claimed"));
            assert_eq!(keys.borrow().len(), CALL_KEYS_PER_THREAD);
            let busy = RefCell::new(CallKeys::default());
            let _held = busy.borrow_mut();
            assert!(!count_cached(&busy, "pay", "claimed"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_prefix_is_the_start_of_the_hex_digest() {
        let d = Digest([0xab; 32]);
        assert_eq!(KeyPrefix(&d).to_string(), "abababababab");
        assert!(d.to_hex().starts_with(&KeyPrefix(&d).to_string()));
    }
}
