//! The decision table: what a claim's outcome means for this call.
//!
//! Stores make claims atomic; this module is the only place that decides between running the
//! body, replaying a stored result, answering "in progress" and refusing a mismatch.

use crate::key::Digest;
use crate::store::{ClaimOutcome, Record, Status};
use std::time::Duration;

/// What a call does after its claim.
#[derive(Debug)]
pub(crate) enum Decision {
    /// The key is ours: run the body, then complete or release with this token.
    Run { token: u64 },
    /// A finished attempt with the same arguments: return its stored value.
    Replay(Vec<u8>),
    /// An attempt with the same arguments is running; its lease has this much left.
    InProgress { retry_after: Duration },
    /// The key was claimed with other arguments.
    Mismatch,
}

/// Decides what a call does given what its claim found.
pub(crate) fn decide(outcome: ClaimOutcome, fingerprint: &Digest) -> Decision {
    match outcome {
        ClaimOutcome::Claimed { token } => Decision::Run { token },
        ClaimOutcome::Existing(record) => decide_existing(record, fingerprint),
    }
}

/// Decides what a call does given a live record that is not its own.
pub(crate) fn decide_existing(record: Record, fingerprint: &Digest) -> Decision {
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match record.status {
        Status::InProgress => Decision::InProgress {
            retry_after: record.remaining(),
        },
        Status::Completed => Decision::Replay(record.value.unwrap_or_default()),
    }
}

/// The liveness rule every store applies: live while `now < expires_at`.
pub fn is_live(expires_at: i64, now: i64) -> bool {
    now < expires_at
}

/// The fencing token of a new claim: above the previous token of the key, and above anything
/// issued before `now_ms` (microseconds of the store clock), so a key purged and created again
/// never hands out a token an old, stalled attempt still holds.
pub fn next_token(previous: Option<u64>, now_ms: i64) -> u64 {
    let floor = (now_ms.max(0) as u64).saturating_mul(1000);
    previous.map_or(floor, |p| p.saturating_add(1).max(floor))
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
            Decision::Replay(v) if v == vec![1]
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
    fn tokens_only_grow() {
        assert_eq!(next_token(None, 5), 5000);
        assert_eq!(next_token(Some(5000), 5), 5001);
        assert_eq!(next_token(Some(10), 5), 5000);
        assert!(is_live(11, 10) && !is_live(10, 10));
    }
}
