//! InnoDB's lock conflicts, retried: what a correct call must never see as an error.
//!
//! Concurrent inserts into one unique key deadlock in InnoDB by design: each duplicate takes a
//! shared lock on the conflicting index record, and when the row's holder goes away (a purge
//! deletes it, a takeover rewrites it) two of them hold the shared lock and both want the
//! exclusive one. InnoDB rolls one back with error 1213. Every store step runs as one
//! autocommit statement, so the victim's rollback undoes exactly that statement: running it
//! again is safe. A lock wait timeout (1205) rolls back the statement too (with the default
//! `innodb_rollback_on_timeout=OFF`); it means a row was held for `innodb_lock_wait_timeout`,
//! by a caller's open transaction, so it is retried once only.

use super::error::{lock_conflict, DEADLOCK, LOCK_WAIT_TIMEOUT, TIDB_WRITE_CONFLICT};
use std::future::Future;
use std::time::Duration;

/// How many times a statement runs when it keeps losing deadlocks.
pub(crate) const DEADLOCK_ATTEMPTS: u32 = 12;

/// Runs `statement` until it does not fail with a lock conflict: deadlocks up to
/// [`DEADLOCK_ATTEMPTS`] times with a short, jittered backoff (the peers of a deadlock retry
/// at once otherwise, and meet again), lock wait timeouts twice. TiDB's write conflict (9007)
/// counts as a deadlock: its statement was rolled back too. When the retries run out, the
/// error surfaces as `StoreErrorKind::Busy` (`error.rs`).
pub(crate) async fn retrying<T, F, Fut>(mut statement: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 0u32;
    let mut timeouts = 0u32;
    loop {
        match statement().await {
            Err(e) => match lock_conflict(&e) {
                Some(DEADLOCK | TIDB_WRITE_CONFLICT) if attempt + 1 < DEADLOCK_ATTEMPTS => {
                    attempt += 1;
                    tracing::debug!(
                        attempt,
                        "idem: MySQL deadlock victim; running the statement again"
                    );
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Some(LOCK_WAIT_TIMEOUT) if timeouts == 0 => {
                    timeouts += 1;
                    tracing::debug!("idem: MySQL lock wait timeout; running the statement again");
                }
                _ => return Err(e),
            },
            ok => return ok,
        }
    }
}

/// Up to 1 ms × 2^attempt (at most 64 ms), scaled by a pseudo-random factor in [0.5, 1).
fn backoff(attempt: u32) -> Duration {
    let ceiling = Duration::from_millis(1u64 << attempt.min(6));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // A multiplicative hash of the clock's nanoseconds: enough to spread the retries of the
    // transactions that met in one deadlock.
    let spread = (nanos.wrapping_mul(2_654_435_761) >> 16) % 512;
    ceiling / 2 + ceiling * spread / 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        for attempt in 0..20 {
            let d = backoff(attempt);
            let ceiling = Duration::from_millis(1u64 << attempt.min(6));
            assert!(d >= ceiling / 2 && d < ceiling, "{attempt}: {d:?}");
        }
    }
}
