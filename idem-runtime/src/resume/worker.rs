//! The resumer's passes: read the abandoned calls, resume each (the takeover claim is the
//! gate), park what cannot be resumed.

use super::{Provided, Resumable, Resumed, Resumer};
use crate::call::resuming::{self, Slot};
use crate::error::Error;
use crate::handle::Idem;
use crate::observe::{self, KeyPrefix};
use crate::store::{Claim, ClaimOutcome, Record};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Abandoned calls found.
    pub found: usize,
    /// Calls this resumer took over and finished.
    pub resumed: usize,
    /// Calls whose key this resumer parked (arguments that no longer decode, a spent retry
    /// budget, `on_abandoned = park`).
    pub parked: usize,
    /// Calls this resumer took over whose function failed (left abandoned for a next pass).
    pub failed: usize,
    /// Calls another resumer (or a caller) had taken meanwhile.
    pub skipped: usize,
}

/// How one call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Went {
    Resumed,
    Parked,
    Failed,
    Skipped,
}

impl Went {
    fn as_str(self) -> &'static str {
        match self {
            Went::Resumed => "resumed",
            Went::Parked => "parked",
            Went::Failed => "failed",
            Went::Skipped => "skipped",
        }
    }
}

pub(super) struct Worker {
    idem: Idem,
    functions: Vec<&'static Resumable>,
    names: Vec<&'static str>,
    provided: Arc<Provided>,
    concurrency: usize,
    retries: u32,
    batch: usize,
}

impl Worker {
    pub(super) fn new(settings: &Resumer, functions: Vec<&'static Resumable>) -> Worker {
        Worker {
            idem: settings.idem.clone(),
            names: functions.iter().map(|f| f.name).collect(),
            functions,
            provided: Arc::new(settings.provided.clone()),
            concurrency: settings.concurrency,
            retries: settings.retries,
            batch: settings.batch,
        }
    }

    /// Reads the abandoned calls and resumes them, `concurrency` at a time.
    pub(super) async fn pass(self: &Arc<Self>) -> Result<Pass, Error> {
        let mut pass = Pass::default();
        if self.names.is_empty() {
            return Ok(pass);
        }
        let store = self.idem.store();
        let found = store.abandoned_calls(&self.names, self.batch).await?;
        pass.found = found.len();
        let lag = found
            .iter()
            .map(|r| r.now.saturating_sub(r.expires_at).max(0))
            .max()
            .unwrap_or(0);
        observe::resume_found(found.len(), Duration::from_millis(lag as u64));
        let gate = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = tokio::task::JoinSet::new();
        for record in found {
            let permit = gate.clone().acquire_owned().await;
            let worker = self.clone();
            tasks.spawn(async move {
                let _permit = permit;
                worker.resume(record).await
            });
        }
        while let Some(done) = tasks.join_next().await {
            // A function that panicked released its key (as any call does): counted failed.
            let went = done.unwrap_or(Went::Failed);
            match went {
                Went::Resumed => pass.resumed += 1,
                Went::Parked => pass.parked += 1,
                Went::Failed => pass.failed += 1,
                Went::Skipped => pass.skipped += 1,
            }
        }
        Ok(pass)
    }

    /// Resumes one abandoned call, in its `idem.resume` span.
    async fn resume(&self, record: Record) -> Went {
        let span = tracing::info_span!(
            "idem.resume",
            idem.name = %record.name,
            idem.key = %KeyPrefix(&record.key),
            idem.attempt = record.attempt + 1,
            idem.outcome = tracing::field::Empty,
        );
        let went = self.resume_in_span(&record).instrument(span.clone()).await;
        span.record("idem.outcome", went.as_str());
        observe::resume_outcome(&record.name, went.as_str());
        went
    }

    async fn resume_in_span(&self, record: &Record) -> Went {
        let Some(function) = self.functions.iter().find(|f| f.name == record.name) else {
            return Went::Skipped;
        };
        let Some(stored) = &record.value else {
            return Went::Skipped;
        };
        let codec = self.idem.codec();
        let opened = codec.open(crate::call::RESUME_ARGS, &record.name, &record.key, stored);
        let plain = match opened {
            Ok(plain) => plain,
            Err(e) => return self.park_undecodable(record, &e).await,
        };
        let slot = Slot::new(record.key, self.retries);
        let called = (function.resume)(&plain, &self.provided);
        let resumed = resuming::resuming(slot.clone(), called).await;
        match resumed {
            Resumed::Undecodable(e) => self.park_undecodable(record, &e).await,
            Resumed::Missing(type_name) => {
                tracing::warn!(
                    missing = type_name,
                    "idem: a resumable function's skipped argument type is not provided"
                );
                Went::Skipped
            }
            Resumed::Done if slot.took_over() => Went::Resumed,
            Resumed::Done => Went::Skipped,
            Resumed::Failed(error) if slot.parked() => {
                tracing::warn!(error, "idem: a resumed call was parked");
                Went::Parked
            }
            Resumed::Failed(error) if slot.took_over() => {
                tracing::info!(error, "idem: a resumed call failed; it is tried again");
                Went::Failed
            }
            Resumed::Failed(_) => Went::Skipped,
        }
    }

    /// Parks a call whose stored arguments no longer decode: a takeover claim of its own, then
    /// park, so that only the resumer that took it over parks it.
    async fn park_undecodable(&self, record: &Record, reason: &Error) -> Went {
        let store = self.idem.store();
        let claim = Claim {
            name: &record.name,
            key: &record.key,
            fingerprint: &record.fingerprint,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(30),
        };
        let token = match store.claim(claim).await {
            Ok(ClaimOutcome::Claimed {
                token,
                takeover: Some(_),
            }) => token,
            Ok(ClaimOutcome::Claimed { token, .. }) => {
                // It ended meanwhile; this claim holds a free key: give it back.
                let _ = store.release(&record.key, token).await;
                return Went::Skipped;
            }
            Ok(ClaimOutcome::Existing(_)) => return Went::Skipped,
            Err(e) => {
                tracing::warn!(error = %e, "idem: could not claim an undecodable resumed call");
                return Went::Failed;
            }
        };
        match store.park(&record.key, token).await {
            Ok(true) => {
                tracing::warn!(reason = %reason, "idem: a resumed call's stored arguments no longer decode; its key is parked");
                Went::Parked
            }
            Ok(false) => Went::Skipped,
            Err(e) => {
                tracing::warn!(error = %e, "idem: could not park an undecodable resumed call");
                Went::Failed
            }
        }
    }
}

/// A resumer running in the background ([`Resumer::spawn`]); it stops when dropped, or, at
/// the end of the call in flight, with [`ResumerHandle::stop`].
#[derive(Debug)]
pub struct ResumerHandle {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ResumerHandle {
    /// Stops after the pass in flight, and waits for it.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ResumerHandle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub(super) fn spawn(worker: Arc<Worker>, poll: Duration) -> ResumerHandle {
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.changed() => return,
            }
            if let Err(e) = worker.pass().await {
                tracing::warn!(idem.store = %worker.idem.store().backend(), error = %e, "idem: resumer pass failed");
            }
            if *stopped.borrow() {
                return;
            }
        }
    });
    ResumerHandle {
        stop,
        task: Some(task),
    }
}
