//! Keys for scheduled jobs: one run per period, however many instances fire.
//!
//! Several instances of a service run the same schedule ("every hour, send the report"). Each
//! one's scheduler fires; only one run should happen. Give the run the key of its **period**:
//! the tick truncated to the schedule's period, so that every instance that fires within the
//! same period computes the same key, and the job's name as the call's namespace:
//!
//! ```
//! # extern crate idem_runtime as idem;
//! use std::time::{Duration, SystemTime};
//! # async fn demo() -> Result<(), idem::Error> {
//! let idem = idem::Idem::memory();
//! let hour = Duration::from_secs(3600);
//! let tick = idem::cron::tick_key(SystemTime::now(), hour);
//! let sent = idem
//!     .call("cron.hourly_report")
//!     .key(&tick)
//!     .ttl(2 * hour)                   // longer than the period: see below
//!     .lease(Duration::from_secs(60))  // shorter than the period: see below
//!     .run(async { Ok::<_, idem::Error>(format!("report for {}", tick.period_start_unix)) })
//!     .await?;
//! # let _ = sent; Ok(()) }
//! ```
//!
//! # Choosing `ttl` and `lease`
//!
//! * **`ttl` longer than the period** (twice the period is a good default). The record of a
//!   finished run must outlive every instance's chance to fire in that period: an instance that
//!   fires late in the period, or whose clock is behind, must still find it and replay it. Once
//!   the period is over no instance computes that key again, so a longer ttl costs only storage.
//! * **`lease` much shorter than the period, longer than the run's pauses.** The lease is
//!   renewed while the run goes on; it only matters when the instance running the job dies. Then
//!   the claim lapses after `lease` and the next instance to fire in the same period takes over.
//!   A lease as long as the period means a crashed run is simply skipped for that period.
//!
//! # Clock skew
//!
//! Instances agree on a key as long as they read their clocks in the same period. Two instances
//! whose clocks differ by `d` can disagree only when a period boundary falls between their two
//! readings: with an hourly schedule fired at `:00:00` exactly, one instance a second behind
//! computes the previous hour's key and runs that period's job a second time. So:
//!
//! * fire **away from the boundaries**: schedule the job at an offset larger than the worst skew
//!   (`:00:30` past the hour for an hourly period with NTP-synced clocks), or
//! * compute the key from the **scheduled** time of the tick, when the scheduler gives it,
//!   rather than from `SystemTime::now()`, or
//! * use [`tick_key_with_offset`] with the schedule's own offset, so that the boundaries are
//!   half a period away from the firing time.

use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The period a scheduled run belongs to: the key of that run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Tick {
    /// The start of the period, in seconds since the Unix epoch.
    pub period_start_unix: u64,
    /// The length of the period, in seconds (part of the key: changing the schedule's period
    /// gives new keys).
    pub period_secs: u64,
}

impl Tick {
    /// The start of the period.
    pub fn start(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.period_start_unix)
    }

    /// The start of the next period (the end of this one).
    pub fn next_start(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.period_start_unix.saturating_add(self.period_secs))
    }

    /// The previous period.
    pub fn previous(&self) -> Tick {
        Tick {
            period_start_unix: self.period_start_unix.saturating_sub(self.period_secs),
            period_secs: self.period_secs,
        }
    }
}

/// The tick of `now` truncated to `period`, periods counted from the Unix epoch (so hourly
/// periods start on the hour and daily ones at 00:00 UTC).
///
/// # Panics
///
/// When `period` is shorter than one second, or not a whole number of seconds.
pub fn tick_key(now: SystemTime, period: Duration) -> Tick {
    tick_key_with_offset(now, period, Duration::ZERO)
}

/// The tick of `now` truncated to `period`, periods starting at `offset` past each multiple of
/// `period` since the Unix epoch: daily periods from 03:00 UTC are
/// `tick_key_with_offset(now, 24 h, 3 h)`. An offset of a whole period or more wraps around.
///
/// # Panics
///
/// When `period` is shorter than one second, or `period` or `offset` is not a whole number of
/// seconds.
pub fn tick_key_with_offset(now: SystemTime, period: Duration, offset: Duration) -> Tick {
    assert!(
        period.as_secs() >= 1 && period.subsec_nanos() == 0,
        "idem::cron: the period must be a whole number of seconds, at least one (got {period:?})"
    );
    assert!(
        offset.subsec_nanos() == 0,
        "idem::cron: the offset must be a whole number of seconds (got {offset:?})"
    );
    let p = period.as_secs();
    let offset = offset.as_secs() % p;
    // A clock before 1970 counts as the epoch: no scheduler runs there.
    let t = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let start = if t >= offset {
        (t - offset) / p * p + offset
    } else {
        // Before the first boundary after the epoch: the period that ends at `offset`.
        offset.saturating_sub(p)
    };
    Tick {
        period_start_unix: start,
        period_secs: p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn truncates_to_the_period() {
        // 2025-07-01T12:34:56Z
        let t = 1_751_373_296;
        let tick = tick_key(at(t), HOUR);
        assert_eq!(tick.period_start_unix, 1_751_371_200); // 12:00:00
        assert_eq!(tick.period_secs, 3600);
        assert_eq!(tick.start(), at(1_751_371_200));
        assert_eq!(tick.next_start(), at(1_751_374_800));
        assert_eq!(tick.previous().period_start_unix, 1_751_367_600);
        // sub-second parts do not matter
        assert_eq!(tick_key(at(t) + Duration::from_millis(999), HOUR), tick);
    }

    #[test]
    fn instances_within_a_period_agree_and_boundaries_split() {
        let start = 1_751_371_200;
        let first = tick_key(at(start), HOUR);
        let last = tick_key(at(start + 3599) + Duration::from_millis(999), HOUR);
        assert_eq!(first, last);
        // The skew edge: a reading one second before the boundary is the previous period.
        let behind = tick_key(at(start - 1), HOUR);
        assert_ne!(behind, first);
        assert_eq!(behind, first.previous());
    }

    #[test]
    fn the_period_is_part_of_the_key() {
        let t = at(1_751_371_200);
        assert_eq!(
            tick_key(t, HOUR).period_start_unix,
            tick_key(t, 2 * HOUR).period_start_unix
        );
        assert_ne!(tick_key(t, HOUR), tick_key(t, 2 * HOUR));
    }

    #[test]
    fn offsets() {
        let day = 24 * HOUR;
        let midnight = 1_751_328_000; // 2025-07-01T00:00:00Z
        let three = Duration::from_secs(3 * 3600);
        // 02:59:59 belongs to the period that started yesterday at 03:00
        let before = tick_key_with_offset(at(midnight + 3 * 3600 - 1), day, three);
        assert_eq!(before.period_start_unix, midnight - 21 * 3600);
        let after = tick_key_with_offset(at(midnight + 3 * 3600), day, three);
        assert_eq!(after.period_start_unix, midnight + 3 * 3600);
        // an offset of more than a period wraps
        assert_eq!(
            tick_key_with_offset(at(midnight + 3 * 3600), day, day + three),
            after
        );
        // before the first boundary after the epoch
        assert_eq!(
            tick_key_with_offset(at(10), HOUR, Duration::from_secs(60)).period_start_unix,
            0
        );
        assert_eq!(tick_key(UNIX_EPOCH - HOUR, HOUR).period_start_unix, 0);
    }

    #[test]
    fn serializes_as_its_two_fields() {
        let tick = tick_key(at(7200), HOUR);
        assert_eq!(
            serde_json::to_string(&tick).unwrap(),
            r#"{"period_start_unix":7200,"period_secs":3600}"#
        );
    }

    #[test]
    #[should_panic(expected = "whole number of seconds")]
    fn sub_second_periods_are_refused() {
        tick_key(SystemTime::now(), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn one_run_per_period() {
        let idem = crate::Idem::memory();
        let runs = std::sync::atomic::AtomicU32::new(0);
        let start = 1_751_371_200;
        // three instances fire in one period (clocks a few seconds apart), then one in the next
        for t in [start + 30, start + 31, start + 35, start + 3600 + 30] {
            let tick = tick_key(at(t), HOUR);
            idem.call("cron.test")
                .key(&tick)
                .ttl(2 * HOUR)
                .run(async {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, crate::Error>(())
                })
                .await
                .unwrap();
        }
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
