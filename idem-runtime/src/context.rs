//! The logical call a body runs in: what `current_key()` reads, and what steps nest under.

use crate::key::Digest;

/// The call a body is running in.
#[derive(Clone)]
pub(crate) struct CallContext {
    pub(crate) key: Digest,
    pub(crate) token: u64,
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
