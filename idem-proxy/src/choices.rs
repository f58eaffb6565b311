//! What a route chooses, as written in the file or on the command line: whether it needs a
//! key, how it fingerprints requests, and what a takeover of an abandoned attempt does.

use idem::http::FingerprintMode;
use idem::OnAbandoned;
use serde::Deserialize;

/// Whether requests of a route need a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyMode {
    /// A request without a key is refused (400).
    Required,
    /// A request without a key passes through, unprotected.
    Optional,
    /// Every request passes through (the route is not idempotent).
    Off,
}

impl std::str::FromStr for KeyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "required" => Ok(KeyMode::Required),
            "optional" => Ok(KeyMode::Optional),
            "off" => Ok(KeyMode::Off),
            _ => Err(format!("key mode `{s}`: use required, optional or off")),
        }
    }
}

/// The fingerprint mode as written (`raw`, `canonical`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fingerprint {
    /// Method, path, query and the body's bytes.
    Raw,
    /// JSON bodies by value, query parameters in any order.
    Canonical,
}

impl Fingerprint {
    /// The layer's mode.
    pub fn mode(self) -> FingerprintMode {
        match self {
            Fingerprint::Raw => FingerprintMode::Raw,
            Fingerprint::Canonical => FingerprintMode::Canonical,
        }
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "raw" => Ok(Fingerprint::Raw),
            "canonical" => Ok(Fingerprint::Canonical),
            _ => Err(format!("fingerprint `{s}`: use raw or canonical")),
        }
    }
}

/// What a request that takes over an abandoned attempt does, as written (`rerun`, `park`):
/// the attribute's `on_abandoned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Abandoned {
    /// Send the request upstream again (its effect may happen twice).
    Rerun,
    /// Run nothing: 423 outcome-unknown until an operator resolves the key.
    Park,
}

impl Abandoned {
    /// The layer's choice.
    pub fn choice(self) -> OnAbandoned {
        match self {
            Abandoned::Rerun => OnAbandoned::Rerun,
            Abandoned::Park => OnAbandoned::Park,
        }
    }
}

impl std::str::FromStr for Abandoned {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rerun" => Ok(Abandoned::Rerun),
            "park" => Ok(Abandoned::Park),
            _ => Err(format!("on_abandoned `{s}`: use rerun or park")),
        }
    }
}
