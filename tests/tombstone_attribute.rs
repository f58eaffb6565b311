//! `#[idempotent(tombstone = …)]`: after `ttl`, a late repeat gets `idem::Error::Expired`
//! (through the function's own error type) instead of running the body again.

use idem::{idempotent, Idem};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[derive(Debug)]
enum AppError {
    Idem(idem::Error),
}

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        AppError::Idem(e)
    }
}

#[idempotent(store = idem, skip(runs), ttl = "300ms", tombstone = "1h")]
async fn literal(n: u64, idem: &Idem, runs: &AtomicUsize) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

#[idempotent(store = idem, skip(runs, keep), ttl = "300ms", tombstone = keep)]
async fn expression(
    n: u64,
    idem: &Idem,
    runs: &AtomicUsize,
    keep: Duration,
) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(n)
}

fn is_expired(r: Result<u64, AppError>) -> bool {
    matches!(r, Err(AppError::Idem(e)) if e.kind() == idem::ErrorKind::Expired)
}

#[tokio::test]
async fn a_late_repeat_is_refused_with_expired() {
    let idem = Idem::memory();
    let runs = AtomicUsize::new(0);
    assert_eq!(literal(1, &idem, &runs).await.unwrap(), 1);
    assert_eq!(literal(1, &idem, &runs).await.unwrap(), 1, "replayed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(is_expired(literal(1, &idem, &runs).await));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(
        literal(2, &idem, &runs).await.unwrap(),
        2,
        "another key runs"
    );
}

#[tokio::test]
async fn a_duration_expression_sets_it_and_the_key_frees_after_it() {
    let idem = Idem::memory();
    let runs = AtomicUsize::new(0);
    let keep = Duration::from_millis(400);
    assert_eq!(expression(1, &idem, &runs, keep).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(is_expired(expression(1, &idem, &runs, keep).await));
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(expression(1, &idem, &runs, keep).await.unwrap(), 1);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "free again after the tombstone"
    );
}
