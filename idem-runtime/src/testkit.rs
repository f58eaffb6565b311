//! The conformance suite (being written).
