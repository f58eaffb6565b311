//! Instants and spans as the pages show them: UTC timestamps and short durations.

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (proleptic Gregorian), after H. Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A span in milliseconds as its two largest units: `2d 3h`, `4m 10s`, `850ms`.
pub(crate) fn span(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    let units = [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")];
    let first = units.iter().position(|(size, _)| s >= *size).unwrap_or(3);
    let (size, unit) = units[first];
    let mut out = format!("{}{unit}", s / size);
    // The second unit only when it says something: `5m`, not `5m 0s`.
    if let Some((next, unit)) = units.get(first + 1) {
        let rest = s % size / next;
        if rest > 0 {
            out.push_str(&format!(" {rest}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_spans() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_798_761_600_000), "2027-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000 + 3_723_000), "2000-02-29 01:02:03 UTC");
        assert_eq!(span(850), "850ms");
        assert_eq!(span(250_000), "4m 10s");
        assert_eq!(span(183_600_000), "2d 3h");
        assert_eq!(span(3_600_000), "1h");
        assert_eq!(span(300_000), "5m");
    }
}
