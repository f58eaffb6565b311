//! The logical call a body runs in: what `current_key()` reads, and what steps nest under.

use crate::handle::Idem;
use crate::key::Digest;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The call a body is running in.
#[derive(Clone)]
pub(crate) struct CallContext {
    pub(crate) key: Digest,
    pub(crate) token: u64,
    /// The handle the call runs on: its steps inherit it.
    pub(crate) idem: Idem,
    pub(crate) scope: Option<Vec<u8>>,
    pub(crate) ttl: Duration,
    /// How many outbox messages this attempt enqueued so far: the next one's position, which
    /// with `key` makes its id (the same on every retry, since a retry starts again at 0).
    pub(crate) enqueued: Arc<AtomicU32>,
    /// `Some` when this attempt took over an abandoned one.
    pub(crate) recovery: Option<Recovery>,
    /// What this attempt's reconcile decided ([`Reconciled`] as a `u8`), for the engine to
    /// read once the body returns.
    pub(crate) reconciled: Arc<AtomicU8>,
}

/// What a reconcile decided, as the engine reads it after the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reconciled {
    /// No reconcile ran, or it said the earlier effect did not happen (the body ran).
    No = 0,
    /// The earlier effect happened: the reconcile's value is this attempt's result.
    Applied = 1,
    /// Undecided: its error is returned and the key stays abandoned.
    Undecided = 2,
}

impl CallContext {
    /// Records what this attempt's reconcile decided.
    pub(crate) fn reconciled(&self, r: Reconciled) {
        self.reconciled.store(r as u8, Ordering::Relaxed);
    }
}

/// Reads what a reconcile decided.
pub(crate) fn reconciled(cell: &AtomicU8) -> Reconciled {
    match cell.load(Ordering::Relaxed) {
        1 => Reconciled::Applied,
        2 => Reconciled::Undecided,
        _ => Reconciled::No,
    }
}

/// An attempt that took over an abandoned one: what [`recovery`] returns inside its body or
/// reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    attempt: u32,
    abandoned_at: std::time::SystemTime,
}

impl Recovery {
    pub(crate) fn new(attempt: u32, abandoned_at_ms: i64) -> Recovery {
        let since = Duration::from_millis(abandoned_at_ms.max(0) as u64);
        Recovery {
            attempt,
            abandoned_at: std::time::UNIX_EPOCH + since,
        }
    }

    /// This attempt's number: 2 for the first takeover of a key, 3 for the next.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the abandoned attempt began, on the store's clock.
    pub fn abandoned_at(&self) -> std::time::SystemTime {
        self.abandoned_at
    }
}

/// Inside the body (or the reconcile) of an idempotent call: `Some` when this attempt took over
/// an abandoned one — its process died, its host froze or its caller dropped the future after
/// it claimed the key — whose effect may or may not have happened; `None` on a first attempt
/// and outside an idempotent call.
pub fn recovery() -> Option<Recovery> {
    CURRENT.try_with(|c| c.recovery).ok().flatten()
}

tokio::task_local! {
    pub(crate) static CURRENT: CallContext;
}

/// Inside the body of an idempotent call: a stable hex id of this logical call, the same on
/// every retry (it is the key's digest). Pass it to a downstream API as that call's own
/// idempotency key. `None` outside an idempotent call.
pub fn current_key() -> Option<String> {
    CURRENT.try_with(|c| c.key.to_hex()).ok()
}

/// Inside the body of an idempotent call: the fencing token of this attempt. A downstream
/// store can refuse writes carrying a token lower than one it has seen.
pub fn current_token() -> Option<u64> {
    CURRENT.try_with(|c| c.token).ok()
}

/// The call the current body runs in, for steps to nest under.
pub(crate) fn current() -> Option<CallContext> {
    CURRENT.try_with(|c| c.clone()).ok()
}

/// Inside an idempotent call: the call's key and the position of the next message it enqueues
/// in an outbox (0, 1, 2, … in the order of the body's `enqueue`s).
#[cfg_attr(
    not(any(feature = "outbox", feature = "outbox-mysql")),
    allow(dead_code)
)]
pub(crate) fn next_position() -> Option<(Digest, u32)> {
    CURRENT
        .try_with(|c| (c.key, c.enqueued.fetch_add(1, Ordering::Relaxed)))
        .ok()
}
