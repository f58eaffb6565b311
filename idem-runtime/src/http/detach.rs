//! Detached handlers: the idempotent part of a request runs on a task of its own, so that a
//! client that goes away cannot stop it half-way; the layer counts these tasks (the
//! `max_in_flight` bound) and a [`ShutdownHandle`] waits for them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;

/// The handlers a layer runs detached: shared by every service the layer makes and by its
/// [`ShutdownHandle`]s.
#[derive(Default)]
pub(super) struct Handlers {
    /// Handlers admitted and not finished (the `max_in_flight` count).
    in_flight: AtomicUsize,
    /// Their tasks: closed when a shutdown begins, waited for by it.
    tasks: TaskTracker,
}

/// Why a request was not admitted to run detached.
pub(super) enum Refused {
    /// `max_in_flight` handlers are running.
    Overloaded,
    /// A shutdown has begun.
    ShuttingDown,
}

/// One admitted handler; frees its place when dropped (at the end of its task).
pub(super) struct Admitted(Arc<Handlers>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Handlers {
    /// A place for one more handler, within `max` (none: unbounded).
    pub(super) fn admit(self: &Arc<Self>, max: Option<usize>) -> Result<Admitted, Refused> {
        if self.tasks.is_closed() {
            return Err(Refused::ShuttingDown);
        }
        let max = max.unwrap_or(usize::MAX);
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refused::Overloaded)?;
        Ok(Admitted(self.clone()))
    }

    /// Runs `fut` on a tracked task (the shutdown waits for it) that owns `admitted`.
    pub(super) fn spawn<F>(&self, admitted: Admitted, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(async move {
            let _admitted = admitted;
            fut.await
        })
    }
}

/// Waits for a layer's running handlers at shutdown, so that a deploy does not cut them.
///
/// Take it with [`IdempotencyLayer::shutdown_handle`](super::IdempotencyLayer::shutdown_handle)
/// before serving; once the server stops accepting connections (axum's
/// `with_graceful_shutdown`, hyper's `GracefulShutdown`), call [`ShutdownHandle::shutdown`]:
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn serve_until_signal() {}
/// # async fn run(layer: idem::http::IdempotencyLayer) {
/// use std::time::Duration;
/// let handle = layer.shutdown_handle();
/// serve_until_signal().await; // the server, serving routes under `layer`, stops accepting
/// // connections are closed; handlers whose clients left may still run
/// if let Err(still) = handle.shutdown(Duration::from_secs(25)).await {
///     tracing::warn!("{still}");
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct ShutdownHandle {
    pub(super) handlers: Arc<Handlers>,
}

impl std::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShutdownHandle")
            .field("in_flight", &self.in_flight())
            .field("shutting_down", &self.handlers.tasks.is_closed())
            .finish()
    }
}

/// Handlers were still running when [`ShutdownHandle::shutdown`]'s deadline passed (how many).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StillRunning(pub usize);

impl std::fmt::Display for StillRunning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} idempotent request handler(s) still running at the shutdown deadline; their \
             claims lapse after the lease and a retry runs them again",
            self.0
        )
    }
}

impl std::error::Error for StillRunning {}

impl ShutdownHandle {
    /// The handlers running now (the count `max_in_flight` bounds).
    pub fn in_flight(&self) -> usize {
        self.handlers.in_flight.load(Ordering::Acquire)
    }

    /// Begins the shutdown: from now on a request that would run a handler gets a 503
    /// ([`problem::SHUTTING_DOWN`](super::problem::SHUTTING_DOWN), with `Retry-After`), and
    /// waits up to `deadline` for the running handlers to finish and store their responses.
    /// `Err` says how many were still running at the deadline.
    pub async fn shutdown(&self, deadline: Duration) -> Result<(), StillRunning> {
        self.handlers.tasks.close();
        match tokio::time::timeout(deadline, self.handlers.tasks.wait()).await {
            Ok(()) => Ok(()),
            Err(_) => Err(StillRunning(self.handlers.tasks.len())),
        }
    }
}
