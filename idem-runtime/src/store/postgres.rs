//! The postgres store (being written).
