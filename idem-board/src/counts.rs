//! The overview's counts, kept as a snapshot: counting by function and state reads every
//! record (no index serves a count by namespace), which at a million records takes longer than
//! a page may. Pages show the last snapshot and its age; one that is older than
//! [`REFRESH`] is recounted in the background while it is shown, and an action that changes
//! many records (a purge) drops it so that the next page counts afresh.

use crate::App;
use idem::admin::Overview;
use idem::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How old a snapshot may get before a page asks for a new one.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);

/// What "expiring soon" means on the overview.
pub(crate) const SOON: Duration = Duration::from_secs(300);

/// One count of the store.
pub(crate) struct Snapshot {
    pub(crate) overview: Overview,
    /// When it was taken.
    pub(crate) at: Instant,
    /// How long the count took.
    pub(crate) took: Duration,
}

/// The last snapshot, and whether a recount is under way.
#[derive(Default)]
pub(crate) struct Counts {
    last: Mutex<Option<Arc<Snapshot>>>,
    counting: AtomicBool,
}

impl Counts {
    fn last(&self) -> Option<Arc<Snapshot>> {
        self.last.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn keep(&self, snapshot: Arc<Snapshot>) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(snapshot);
        }
    }

    /// Forgets the snapshot: the next page counts before it shows.
    pub(crate) fn drop_snapshot(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = None;
        }
    }
}

/// Counts the store now and keeps the result.
pub(crate) async fn count(app: &App) -> Result<Arc<Snapshot>, Error> {
    let start = Instant::now();
    let overview = app.store.overview(SOON).await?;
    let snapshot = Arc::new(Snapshot {
        overview,
        at: Instant::now(),
        took: start.elapsed(),
    });
    app.counts.keep(snapshot.clone());
    Ok(snapshot)
}

/// Starts a recount in the background unless one is running.
pub(crate) fn recount(app: &Arc<App>) {
    if app.counts.counting.swap(true, Ordering::AcqRel) {
        return;
    }
    let app = app.clone();
    tokio::spawn(async move {
        // A failed recount keeps the old snapshot; the next page tries again.
        let _ = count(&app).await;
        app.counts.counting.store(false, Ordering::Release);
    });
}

/// The snapshot a page shows: the last one (recounted behind it when old), or a fresh count
/// when there is none.
pub(crate) async fn current(app: &Arc<App>) -> Result<Arc<Snapshot>, Error> {
    match app.counts.last() {
        Some(s) => {
            if s.at.elapsed() >= REFRESH {
                recount(app);
            }
            Ok(s)
        }
        None => count(app).await,
    }
}
