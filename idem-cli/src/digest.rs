//! The key on the command line: NAME and KEY (a string or JSON) and the scope, encoded as the
//! runtime encodes them, or a digest given as hex.

use crate::cli::KeyArgs;
use crate::failure::Failure;
use idem::key::{self, Digest};
use serde_json::Value;

/// The key the arguments name.
#[derive(Debug)]
pub(crate) struct Named {
    /// The digest the store files the record under.
    pub(crate) digest: Digest,
    /// The key for messages: `charges.v1 order-1234 (scope acme)`, or `key <hex>`.
    pub(crate) label: String,
    /// With `--digest`, the namespace given beside it, which the record must be in (the digest
    /// alone names a record in any namespace).
    pub(crate) namespace: Option<String>,
}

impl Named {
    /// The digest of the key the arguments name, or a usage error.
    pub(crate) fn from_args(k: &KeyArgs) -> Result<Named, Failure> {
        if let Some(hex) = &k.digest {
            let digest = Digest::from_hex(hex.trim()).ok_or_else(|| {
                Failure::usage(format!(
                    "--digest `{hex}` is not 64 hex digits (copy it from `idem list`)"
                ))
            })?;
            let label = match &k.name {
                Some(name) => format!("{name} key {digest}"),
                None => format!("key {digest}"),
            };
            return Ok(Named {
                digest,
                label,
                namespace: k.name.clone(),
            });
        }
        let name = k.name.as_deref().unwrap_or_default();
        let (key, key_label) = match (&k.key, &k.json_key) {
            (_, Some(j)) => (json_value("--json-key", j)?, j.clone()),
            (Some(s), None) => (encode(&s.as_str())?, s.clone()),
            (None, None) => {
                return Err(Failure::usage(
                    "give the key: KEY, --json-key JSON or --digest HEX",
                ))
            }
        };
        let scope = match (&k.scope, &k.json_scope) {
            (Some(s), _) => Some(encode(&s.as_str())?),
            (None, Some(j)) => Some(json_value("--json-scope", j)?),
            (None, None) => None,
        };
        let digest = match &k.digest_secret {
            Some(hex) => key::DigestSecret::from_hex(hex)
                .map_err(|e| Failure::usage(format!("--digest-secret: {e}")))?
                .key_digest(name, scope.as_deref(), &key),
            None => key::key_digest(name, scope.as_deref(), &key),
        };
        let scope_label = match (&k.scope, &k.json_scope) {
            (Some(s), _) | (None, Some(s)) => format!(" (scope {s})"),
            _ => String::new(),
        };
        Ok(Named {
            digest,
            label: format!("{name} {key_label}{scope_label}"),
            namespace: None,
        })
    }

    /// A record found under the digest is this key's, unless `--digest` came with a namespace
    /// the record is not in: then `Err` with the namespace it is in.
    pub(crate) fn check_namespace<'r>(&self, found: &'r str) -> Result<(), &'r str> {
        match &self.namespace {
            Some(name) if name != found => Err(found),
            _ => Ok(()),
        }
    }
}

/// The key as `show` prints it in its `key` row: as given, with its scope.
pub(crate) fn shown_key(k: &KeyArgs) -> String {
    let key = match (&k.digest, &k.json_key, &k.key) {
        (Some(_), _, _) => "(given by its digest)".to_string(),
        (None, Some(j), _) => j.clone(),
        (None, None, key) => key.clone().unwrap_or_default(),
    };
    match (&k.scope, &k.json_scope) {
        (Some(s), _) | (None, Some(s)) => format!("{key} (scope {s})"),
        _ => key,
    }
}

fn encode<T: serde::Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, Failure> {
    key::canonical(v).map_err(|e| Failure::usage(e.to_string()))
}

/// A key or scope given as JSON, canonically encoded. `null` is refused: it could stand for
/// `None` or `()`, which encode differently, so no digest computed from it could be trusted.
fn json_value(flag: &str, text: &str) -> Result<Vec<u8>, Failure> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Failure::usage(format!("{flag} is not valid JSON: {e}")))?;
    fn has_null(v: &Value) -> bool {
        match v {
            Value::Null => true,
            Value::Array(a) => a.iter().any(has_null),
            Value::Object(o) => o.values().any(has_null),
            _ => false,
        }
    }
    if has_null(&v) {
        return Err(Failure::usage(format!(
            "{flag} contains null: a key with an Option or () cannot be given as JSON \
             (None, Some and () encode differently from JSON); use --digest with the \
             digest from `idem list`, or idem::current_key() logged by the application"
        )));
    }
    encode(&v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::USAGE;

    #[test]
    fn json_null_is_refused() {
        assert_eq!(
            json_value("--json-key", r#"{"a": null}"#)
                .err()
                .unwrap()
                .code,
            USAGE
        );
        assert_eq!(json_value("--json-key", "{nope").err().unwrap().code, USAGE);
        assert!(json_value("--json-key", r#"[1, "a"]"#).is_ok());
    }
}
