//! The resumable functions of this program: each `#[idempotent(resume)]` function registers
//! itself at link time (the `inventory` crate), under its namespace, with what it needs
//! provided and how to call it with stored arguments.

use super::Provided;
use crate::error::Error;
use crate::store::BoxFuture;
use std::any::TypeId;

/// A skipped argument's type, which the application provides to the resumer
/// ([`super::Resumer::provide`]).
#[derive(Debug, Clone, Copy)]
pub struct Need {
    /// The type's name, for the error that says it is missing.
    pub type_name: &'static str,
    id: TypeId,
}

impl Need {
    /// The need of a `T`.
    pub fn of<T: 'static>() -> Need {
        Need {
            type_name: std::any::type_name::<T>(),
            id: TypeId::of::<T>(),
        }
    }

    /// True when `provided` has it.
    pub(crate) fn met_by(&self, provided: &Provided) -> bool {
        provided.has(self.id)
    }
}

/// What calling a resumable function with its stored arguments gave.
#[derive(Debug)]
pub enum Resumed {
    /// The function returned `Ok` (resumed here, or finished by someone else and replayed).
    Done,
    /// The function returned `Err`: its `Debug` text, or its type's name when it has none.
    Failed(String),
    /// The stored arguments no longer decode into the function's argument types.
    Undecodable(Error),
    /// A skipped argument's type was not provided (the resumer checks this when it starts).
    Missing(&'static str),
}

/// How a resumable function is called with its stored (opened) arguments.
pub type ResumeFn = for<'a> fn(&'a [u8], &'a Provided) -> BoxFuture<'a, Resumed>;

/// One resumable function, as it registers itself.
#[derive(Debug)]
pub struct Resumable {
    /// The namespace of its keys (its `name = …`, or the function's name).
    pub name: &'static str,
    /// The function's path, for messages.
    pub function: &'static str,
    /// The types of its skipped arguments.
    pub needs: fn() -> Vec<Need>,
    /// Calls it with stored arguments.
    pub resume: ResumeFn,
}

inventory::collect!(Resumable);

/// Every resumable function linked into this program.
pub fn registered() -> impl Iterator<Item = &'static Resumable> {
    inventory::iter::<Resumable>.into_iter()
}
