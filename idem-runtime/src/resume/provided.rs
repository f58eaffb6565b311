//! What the application gives the resumer for the arguments resumable functions skip (pools,
//! clients): one value per type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// A small typed map: at most one value of each type.
#[derive(Clone, Default)]
pub struct Provided(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);

impl std::fmt::Debug for Provided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provided")
            .field("values", &self.0.len())
            .finish()
    }
}

impl Provided {
    /// Adds `value`, replacing a value of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.0.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// The value of type `T`, if one was provided.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref()
    }

    pub(crate) fn has(&self, id: TypeId) -> bool {
        self.0.contains_key(&id)
    }
}
