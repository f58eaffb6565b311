//! The decision table: what a claim's outcome means for this call.
//!
//! Stores make claims atomic; this module is the only place that decides between running the
//! body, replaying a stored result, answering "in progress" and refusing a mismatch.

use crate::key::Digest;
use crate::record::{ClaimOutcome, Record, Status};
use std::time::Duration;

/// What a call does after its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The key is ours: run the body, then complete or release with this token.
    Run {
        /// The fencing token of this attempt's claim.
        token: u64,
    },
    /// A finished attempt with the same arguments: return its stored value.
    Replay {
        /// The stored value.
        value: Vec<u8>,
        /// How long the record stays live (its TTL left): a result kept in this process is
        /// kept no longer.
        ttl_left: Duration,
    },
    /// An attempt with the same arguments is running: ask again after this long
    /// ([`retry_after`] of the lease it has left).
    InProgress {
        /// When to ask again (the engine's one retry rule).
        retry_after: Duration,
    },
    /// The key was claimed with other arguments.
    Mismatch,
}

/// Decides what a call does given what its claim found.
pub fn decide(outcome: ClaimOutcome, fingerprint: &Digest) -> Decision {
    match outcome {
        ClaimOutcome::Claimed { token } => Decision::Run { token },
        ClaimOutcome::Existing(record) => decide_existing(record, fingerprint),
    }
}

/// Decides what a call does given a live record that is not its own.
pub fn decide_existing(record: Record, fingerprint: &Digest) -> Decision {
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    let left = record.remaining();
    match record.status {
        Status::InProgress => Decision::InProgress {
            retry_after: retry_after(left),
        },
        Status::Completed => Decision::Replay {
            value: record.value.unwrap_or_default(),
            ttl_left: left,
        },
    }
}

/// The longest "retry after" idem ever suggests.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

/// When a duplicate should ask again about an attempt in flight whose lease has `lease_left`:
/// the lease left, capped at [`MAX_RETRY_AFTER`]. This is the one rule behind both
/// `Error::InProgress`'s `retry_after` and the HTTP layer's `Retry-After`.
///
/// The lease left is when the key frees *at the latest* (if its holder died), not when the
/// body will finish: a live holder renews it every third of a lease, so uncapped it would tell
/// a caller to wait most of a lease (30 s by default) for a body that may take milliseconds.
/// Capped, a caller asks again soon, and never after the key is free.
pub fn retry_after(lease_left: Duration) -> Duration {
    lease_left.min(MAX_RETRY_AFTER)
}

/// The liveness rule every store applies: live while `now < expires_at`.
pub fn is_live(expires_at: i64, now: i64) -> bool {
    now < expires_at
}

/// The fencing token of a new claim: above the previous token of the key, and above anything
/// issued before `now_ms` (microseconds of the store clock), so a key purged and created again
/// never hands out a token an old, stalled attempt still holds.
///
/// The floor alone does not cover a key whose record vanished within the millisecond it was
/// claimed in: a second claim in that millisecond would get the first one's token again. So a
/// record is never deleted while it can still matter: a release ends it ([`ended_at`]) and
/// keeps its token, and only [`may_forget`] lets a store drop it.
pub fn next_token(previous: Option<u64>, now_ms: i64) -> u64 {
    let floor = (now_ms.max(0) as u64).saturating_mul(1000);
    previous.map_or(floor, |p| p.saturating_add(1).max(floor))
}

/// The `expires_at` a release or a forced release writes: the record *ends* rather than
/// disappears. It is no longer live at once (so the next claim takes the key over), and it
/// keeps its token, which that claim reads as `previous` and passes ([`next_token`]). Deleting
/// it instead would let a claim in the same millisecond hand out the released token again,
/// and the released attempt (or one whose release answer was lost and who retries) could then
/// renew, complete or release its successor's claim.
pub fn ended_at(now_ms: i64) -> i64 {
    now_ms
}

/// Whether a store may delete (purge, evict, expire) a record that ends at `expires_at`: only
/// from the millisecond after, when the floor of [`next_token`] is above every token the key
/// handed out up to its end. A record that ended at `now` must stay for claims in `now`.
pub fn may_forget(expires_at: i64, now_ms: i64) -> bool {
    expires_at < now_ms
}

/// How long a store that forgets records by itself (Redis key expiry) keeps an ended record:
/// well past [`may_forget`], so that a replica's or a failed-over primary's clock, which may
/// lag a little, still finds its token.
pub const KEEP_ENDED: Duration = Duration::from_secs(1);

/// Whether the attempt with `token` holds the key, so that it may renew, complete or release
/// it: the record is in progress, carries that token, and is live. A record another attempt
/// took over carries another token; one that was released or force-released, or whose lease
/// lapsed, is no longer live: in every case the attempt's step is refused (`LeaseLost` for a
/// completion).
pub fn holds(status: Status, record_token: u64, expires_at: i64, token: u64, now_ms: i64) -> bool {
    status == Status::InProgress && record_token == token && is_live(expires_at, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, fp: u8) -> Record {
        Record {
            name: "n".into(),
            key: Digest([0; 32]),
            fingerprint: Digest([fp; 32]),
            token: 1,
            status,
            value: Some(vec![1]),
            created_at: 0,
            expires_at: 1500,
            now: 1000,
        }
    }

    #[test]
    fn table() {
        let fp = Digest([7; 32]);
        assert!(matches!(
            decide(ClaimOutcome::Claimed { token: 3 }, &fp),
            Decision::Run { token: 3 }
        ));
        assert!(matches!(
            decide_existing(record(Status::Completed, 7), &fp),
            Decision::Replay { value, ttl_left } if value == vec![1] && ttl_left == Duration::from_millis(500)
        ));
        assert!(matches!(
            decide_existing(record(Status::InProgress, 7), &fp),
            Decision::InProgress { retry_after } if retry_after == Duration::from_millis(500)
        ));
        assert!(matches!(
            decide_existing(record(Status::InProgress, 8), &fp),
            Decision::Mismatch
        ));
        assert!(matches!(
            decide_existing(record(Status::Completed, 8), &fp),
            Decision::Mismatch
        ));
    }

    #[test]
    fn retry_after_is_the_lease_left_capped() {
        assert_eq!(
            retry_after(Duration::from_millis(300)),
            Duration::from_millis(300)
        );
        assert_eq!(retry_after(Duration::from_millis(29_997)), MAX_RETRY_AFTER);
        assert_eq!(retry_after(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn tokens_only_grow() {
        assert_eq!(next_token(None, 5), 5000);
        assert_eq!(next_token(Some(5000), 5), 5001);
        assert_eq!(next_token(Some(10), 5), 5000);
        assert!(is_live(11, 10) && !is_live(10, 10));
    }

    /// A record released in the millisecond of its claim keeps its token, so a claim in that
    /// same millisecond gets a greater one; it may be forgotten only a millisecond later.
    #[test]
    fn an_ended_record_keeps_its_token_until_the_clock_moves_on() {
        let first = next_token(None, 5);
        let end = ended_at(5);
        assert!(!is_live(end, 5) && !may_forget(end, 5) && may_forget(end, 6));
        assert_eq!(next_token(Some(first), 5), first + 1);
        assert!(next_token(None, 6) > first);
        assert!(holds(Status::InProgress, first, 7, first, 5));
        assert!(!holds(Status::InProgress, first, end, first, 5), "ended");
        assert!(
            !holds(Status::InProgress, first, 7, first + 1, 5),
            "other token"
        );
        assert!(!holds(Status::Completed, first, 7, first, 5), "completed");
    }
}
