//! A resumer's view of the call it resumes: the resumer runs the function inside [`resuming`],
//! and the engine, for the call with that key (not its steps), says whether its claim took the
//! abandoned attempt over and whether it parked the key; and it asks the resumer's retry budget
//! what a failed attempt leaves behind (abandoned for another try, or parked).

use crate::key::Digest;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

tokio::task_local! {
    static RESUMING: Arc<Slot>;
}

/// One resumed call, as the resumer and the engine share it.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The key of the call resumed.
    key: Digest,
    /// How many failed tries a resumed call gets before it is parked.
    tries: u32,
    took_over: AtomicBool,
    parked: AtomicBool,
}

/// What a failed attempt of a resumed call leaves behind, instead of releasing its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Abandoned: the next resumer pass tries again, as attempt + 1.
    Abandon,
    /// Parked: the retry budget is spent; an operator resolves it.
    Park,
}

impl Slot {
    /// The slot of the call with key `key`, with a retry budget of `tries`.
    pub(crate) fn new(key: Digest, tries: u32) -> Arc<Slot> {
        Arc::new(Slot {
            key,
            tries,
            took_over: AtomicBool::new(false),
            parked: AtomicBool::new(false),
        })
    }

    /// The call's claim took the abandoned attempt over (this resumer holds it).
    pub(crate) fn took_over(&self) -> bool {
        self.took_over.load(Ordering::Acquire)
    }

    /// The call parked the key (`on_abandoned = park`, or its retry budget spent).
    pub(crate) fn parked(&self) -> bool {
        self.parked.load(Ordering::Acquire)
    }
}

/// Runs `call` (a resumable function called with its stored arguments) as the resumed call of
/// `slot`.
pub(crate) async fn resuming<F: Future>(slot: Arc<Slot>, call: F) -> F::Output {
    RESUMING.scope(slot, call).await
}

/// The slot of the resumed call with key `key`, when this is one.
fn slot_of<R>(key: &Digest, f: impl FnOnce(&Slot) -> R) -> Option<R> {
    RESUMING
        .try_with(|slot| (slot.key == *key).then(|| f(slot)))
        .ok()
        .flatten()
}

/// The engine's note: the claim of the call with `key` took over an abandoned attempt.
pub(crate) fn note_takeover(key: &Digest) {
    slot_of(key, |s| s.took_over.store(true, Ordering::Release));
}

/// The engine's note: the call with `key` parked its key.
pub(crate) fn note_parked(key: &Digest) {
    slot_of(key, |s| s.parked.store(true, Ordering::Release));
}

/// For an `Err` the policy would release, in the resumed call with `key` at `attempt`: what to
/// do instead; `None` when this is not a resumed call (release it as usual). Attempt 2 is the
/// first resumed try, so a budget of `tries` parks at attempt `tries + 1`.
pub(crate) fn after_failure(key: &Digest, attempt: u32) -> Option<AfterFailure> {
    slot_of(key, |s| {
        if attempt.saturating_sub(1) >= s.tries {
            s.parked.store(true, Ordering::Release);
            AfterFailure::Park
        } else {
            AfterFailure::Abandon
        }
    })
}
