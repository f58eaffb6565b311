//! The logical call a body runs in: what `current_key()` reads, and what steps nest under.

use crate::handle::Idem;
use crate::key::Digest;
use std::sync::atomic::{AtomicU32, Ordering};
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
