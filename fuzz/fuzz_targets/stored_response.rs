//! The stored HTTP response decoder on arbitrary stored bytes: a record that does not make a
//! response is `None`, never a panic.
#![no_main]

use idem_runtime::http::axum::decode_stored_response;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|stored: &[u8]| {
    let _ = decode_stored_response(stored);
});
