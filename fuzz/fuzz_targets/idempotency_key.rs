//! The `Idempotency-Key` header parser on arbitrary header bytes: never panics, and a key it
//! accepts is accepted again, as itself, when sent as a structured-field string.
#![no_main]

use idem_runtime::http::axum::parse_key_value;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    if let Ok(key) = parse_key_value(raw) {
        assert!(!key.is_empty(), "an accepted key is never empty");
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        assert_eq!(
            parse_key_value(quoted.as_bytes()).as_deref(),
            Ok(key.as_str())
        );
    }
});
