//! The redis store (being written).
