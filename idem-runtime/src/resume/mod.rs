//! Work that finishes itself: a resumer finds the abandoned calls of resumable functions
//! (`#[idempotent(resume)]`) and calls them again with their stored arguments.
//!
//! A resumable call keeps its arguments with its claim ([`crate::store::resume`]). When its
//! process dies, its lease lapses and the record is abandoned; a resumer ([`Idem::resumer`])
//! polls the store's index of such records, and calls the function with the stored arguments
//! and the values the application provided for its skipped ones. That call claims the key like
//! any other, so it takes the abandoned attempt over by the function's own rules (`reconcile`,
//! `on_abandoned = park | rerun`), its steps replay the ones that finished, and two resumers
//! never run it twice: one takes it over, the other finds it in progress. A resumer that dies
//! mid-call leaves it abandoned again (its resumed claim kept the arguments), for another.
//!
//! A resumed call that fails is not released: it is left abandoned for the next pass, and
//! parked once it has failed [`Resumer::retries`] times. Stored arguments that no longer decode
//! into the function's types park the key (logged with the reason); never a panic, never a
//! silent drop.

mod provided;
mod registry;
mod worker;

pub use provided::Provided;
pub use registry::{registered, Need, Resumable, ResumeFn, Resumed};
pub use worker::{Pass, ResumerHandle};

use crate::error::Error;
use crate::handle::Idem;
use std::sync::Arc;
use std::time::Duration;

/// The resumer's settings: see [`Idem::resumer`].
#[derive(Debug, Clone)]
#[must_use = "a Resumer does nothing until `spawn` or `run_once`"]
pub struct Resumer {
    idem: Idem,
    poll: Duration,
    concurrency: usize,
    retries: u32,
    batch: usize,
    names: Option<Vec<String>>,
    provided: Provided,
}

impl Idem {
    /// A resumer of this handle's store: it finishes the abandoned calls of the resumable
    /// functions linked into this program (`#[idempotent(resume)]`).
    ///
    /// ```no_run
    /// # extern crate idem_runtime as idem;
    /// # async fn demo(idem: idem::Idem) -> Result<(), idem::Error> {
    /// let resumer = idem
    ///     .resumer()
    ///     .poll(std::time::Duration::from_secs(1))
    ///     .concurrency(8)
    ///     .retries(5)
    ///     .spawn()?;
    /// // … until shutdown:
    /// resumer.stop().await;
    /// # Ok(()) }
    /// ```
    ///
    /// The functions run as they are written: on their own `store = …`, or on the installed
    /// handle. Give the resumer a handle on the same database.
    pub fn resumer(&self) -> Resumer {
        let mut provided = Provided::default();
        provided.insert(self.clone());
        Resumer {
            idem: self.clone(),
            poll: Duration::from_secs(1),
            concurrency: 4,
            retries: 3,
            batch: 100,
            names: None,
            provided,
        }
    }
}

impl Resumer {
    /// How often the store is asked for abandoned calls (default 1 s): a call is resumed within
    /// its lease plus this after its process died.
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// How many calls this resumer runs at once (default 4).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How many times a resumed call may fail before its key is parked (default 3): a failed
    /// try leaves the key abandoned for the next pass.
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = n.max(1);
        self
    }

    /// At most this many abandoned calls read per pass (default 100).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// Only the functions of these namespaces (default: every registered one).
    pub fn only<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// A value for the skipped arguments of type `T` (a pool, a client): each resumed call
    /// gets it (a clone, or a reference for a `&T` argument). The resumer's handle is provided.
    pub fn provide<T: std::any::Any + Send + Sync>(mut self, value: T) -> Self {
        self.provided.insert(value);
        self
    }

    /// The functions this resumer resumes; an error names the first function whose skipped
    /// argument type was not provided, and the type.
    pub fn functions(&self) -> Result<Vec<&'static Resumable>, Error> {
        let mut out = Vec::new();
        for f in registered() {
            if self
                .names
                .as_ref()
                .is_some_and(|names| !names.iter().any(|n| n == f.name))
            {
                continue;
            }
            if let Some(need) = (f.needs)().into_iter().find(|n| !n.met_by(&self.provided)) {
                return Err(Error::Config(format!(
                    "the resumable function `{}` (name \"{}\") needs a `{}` for a skipped \
                     argument: give the resumer one with `.provide(value)`",
                    f.function, f.name, need.type_name
                )));
            }
            out.push(f);
        }
        if let Some(names) = &self.names {
            if let Some(missing) = names.iter().find(|n| !out.iter().any(|f| f.name == *n)) {
                return Err(Error::Config(format!(
                    "no resumable function is registered under the name \"{missing}\" \
                     (`#[idempotent(resume)]` on it, linked into this program)"
                )));
            }
        }
        Ok(out)
    }

    /// One pass: the abandoned calls found now, each resumed (at most `concurrency` at once).
    pub async fn run_once(&self) -> Result<Pass, Error> {
        let functions = self.functions()?;
        Arc::new(worker::Worker::new(self, functions)).pass().await
    }

    /// Starts resuming in the background, a pass every `poll`, until the handle is stopped
    /// or dropped. Fails at once when a function's skipped type is not provided. Needs a
    /// Tokio runtime.
    pub fn spawn(self) -> Result<ResumerHandle, Error> {
        let functions = self.functions()?;
        let worker = Arc::new(worker::Worker::new(&self, functions));
        Ok(worker::spawn(worker, self.poll))
    }
}
