//! `#[idempotent]` end to end on the memory store: real calls, counted bodies.

use idem::{idempotent, Idem, OnError};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize, PartialEq, Clone)]
enum AppError {
    Idem(String),
    Mismatch,
    Declined(String),
    Transient,
}

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        match e {
            idem::Error::Mismatch { .. } => AppError::Mismatch,
            other => AppError::Idem(other.to_string()),
        }
    }
}

/// Something that is not `Serialize`: it must be skipped.
struct Gateway {
    calls: AtomicUsize,
}

impl Gateway {
    fn new() -> Gateway {
        Gateway {
            calls: AtomicUsize::new(0),
        }
    }
    fn count(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[idempotent(store = idem, skip(gw))]
async fn charge(order: u64, amount: u64, idem: &Idem, gw: &Gateway) -> Result<u64, AppError> {
    gw.calls.fetch_add(1, Ordering::SeqCst);
    Ok(order * 1000 + amount)
}

#[tokio::test]
async fn body_runs_once_and_replays() {
    let idem = Idem::memory();
    let gw = Gateway::new();
    assert_eq!(charge(1, 50, &idem, &gw).await, Ok(1050));
    assert_eq!(charge(1, 50, &idem, &gw).await, Ok(1050));
    assert_eq!(gw.count(), 1);
    // Another argument is another default key.
    assert_eq!(charge(1, 60, &idem, &gw).await, Ok(1060));
    assert_eq!(charge(2, 50, &idem, &gw).await, Ok(2050));
    assert_eq!(gw.count(), 3);
    assert_eq!(charge(1, 60, &idem, &gw).await, Ok(1060));
    assert_eq!(gw.count(), 3);
}
