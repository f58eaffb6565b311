//! Running an attempt under a lease: the claim is renewed every `lease / 3` from the moment it
//! is taken until its result is stored (or its key released), not only while the body runs.
//!
//! The heartbeat runs inside the call's own future, beside the attempt, rather than in a
//! spawned task: the body may borrow (`&self`, `&mut` arguments), so it cannot be `'static`,
//! and when the caller drops the future, the heartbeat stops with it — the claim then lapses
//! after its lease, as the contract says. A body that blocks its thread stops the heartbeat too:
//! that is the "attempt outlived its lease" case, and its completion is then fenced.
//!
//! A completion must not outlive its own lease: a store that retries a completion across lost
//! connections could otherwise land it (or be refused, `LeaseLost`) long after another attempt
//! took the key over. So the renewals go on while the result is being stored, a renewal that
//! fails is retried at once (backing off up to the period) rather than a period later, and a
//! completion or release is given only as long as the lease this attempt can vouch for
//! ([`Held::bound`]).

use crate::error::Error;
use crate::key::Digest;
use crate::observe::{self, KeyPrefix};
use crate::store::{BoxFuture, Store};
use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// The first retry of a failed renewal comes this soon; it doubles up to the renewal period.
const RENEW_RETRY: Duration = Duration::from_millis(10);

/// How long this attempt's claim is known to be live: from the start of its last successful
/// claim or renewal, plus the lease. Shared by the heartbeat, which extends it, and the
/// completion, which it bounds.
pub(crate) struct Held {
    origin: Instant,
    lease: Duration,
    /// Microseconds from `origin` to the end of the lease as last confirmed.
    until_us: AtomicU64,
    /// The body has returned: a renewal refused now may be the completion landing first.
    finishing: AtomicBool,
}

impl Held {
    /// A claim sent at `sent` with this lease.
    pub(crate) fn new(sent: Instant, lease: Duration) -> Held {
        Held {
            origin: sent,
            lease,
            until_us: AtomicU64::new(micros(lease)),
            finishing: AtomicBool::new(false),
        }
    }

    /// A renewal sent at `sent` succeeded.
    fn confirm(&self, sent: Instant) {
        let until = micros(sent.saturating_duration_since(self.origin) + self.lease);
        self.until_us.fetch_max(until, Ordering::Relaxed);
    }

    /// When the lease ends, as far as this attempt knows.
    fn until(&self) -> Instant {
        self.origin + Duration::from_micros(self.until_us.load(Ordering::Relaxed))
    }

    /// Runs `step` (storing the result, or releasing the key) while the lease lasts, and at
    /// least one renewal period from now, so that an attempt whose body overran its lease
    /// still makes its one fenced try. `None`: the lease ran out first (the store kept
    /// failing, renewals too) and `step` was abandoned.
    pub(crate) async fn bound<F: Future>(&self, step: F) -> Option<F::Output> {
        self.finishing.store(true, Ordering::Relaxed);
        let floor = Instant::now() + period(self.lease);
        let mut step = std::pin::pin!(step);
        loop {
            let deadline = self.until().max(floor);
            match tokio::time::timeout_at(deadline, step.as_mut()).await {
                Ok(out) => return Some(out),
                // Renewed meanwhile: keep going.
                Err(_) if self.until().max(floor) > Instant::now() => continue,
                Err(_) => return None,
            }
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn period(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Polls `body`, catching its panic.
pub(crate) async fn caught<F: Future>(body: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut body = std::pin::pin!(body);
    std::future::poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(cx))) {
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(payload)),
        },
    )
    .await
}

/// Polls `attempt` (the body, then its completion or release) to its end, renewing the claim
/// of `key`/`token` every `lease / 3` meanwhile and recording each renewal in `held`.
pub(crate) async fn run_leased<F: Future>(
    store: &dyn Store,
    name: &str,
    key: &Digest,
    token: u64,
    held: &Held,
    attempt: F,
) -> F::Output {
    let period = period(held.lease);
    let mut attempt = std::pin::pin!(attempt);
    let mut sleep = std::pin::pin!(tokio::time::sleep(period));
    let mut renewing: Option<BoxFuture<'_, Result<bool, Error>>> = None;
    // When the renewal in flight was sent: its success extends the lease from then.
    let mut sent = Instant::now();
    let mut retry = RENEW_RETRY;
    let mut lost = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = attempt.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        while !lost {
            if let Some(renew) = renewing.as_mut() {
                let Poll::Ready(res) = renew.as_mut().poll(cx) else {
                    break;
                };
                renewing = None;
                if observe::TIME_BACKGROUND {
                    observe::store_latency(store.backend(), "renew", sent.elapsed());
                }
                let next = match res {
                    Ok(true) => {
                        held.confirm(sent);
                        retry = RENEW_RETRY;
                        period
                    }
                    Ok(false) => {
                        // Another attempt holds the key now, or (once the body has returned)
                        // the completion landed first; either way there is nothing to renew.
                        if !held.finishing.load(Ordering::Relaxed) {
                            tracing::warn!(
                                idem.name = name, idem.key = %KeyPrefix(key), idem.token = token,
                                "idem: lease lost while the body runs; its result will not be stored"
                            );
                        }
                        lost = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(
                            idem.name = name, idem.key = %KeyPrefix(key), idem.token = token,
                            error = %e, retry_in_ms = retry.as_millis() as u64,
                            "idem: lease renewal failed; retrying"
                        );
                        let next = retry.min(period);
                        retry = (retry * 2).min(period);
                        next
                    }
                };
                sleep.as_mut().reset(Instant::now() + next);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                break;
            }
            sent = Instant::now();
            renewing = Some(store.renew(key, token, held.lease));
        }
        Poll::Pending
    })
    .await
}
