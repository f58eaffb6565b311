//! The decision table: what a claim's outcome means for this call.
//!
//! Stores make claims atomic; this module is the only place that decides between running the
//! body, replaying a stored result, answering "in progress", answering "outcome unknown" (a
//! parked key) and refusing a mismatch.
//!
//! It also holds the rules every store applies to records: liveness ([`is_live`]), fencing
//! ([`holds`], [`next_token`]), ends ([`ended_at`]), abandonment ([`abandoned`]) and forgetting
//! ([`may_forget`] of `keep_until`).

use crate::key::Digest;
use crate::record::{ClaimOutcome, Record, Status, Takeover};
use std::time::Duration;

/// What a call does after its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The key is ours: run the body, then complete or release with this token.
    Run {
        /// The fencing token of this attempt's claim.
        token: u64,
        /// `Some` when the claim took over an abandoned attempt: the function's choice
        /// (reconcile, rerun, park) applies before the body.
        takeover: Option<Takeover>,
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
    /// The key is parked, with the same arguments: an abandoned attempt's outcome is unknown
    /// until an operator resolves it; the body must not run.
    OutcomeUnknown,
    /// The key's result expired and its tombstone is kept ([`tombstoned`]), with the same
    /// arguments: the body ran once already and must not run again.
    Expired {
        /// When the result expired (the record's `expires_at`).
        expired_at: i64,
        /// When the tombstone ends (the record's `keep_until`).
        until: i64,
    },
}

/// Decides what a call does given what its claim found.
pub fn decide(outcome: ClaimOutcome, fingerprint: &Digest) -> Decision {
    match outcome {
        ClaimOutcome::Claimed { token, takeover } => Decision::Run { token, takeover },
        ClaimOutcome::Existing(record) => decide_existing(record, fingerprint),
    }
}

/// Decides what a call does given a live record that is not its own.
pub fn decide_existing(record: Record, fingerprint: &Digest) -> Decision {
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    if tombstoned(
        record.status,
        record.expires_at,
        record.keep_until,
        record.now,
    ) {
        return Decision::Expired {
            expired_at: record.expires_at,
            until: record.keep_until,
        };
    }
    let left = record.remaining();
    match record.status {
        // A released record is never live (it ends as it is released); were one read live, it
        // is as good as free: ask again at once, and the claim takes it.
        Status::InProgress | Status::Released => Decision::InProgress {
            retry_after: retry_after(left),
        },
        Status::Completed => Decision::Replay {
            value: record.value.unwrap_or_default(),
            ttl_left: left,
        },
        Status::Parked => Decision::OutcomeUnknown,
    }
}

/// The longest `ttl`, `lease` or `wait` a call takes: 100 years (36 500 days). Longer is a
/// mistake (a unit slip, a number pasted twice), not a retention policy, and would overflow the
/// stores' millisecond clocks: a call with one fails with `Error::Config`, and the attribute
/// refuses such a literal at compile time (idem-macros/src/ast.rs holds the same figure).
pub const MAX_DURATION: Duration = Duration::from_secs(36_500 * 86_400);

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

/// The liveness rule every store applies: live while `now < expires_at`. A parked record's
/// `expires_at` is `i64::MAX`: it is live until resolved.
pub fn is_live(expires_at: i64, now: i64) -> bool {
    now < expires_at
}

/// Whether a record is **abandoned**: in progress, its lease lapsed (not live) without a result
/// or a release, and still kept (`!may_forget(keep_until, now)`). The next claim takes it over
/// as attempt + 1. A released record ([`Status::Released`]) is never abandoned: its attempt
/// ended on purpose, and nothing is left to reconcile or park; nor is one kept no longer (it is
/// as good as never seen).
pub fn abandoned(status: Status, expires_at: i64, keep_until: i64, now: i64) -> bool {
    status == Status::InProgress && !is_live(expires_at, now) && !may_forget(keep_until, now)
}

/// Whether a record is a **tombstone**: completed, its result expired (not live), and still
/// kept (`now < keep_until`). A completion with a tombstone keeps its record past its TTL
/// (`keep_until = expires_at + tombstone`); without one `keep_until = expires_at`, so a
/// completed record is never a tombstone. A claim finds a tombstone as it finds a live record
/// ([`occupied`]): nothing is written, and the call gets `Expired` instead of running again.
/// Its value is not replayed (stores drop it once the TTL is over, or do not return it).
pub fn tombstoned(status: Status, expires_at: i64, keep_until: i64, now: i64) -> bool {
    status == Status::Completed && !is_live(expires_at, now) && is_live(keep_until, now)
}

/// Whether a record keeps a claim out: it is live, or it is a tombstone ([`tombstoned`]). The
/// rule behind every store's claim (and nothing else: `get`, renewals and completions go by
/// liveness alone).
pub fn occupied(status: Status, expires_at: i64, keep_until: i64, now: i64) -> bool {
    is_live(expires_at, now) || tombstoned(status, expires_at, keep_until, now)
}

/// `keep_until` of a completion at `now`: the end of its TTL, and with a tombstone that much
/// longer (saturating).
pub fn completed_keep_until(expires_at: i64, tombstone: Duration) -> i64 {
    expires_at.saturating_add(i64::try_from(tombstone.as_millis()).unwrap_or(i64::MAX))
}

/// What a claim at `record.now` that replaces `record` (not live) takes over: `Some` when it is
/// [`abandoned`], with the next attempt number and the abandoned attempt's start.
pub fn takeover_of(record: &Record) -> Option<Takeover> {
    abandoned(
        record.status,
        record.expires_at,
        record.keep_until,
        record.now,
    )
    .then(|| Takeover {
        attempt: record.attempt.saturating_add(1),
        abandoned_at: record.created_at,
    })
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

/// Whether a store may delete (purge, evict, expire) a record kept until `keep_until`
/// ([`Record::keep_until`], never before its `expires_at`): only from the millisecond after,
/// when the floor of [`next_token`] is above every token the key handed out up to its end. A
/// record that ended at `now` must stay for claims in `now`; an abandoned one stays as long as
/// its claim asked (its result's TTL), so that the next call still tells it from a free key;
/// a parked one (`i64::MAX`) never goes by itself.
pub fn may_forget(keep_until: i64, now_ms: i64) -> bool {
    keep_until < now_ms
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
            attempt: 1,
            keep_until: 1500,
            now: 1000,
        }
    }

    #[test]
    fn table() {
        let fp = Digest([7; 32]);
        assert!(matches!(
            decide(
                ClaimOutcome::Claimed {
                    token: 3,
                    takeover: None
                },
                &fp
            ),
            Decision::Run {
                token: 3,
                takeover: None
            }
        ));
        let takeover = Takeover {
            attempt: 2,
            abandoned_at: 5,
        };
        assert_eq!(
            decide(
                ClaimOutcome::Claimed {
                    token: 4,
                    takeover: Some(takeover)
                },
                &fp
            ),
            Decision::Run {
                token: 4,
                takeover: Some(takeover)
            }
        );
        let mut parked = record(Status::Parked, 7);
        parked.expires_at = i64::MAX;
        assert_eq!(
            decide_existing(parked.clone(), &fp),
            Decision::OutcomeUnknown
        );
        assert_eq!(
            decide(ClaimOutcome::Existing(parked), &Digest([8; 32])),
            Decision::Mismatch,
            "a parked key with other arguments is a mismatch, as any record"
        );
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
        assert!(!holds(Status::Parked, first, i64::MAX, first, 5), "parked");
        assert!(!holds(Status::Released, first, 7, first, 5), "released");
    }

    /// Abandoned: in progress, lapsed, still kept; released, completed, live or forgettable
    /// records are not.
    #[test]
    fn abandoned_is_a_lapsed_claim_still_kept() {
        let mut r = record(Status::InProgress, 7);
        (r.created_at, r.expires_at, r.keep_until, r.attempt) = (100, 200, 900, 2);
        for (now, expected) in [(199, false), (200, true), (900, true), (901, false)] {
            r.now = now;
            let takeover = takeover_of(&r);
            assert_eq!(takeover.is_some(), expected, "at {now}");
            assert_eq!(
                abandoned(r.status, r.expires_at, r.keep_until, now),
                expected
            );
            if let Some(t) = takeover {
                assert_eq!((t.attempt, t.abandoned_at), (3, 100));
            }
        }
        r.now = 300;
        for status in [Status::Released, Status::Completed, Status::Parked] {
            r.status = status;
            assert_eq!(takeover_of(&r), None, "{status:?}");
        }
        assert!(!may_forget(i64::MAX, i64::MAX - 1), "parked records stay");
    }
}
