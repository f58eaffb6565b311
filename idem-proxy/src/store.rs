//! The store a `--store` URL names: every store idem opens.
//!
//! The runtime has constructors per store (`Idem::postgres`, `Idem::redis`…) and a URL→backend
//! function (`Backend::from_url`), but no URL→handle one; this is it, dispatching on the scheme.

use idem::store::dynamodb::DynamoDbOptions;
use idem::store::redis::RedisOptions;
use idem::{Backend, Error, Idem};

/// The URL forms, for messages and `--help`.
pub const FORMS: &str = "memory, sqlite://FILE (or sqlite::memory:), postgres://…, \
    mysql://… / mariadb://…, redis://… / rediss://…, redis+cluster://HOST:PORT,HOST:PORT…, \
    dynamodb://TABLE?region=…&endpoint=…";

/// Opens (and, where the store does so, creates the schema of) the store at `url`.
pub async fn open(url: &str) -> Result<Idem, Error> {
    if url == "memory" || url == "memory://" {
        return Ok(Idem::memory());
    }
    if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = nodes
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| format!("redis://{n}"))
            .collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        return Ok(Idem::from_store(
            RedisOptions::cluster(&nodes)?.connect().await?,
        ));
    }
    match Backend::from_url(url)? {
        Backend::Sqlite => Idem::sqlite(url).await,
        Backend::Postgres => Idem::postgres(url).await,
        Backend::Mysql => Idem::mysql(url).await,
        Backend::Redis => Idem::redis(url).await,
        Backend::DynamoDb => Ok(Idem::from_store(
            DynamoDbOptions::from_url(url)?.connect().await?,
        )),
        other => Err(Error::config(format!(
            "no store opens from `{other}` URLs; use one of: {FORMS}"
        ))),
    }
}

/// Whether `url` names a store this proxy opens (checked without connecting).
pub fn check(url: &str) -> Result<(), String> {
    if url == "memory" || url == "memory://" || url.starts_with("redis+cluster://") {
        return Ok(());
    }
    match Backend::from_url(url) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "{e}, memory or redis+cluster://HOST:PORT,HOST:PORT"
        )),
    }
}
