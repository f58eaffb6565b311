//! What a Redis failure means: the typed store error kind and a line saying what to do.

use super::BACKEND;
use crate::error::{Error, StoreErrorKind};
use ::redis::{ErrorKind, RedisError};
use std::fmt;

/// A Redis error with a line saying what to do about it.
#[derive(Debug)]
struct Hinted {
    source: RedisError,
    hint: &'static str,
}

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        if !self.hint.is_empty() {
            write!(f, " ({})", self.hint)?;
        }
        Ok(())
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// What a Redis failure means: by the client's error kind, else by the server's error code
/// (the first word of its reply), which is all Redis gives.
fn kind_of(e: &RedisError) -> StoreErrorKind {
    let code = e.code().unwrap_or_default();
    if e.kind() == ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS") {
        StoreErrorKind::Authentication
    } else if code == "NOPERM" || e.to_string().contains("no permissions") {
        StoreErrorKind::Permission
    } else if e.kind() == ErrorKind::ReadOnly || code == "READONLY" {
        StoreErrorKind::ReadOnly
    } else if code == "OOM" {
        StoreErrorKind::Capacity
    } else if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_connection_refusal()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_cluster_error()
    {
        StoreErrorKind::Unreachable
    } else {
        StoreErrorKind::Query
    }
}

fn hint_for(kind: StoreErrorKind) -> &'static str {
    match kind {
        StoreErrorKind::Authentication => {
            "the server needs a password: put it in the URL, redis://:PASSWORD@host:port/ \
             (or redis://USER:PASSWORD@host:port/ with ACL users)"
        }
        StoreErrorKind::Permission => {
            "the Redis user lacks a permission: idem needs EVALSHA, SCRIPT LOAD, TIME, SCAN, \
             HMGET, HSTRLEN and SUBSCRIBE on its key prefix"
        }
        StoreErrorKind::ReadOnly => {
            "this server is a read-only replica: point the URL at the primary"
        }
        StoreErrorKind::Capacity => {
            "the server is over maxmemory; idempotency records need maxmemory-policy noeviction \
             or a volatile-* policy and room to write"
        }
        StoreErrorKind::Unreachable => {
            "is redis-server running at this address? (on a cluster: a failover or a resharding \
             may be under way)"
        }
        StoreErrorKind::Timeout => "the server did not answer within the response timeout",
        _ => "",
    }
}

pub(super) fn store_err(op: &'static str, e: RedisError) -> Error {
    let kind = kind_of(&e);
    Error::store_kind(
        BACKEND,
        op,
        kind,
        Hinted {
            source: e,
            hint: hint_for(kind),
        },
    )
}
