//! The PostgreSQL server a bench measures against.

/// `IDEM_TEST_POSTGRES_URL` with `synchronous_commit = off` for the session (otherwise the WAL
/// flush of every commit is all a fresh call measures, for every variant alike); `None`, after
/// saying so, when the variable is not set.
pub fn bench_url(bench: &str) -> Option<String> {
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        eprintln!("skipped: the {bench} bench needs IDEM_TEST_POSTGRES_URL");
        return None;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}options=-c%20synchronous_commit%3Doff"))
}
