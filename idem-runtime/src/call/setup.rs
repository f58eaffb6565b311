//! What a call is set up with, on the heap and reused: the builder's fields.

use crate::handle::Idem;
use crate::key::KeyParts;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

/// The builder's fields: what [`crate::Call`]'s methods set.
#[derive(Debug, Default)]
pub(super) struct Setup {
    /// `None`: the parent's handle for a step inside a call, else the installed one.
    pub(super) idem: Option<Idem>,
    pub(super) name: Cow<'static, str>,
    pub(super) step: bool,
    pub(super) parts: KeyParts,
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Option<Option<Duration>>,
}

/// A [`Setup`] in a box that is reused. The builder's methods take the `Call` by value, as the
/// contract has them, so its fields were copied at each (192 bytes, four times in an
/// `#[idempotent]` call, and once more into the call's future): a box moves as one pointer.
/// The box of the last call that ended on a thread, emptied, is the next call's there, with its
/// key buffer, so that a call is still set up without an allocation.
pub(super) struct SetupBox(Option<Box<Setup>>);

thread_local! {
    /// The box of the last call that ended on this thread.
    static SPARE: Cell<Option<Box<Setup>>> = const { Cell::new(None) };
}

/// The largest key buffer a spare box keeps: a call with a large key allocates its own.
const SPARE_MAX: usize = 1024;

impl SetupBox {
    /// A box for a call in namespace `name` on `idem`: this thread's spare, or a new one.
    pub(super) fn new(idem: Option<Idem>, name: Cow<'static, str>) -> SetupBox {
        let mut setup = SPARE
            .try_with(Cell::take)
            .ok()
            .flatten()
            .unwrap_or_default();
        setup.idem = idem;
        setup.name = name;
        SetupBox(Some(setup))
    }
}

impl Deref for SetupBox {
    type Target = Setup;
    fn deref(&self) -> &Setup {
        self.0
            .as_deref()
            .expect("a SetupBox holds its box until its drop")
    }
}

impl DerefMut for SetupBox {
    fn deref_mut(&mut self) -> &mut Setup {
        self.0
            .as_deref_mut()
            .expect("a SetupBox holds its box until its drop")
    }
}

impl fmt::Debug for SetupBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Setup::fmt(self, f)
    }
}

impl Drop for SetupBox {
    fn drop(&mut self) {
        let Some(mut setup) = self.0.take() else {
            return;
        };
        let Setup {
            idem,
            name,
            step,
            parts,
            ttl,
            lease,
            wait,
        } = &mut *setup;
        // Emptied here, on the call's thread: the handle and an owned name are dropped now,
        // not whenever another call takes the box.
        *idem = None;
        *name = Cow::Borrowed("");
        *step = false;
        parts.clear(SPARE_MAX);
        (*ttl, *lease, *wait) = (None, None, None);
        // At a thread's exit the slot is gone: the box is freed here instead.
        let _ = SPARE.try_with(|spare| spare.set(Some(setup)));
    }
}
