//! The `Idempotency-Key` request field: its name and how a value is parsed.
//!
//! The field is a structured-field string (RFC 8941), `Idempotency-Key: "…"`; for clients that
//! send the value unquoted (many do, after Stripe's examples) a bare value is accepted too.

use http::{HeaderMap, HeaderName};

/// The request header that carries the key: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted, in characters (as Stripe's API).
pub const MAX_KEY_LEN: usize = 255;

/// Parses the `Idempotency-Key` field: `Ok(None)` when there is none.
pub fn parse_key(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("the request has more than one Idempotency-Key field");
    }
    parse_key_value(value.as_bytes()).map(Some)
}

/// Parses one `Idempotency-Key` value: a structured-field string, or a bare value of visible
/// ASCII characters without `"`, `\` and `,`. The key is 1–255 characters.
pub fn parse_key_value(raw: &[u8]) -> Result<String, &'static str> {
    let v = raw.trim_ascii();
    let key = if let Some(rest) = v.strip_prefix(b"\"") {
        let mut key = String::with_capacity(rest.len());
        let mut bytes = rest.iter();
        loop {
            match bytes.next() {
                None => return Err("the Idempotency-Key string has no closing quote"),
                Some(b'"') => break,
                Some(b'\\') => match bytes.next() {
                    Some(&c @ (b'"' | b'\\')) => key.push(c as char),
                    _ => {
                        return Err(
                            "the Idempotency-Key string has an escape other than \\\" or \\\\",
                        )
                    }
                },
                Some(&c @ 0x20..=0x7e) => key.push(c as char),
                Some(_) => {
                    return Err("the Idempotency-Key has a character that is not printable ASCII")
                }
            }
        }
        if !bytes.as_slice().is_empty() {
            return Err("the Idempotency-Key has something after its closing quote (parameters are not accepted)");
        }
        key
    } else {
        if let Some(bad) = v
            .iter()
            .find(|&&c| !(0x21..=0x7e).contains(&c) || b"\"\\,".contains(&c))
        {
            return Err(if bad.is_ascii_whitespace() {
                "an unquoted Idempotency-Key cannot contain whitespace: quote it"
            } else if bad.is_ascii_graphic() {
                "an unquoted Idempotency-Key cannot contain '\"', '\\' or ',': quote it"
            } else {
                "the Idempotency-Key has a character that is not printable ASCII"
            });
        }
        // Only ASCII is left.
        String::from_utf8(v.to_vec()).map_err(|_| "the Idempotency-Key is not ASCII")?
    };
    if key.is_empty() {
        return Err("the Idempotency-Key is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return Err("the Idempotency-Key is longer than 255 characters");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn keys() {
        let ok = |raw: &str| parse_key_value(raw.as_bytes()).unwrap();
        let bad = |raw: &str| assert!(parse_key_value(raw.as_bytes()).is_err(), "{raw:?}");
        assert_eq!(ok("\"abc-123\""), "abc-123");
        assert_eq!(ok("  \"a b\"  "), "a b");
        assert_eq!(ok(r#""a\"b\\c""#), r#"a"b\c"#);
        assert_eq!(
            ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(ok(&"k".repeat(255)), "k".repeat(255));
        assert_eq!(ok(&format!("\"{}\"", "k".repeat(255))), "k".repeat(255));
        bad(&"k".repeat(256));
        bad("\"\"");
        bad("");
        bad("\"abc");
        bad("\"abc\";p=1");
        bad("\"a\\nb\"");
        bad("a b");
        bad("a,b");
        bad("\"caf\u{e9}\"");
        bad("a\"b");
    }

    #[test]
    fn two_fields_are_malformed() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_key(&h), Ok(None));
        h.append(IDEMPOTENCY_KEY, HeaderValue::from_static("\"a\""));
        assert_eq!(parse_key(&h), Ok(Some("a".into())));
        h.append(IDEMPOTENCY_KEY, HeaderValue::from_static("\"b\""));
        assert!(parse_key(&h).is_err());
    }
}
