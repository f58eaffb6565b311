//! Which kind of store a handle runs on: the one place that names the built-in backends.

use std::fmt;

/// The backend of a store, as [`Store::backend`](crate::store::Store::backend) reports it: what
/// errors, traces, metrics and operators' tools tell stores apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// The process-local [`MemoryStore`](crate::store::memory::MemoryStore).
    Memory,
    /// The embedded SQLite store (feature `sqlite`).
    Sqlite,
    /// The PostgreSQL store (feature `postgres`).
    Postgres,
    /// The Redis store (feature `redis`).
    Redis,
    /// The MySQL / MariaDB store (feature `mysql`).
    Mysql,
    /// The Amazon DynamoDB store (feature `dynamodb`).
    DynamoDb,
    /// A store outside this crate, by the short name it gives itself.
    Other(&'static str),
}

impl Backend {
    /// The built-in backends, in a fixed order (metrics keep one row per entry).
    pub const BUILT_IN: [Backend; 6] = [
        Backend::Memory,
        Backend::Sqlite,
        Backend::Postgres,
        Backend::Redis,
        Backend::Mysql,
        Backend::DynamoDb,
    ];

    /// The short name: `"memory"`, `"sqlite"`, `"postgres"`, `"redis"`, `"mysql"`,
    /// `"dynamodb"`, or the other store's.
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::Mysql => "mysql",
            Backend::DynamoDb => "dynamodb",
            Backend::Other(name) => name,
        }
    }

    /// The backend a store URL names by its scheme: `sqlite:`, `postgres://` /
    /// `postgresql://`, `redis://` / `rediss://` / `unix://` / `redis+unix://`, `mysql://` /
    /// `mariadb://`, `dynamodb://`. Anything else is [`UnknownScheme`] (an
    /// [`Error::Config`](crate::Error::Config) through `?`).
    pub fn from_url(url: &str) -> Result<Backend, UnknownScheme> {
        let head = url.split(':').next().unwrap_or_default();
        match head {
            "sqlite" => Ok(Backend::Sqlite),
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            "redis" | "rediss" | "unix" | "redis+unix" => Ok(Backend::Redis),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            "dynamodb" => Ok(Backend::DynamoDb),
            _ => Err(UnknownScheme {
                scheme: head.to_owned(),
            }),
        }
    }

    /// The position of a built-in backend in [`Backend::BUILT_IN`] (metrics keep a row each).
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn built_in_index(self) -> Option<usize> {
        Backend::BUILT_IN.iter().position(|b| *b == self)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A store URL whose scheme names no built-in backend ([`Backend::from_url`]). It converts
/// into [`Error::Config`](crate::Error::Config), the error of opening such a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownScheme {
    scheme: String,
}

impl UnknownScheme {
    /// The scheme as the URL gave it (all of the URL when it has no `:`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }
}

impl fmt::Display for UnknownScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unsupported store URL scheme `{}`: use sqlite://FILE, \
             postgres://USER@HOST:PORT/DATABASE, mysql://USER@HOST:PORT/DATABASE, \
             redis://HOST:PORT/ or dynamodb://TABLE?region=REGION",
            self.scheme
        )
    }
}

impl std::error::Error for UnknownScheme {}

/// A backend by its short name: a built-in one for `"memory"`, `"sqlite"`, `"postgres"`,
/// `"redis"`, `"mysql"` and `"dynamodb"`, [`Backend::Other`] for any other (what `Error::store("postgres", "body", e)` in an
/// application's own code converts through).
impl From<&'static str> for Backend {
    fn from(name: &'static str) -> Self {
        Backend::BUILT_IN
            .into_iter()
            .find(|b| b.name() == name)
            .unwrap_or(Backend::Other(name))
    }
}

/// A backend equals its short name, so that `error.backend == "sqlite"` reads as it says.
impl PartialEq<str> for Backend {
    fn eq(&self, other: &str) -> bool {
        self.name() == other
    }
}

impl PartialEq<&str> for Backend {
    fn eq(&self, other: &&str) -> bool {
        self.name() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(Backend::from_url("sqlite://a.db").unwrap(), Backend::Sqlite);
        assert_eq!(
            Backend::from_url("sqlite::memory:").unwrap(),
            Backend::Sqlite
        );
        assert_eq!(
            Backend::from_url("postgresql://u@h/d").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::from_url("redis://127.0.0.1/").unwrap(),
            Backend::Redis
        );
        assert_eq!(
            Backend::from_url("mysql://root@127.0.0.1:3306/test").unwrap(),
            Backend::Mysql
        );
        assert_eq!(
            Backend::from_url("mariadb://u@h/d").unwrap(),
            Backend::Mysql
        );
        let unknown = Backend::from_url("mongodb://x").unwrap_err();
        assert_eq!(unknown.scheme(), "mongodb");
        assert!(unknown.to_string().contains("postgres://USER@HOST"));
        assert!(matches!(
            crate::Error::from(unknown),
            crate::Error::Config(m) if m.starts_with("unsupported store URL scheme `mongodb`")
        ));
        assert_eq!(
            Backend::from_url("idem_records").unwrap_err().scheme(),
            "idem_records"
        );
        assert_eq!(Backend::Redis, "redis");
        assert_eq!(Backend::Other("dynamo").name(), "dynamo");
        assert_eq!(Backend::Postgres.built_in_index(), Some(2));
        assert_eq!(Backend::Other("x").built_in_index(), None);
        assert_eq!(Backend::from("mysql"), Backend::Mysql);
        assert_eq!(Backend::Mysql.built_in_index(), Some(4));
        assert_eq!(
            Backend::from_url("dynamodb://idem_records?region=eu-west-1").unwrap(),
            Backend::DynamoDb
        );
        assert_eq!(Backend::from("dynamodb"), Backend::DynamoDb);
    }
}
