//! The sqlite store (being written).
