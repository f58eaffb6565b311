//! How the tool prints: aligned tables and `key  value` blocks for people, times in UTC, and
//! durations as `1h 2m`.

use std::time::Duration;

/// Prints rows as columns separated by two spaces; columns listed in `right` are right-aligned
/// (numbers).
pub fn table(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut out = String::new();
        for (i, (cell, w)) in cells.into_iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            if right.contains(&i) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                if i + 1 < n {
                    out.push_str(&" ".repeat(pad));
                }
            }
            if i + 1 < n {
                out.push_str("  ");
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `3d 4h`, `1h 2m`, `4m 12s`, `12s`, `350ms`: the two largest units, for people.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let (d_, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d_, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d_}d {h}h"),
    }
}

/// Milliseconds as a duration, negative ones as zero.
pub fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time (`2026-12-02T16:10:00.123Z`).
pub fn utc(epoch_ms: i64) -> String {
    let secs = epoch_ms.div_euclid(1000);
    let milli = epoch_ms.rem_euclid(1000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc(1_798_761_599_000), "2026-12-31T23:59:59.000Z");
        assert_eq!(human(Duration::from_millis(350)), "350ms");
        assert_eq!(human(Duration::from_secs(252)), "4m 12s");
        assert_eq!(human(Duration::from_secs(3720)), "1h 2m");
        assert_eq!(human(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d 4h");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["NAME", "N"],
            &[
                vec!["a".into(), "10".into()],
                vec!["bbb".into(), "2".into()],
            ],
            &[1],
        );
        assert_eq!(t, "NAME   N\na     10\nbbb    2\n");
    }
}
