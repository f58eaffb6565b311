//! Running the body under a lease: the claim is renewed every `lease / 3` while the body runs.
//!
//! The heartbeat runs inside the call's own future, beside the body, rather than in a spawned
//! task: the body may borrow (`&self`, `&mut` arguments), so it cannot be `'static`, and when
//! the caller drops the future, the heartbeat stops with it — the claim then lapses after its
//! lease, as the contract says. A body that blocks its thread stops the heartbeat too: that is
//! the "attempt outlived its lease" case, and its completion is then fenced.

use crate::error::Error;
use crate::key::Digest;
use crate::observe::{self, KeyPrefix};
use crate::store::{BoxFuture, Store};
use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

/// How the body ended.
pub(crate) enum Finished<O> {
    Done(O),
    Panicked(Box<dyn Any + Send + 'static>),
}

/// Polls `body` to completion, renewing the claim of `key`/`token` every `lease / 3`.
pub(crate) async fn run_leased<F: Future>(
    store: &dyn Store,
    name: &str,
    key: &Digest,
    token: u64,
    lease: Duration,
    body: F,
) -> Finished<F::Output> {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut body = std::pin::pin!(body);
    let mut sleep = std::pin::pin!(tokio::time::sleep(period));
    let mut renewing: Option<BoxFuture<'_, Result<bool, Error>>> = None;
    // When the renewal in flight started (timed for the latency histogram only).
    let mut renew_started: Option<std::time::Instant> = None;
    let mut lost = false;
    std::future::poll_fn(|cx| {
        match catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(cx))) {
            Ok(Poll::Ready(out)) => return Poll::Ready(Finished::Done(out)),
            Ok(Poll::Pending) => {}
            Err(payload) => return Poll::Ready(Finished::Panicked(payload)),
        }
        while !lost {
            if let Some(renew) = renewing.as_mut() {
                let Poll::Ready(res) = renew.as_mut().poll(cx) else {
                    break;
                };
                renewing = None;
                if let Some(start) = renew_started.take() {
                    observe::store_latency(store.backend(), "renew", start.elapsed());
                }
                match res {
                    Ok(true) => {}
                    Ok(false) => {
                        // Another attempt holds the key now; completion will be refused.
                        tracing::warn!(
                            idem.name = name, idem.key = %KeyPrefix(key), idem.token = token,
                            "idem: lease lost while the body runs; its result will not be stored"
                        );
                        lost = true;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(
                            idem.name = name, idem.key = %KeyPrefix(key), idem.token = token,
                            error = %e, "idem: lease renewal failed; retrying at the next period"
                        )
                    }
                }
                sleep.as_mut().reset(Instant::now() + period);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                break;
            }
            renewing = Some(store.renew(key, token, lease));
            if observe::TIME_BACKGROUND {
                renew_started = Some(std::time::Instant::now());
            }
        }
        Poll::Pending
    })
    .await
}
