//! How long the client waits before a retry: capped exponential backoff with jitter, or the
//! server's `Retry-After`, capped.

use reqwest::header::{HeaderMap, RETRY_AFTER};
use std::time::Duration;

/// The wait before each retry.
///
/// Without a `Retry-After` from the server, retry `n` (1 for the first) waits a random time in
/// `[c / 2, c]` where `c = min(initial × 2ⁿ⁻¹, max)`: exponential, capped, and jittered so that
/// clients cut off by one outage do not all come back at the same instant. With a
/// `Retry-After` (delta-seconds; an HTTP-date is ignored), the wait is that many seconds, at
/// most [`Backoff::max_retry_after`]: the server knows when the request in flight will be
/// done, but a server that asks for an hour does not hold the caller for an hour.
///
/// ```
/// # extern crate idem_runtime as idem;
/// use idem::client::Backoff;
/// use std::time::Duration;
///
/// let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
/// assert_eq!(b.ceiling(1), Duration::from_millis(100));
/// assert_eq!(b.ceiling(3), Duration::from_millis(400));
/// assert_eq!(b.ceiling(10), Duration::from_secs(2));
/// let wait = b.delay(3, None);
/// assert!(wait >= Duration::from_millis(200) && wait <= Duration::from_millis(400));
/// assert_eq!(b.delay(3, Some(Duration::from_secs(1))), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    max_retry_after: Duration,
}

impl Default for Backoff {
    /// 100 ms doubling up to 5 s; a `Retry-After` honoured up to 30 s.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// Waits starting near `initial` and doubling up to `max` (a `max` below `initial` is
    /// raised to it); the default cap on `Retry-After` (30 s).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            ..Backoff::default()
        }
    }

    /// The longest wait a `Retry-After` gets (default 30 s): a larger value is cut to it.
    pub fn max_retry_after(mut self, cap: Duration) -> Backoff {
        self.max_retry_after = cap;
        self
    }

    /// The un-jittered wait before retry `retry` (1 for the first): `min(initial × 2ʳᵉᵗʳʸ⁻¹,
    /// max)`. The jittered wait lies in `[ceiling / 2, ceiling]`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The wait before retry `retry` (1 for the first): `retry_after` capped at
    /// [`Backoff::max_retry_after`] when the server sent one, else [`Backoff::ceiling`] with
    /// jitter.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        self.delay_with(retry, retry_after, jitter_unit())
    }

    /// The wait before polling a request in flight again: its `Retry-After`, capped at
    /// [`Backoff::max_retry_after`], and at least the backoff's `initial` wait (a
    /// `Retry-After: 0` would poll in a tight loop).
    pub(super) fn in_flight(&self, retry_after: Duration) -> Duration {
        retry_after.min(self.max_retry_after).max(self.initial)
    }

    /// [`Backoff::delay`] with the random draw given: `unit` in `[0, 1]` picks the point of
    /// `[ceiling / 2, ceiling]`.
    fn delay_with(&self, retry: u32, retry_after: Option<Duration>, unit: f64) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_retry_after);
        }
        let ceiling = self.ceiling(retry);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// A uniform draw in `[0, 1)` from the OS's generator; `1` (no jitter, the ceiling) if it
/// fails, which only lengthens one wait.
fn jitter_unit() -> f64 {
    match getrandom::u64() {
        // The top 53 bits: every such value is an exact f64.
        Ok(bits) => (bits >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 1.0,
    }
}

/// The `Retry-After` of a response as delta-seconds; `None` without one, or for an HTTP-date
/// (backoff then applies).
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_from_initial_up_to_max() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let ceilings: Vec<_> = (1..=6).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
        // retry 0 is treated as the first; huge retry numbers do not overflow
        assert_eq!(b.ceiling(0), 100 * MS);
        assert_eq!(b.ceiling(u32::MAX), 1000 * MS);
        let long = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(long.ceiling(40), Duration::MAX);
    }

    #[test]
    fn a_max_below_initial_is_raised_to_it() {
        let b = Backoff::new(500 * MS, 100 * MS);
        assert_eq!(b.ceiling(1), 500 * MS);
        assert_eq!(b.ceiling(5), 500 * MS);
    }

    #[test]
    fn jitter_spans_the_upper_half_of_the_ceiling() {
        let b = Backoff::new(100 * MS, 10_000 * MS);
        assert_eq!(b.delay_with(3, None, 0.0), 200 * MS);
        assert_eq!(b.delay_with(3, None, 1.0), 400 * MS);
        assert_eq!(b.delay_with(3, None, 0.5), 300 * MS);
        // out-of-range draws are clamped
        assert_eq!(b.delay_with(3, None, 7.0), 400 * MS);
        assert_eq!(b.delay_with(3, None, -1.0), 200 * MS);
    }

    #[test]
    fn random_delays_stay_in_bounds_and_vary() {
        let b = Backoff::new(100 * MS, 5000 * MS);
        for retry in 1..=8 {
            let ceiling = b.ceiling(retry);
            let draws: Vec<_> = (0..200).map(|_| b.delay(retry, None)).collect();
            for d in &draws {
                assert!(*d >= ceiling / 2 && *d <= ceiling, "{d:?} for {ceiling:?}");
            }
            let distinct: std::collections::HashSet<_> = draws.iter().collect();
            assert!(
                distinct.len() > 150,
                "{} distinct waits of 200",
                distinct.len()
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_exactly_and_capped() {
        let b = Backoff::new(100 * MS, 1000 * MS).max_retry_after(Duration::from_secs(3));
        // longer than the backoff's own max, shorter than the cap: as asked
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        // shorter than the backoff would wait: as asked
        assert_eq!(b.delay(6, Some(Duration::ZERO)), Duration::ZERO);
        // above the cap: the cap
        assert_eq!(
            b.delay(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(3)
        );
        assert_eq!(Backoff::default().max_retry_after, Duration::from_secs(30));
    }

    #[test]
    fn a_request_in_flight_is_polled_at_its_retry_after_within_bounds() {
        let b = Backoff::new(100 * MS, 1000 * MS).max_retry_after(Duration::from_secs(3));
        assert_eq!(b.in_flight(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(b.in_flight(Duration::from_secs(60)), Duration::from_secs(3));
        assert_eq!(b.in_flight(Duration::ZERO), 100 * MS);
    }

    #[test]
    fn retry_after_reads_delta_seconds_only() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, HeaderValue::from_static(" 17 "));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(17)));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&h), None);
    }
}
