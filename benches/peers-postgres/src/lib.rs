//! Nothing here: the crate exists for `benches/peers_postgres.rs`.
