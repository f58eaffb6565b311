//! Failures: each with its exit code, the kind a script matches on (`--json`), and a message
//! that says what to do. A store failure is explained from its typed kind and backend.

use idem::store::Backend;
use idem::{ErrorKind, StoreErrorKind};

/// Exit code: no live record for that key.
pub(crate) const NOT_FOUND: u8 = 1;
/// Exit code: bad arguments or configuration.
pub(crate) const USAGE: u8 = 2;
/// Exit code: `release` of a live record without `--force`.
pub(crate) const REFUSED: u8 = 3;
/// Exit code: the store failed.
pub(crate) const STORE: u8 = 4;
/// Exit code: the schema is missing, out of date or newer than this tool.
pub(crate) const SCHEMA: u8 = 5;

/// A failure, with the exit code it maps to.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Self {
        Failure {
            code,
            kind,
            message: message.into(),
        }
    }

    /// A usage error (exit code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Failure::new(USAGE, "usage", message)
    }

    /// No live record (exit code 1).
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Failure::new(NOT_FOUND, "not-found", message)
    }
}

/// Where a failure happened: what a hint needs to name the fix.
pub(crate) struct Situation<'a> {
    /// The store URL as given (only ever shown redacted).
    pub(crate) url: &'a str,
    /// The table, when `--table` named one.
    pub(crate) table: Option<&'a str>,
    /// The command that ran (`show`, `release`, …).
    pub(crate) command: &'static str,
}

impl Situation<'_> {
    /// An `idem::Error` as a failure whose message says what to do.
    pub(crate) fn failure(&self, e: idem::Error) -> Failure {
        match (e.kind(), e) {
            (_, idem::Error::Config(m)) => Failure::new(USAGE, "config", m),
            (ErrorKind::Store(kind), idem::Error::Store(s)) => {
                let text = for_an_operator(&s.to_string());
                let code = match kind {
                    k if k.is_schema() => SCHEMA,
                    // `idem migrate` creates a SQLite file; a server's database is the DBA's.
                    StoreErrorKind::DatabaseMissing if s.backend == Backend::Sqlite => SCHEMA,
                    _ => STORE,
                };
                let kind_name = if code == SCHEMA { "schema" } else { "store" };
                match self.hint(kind, s.backend) {
                    Some(hint) => Failure::new(code, kind_name, format!("{text}\n  {hint}")),
                    None => Failure::new(code, kind_name, text),
                }
            }
            (_, other) => Failure::new(STORE, "store", other.to_string()),
        }
    }

    /// What to do about a store failure of `kind`, when we can tell.
    fn hint(&self, kind: StoreErrorKind, backend: Backend) -> Option<String> {
        if self.command.starts_with("outbox") {
            if let Some(hint) = self.outbox_hint(kind) {
                return Some(hint);
            }
        }
        let table = self.table.unwrap_or(idem::store::DEFAULT_TABLE);
        Some(match kind {
            StoreErrorKind::Unreachable => match host_port(self.url) {
                Some(at) => format!(
                    "cannot reach the server at {at} ({}): is it running, and are host and \
                     port right?",
                    redact(self.url)
                ),
                None => format!(
                    "cannot reach the server of {}: is it running, and are host and port right?",
                    redact(self.url)
                ),
            },
            StoreErrorKind::Permission if backend == Backend::Postgres => {
                let privileges = match self.command {
                    // A release ends the record (an UPDATE that keeps its token); a purge
                    // deletes.
                    "release" => "SELECT and UPDATE",
                    "purge" => "SELECT and DELETE",
                    _ => "SELECT",
                };
                let role = url_user(self.url).unwrap_or_else(|| "YOUR_ROLE".into());
                format!(
                    "permission denied: `idem {}` needs the {privileges} privilege on the idem \
                     table and SELECT on its version table; as the table's owner run: GRANT {} \
                     ON {table} TO {role}; GRANT SELECT ON {table}_migrations TO {role};",
                    self.command,
                    privileges.replace(" and", ","),
                )
            }
            StoreErrorKind::SchemaMissing | StoreErrorKind::SchemaOutdated => {
                "the idem table is missing or out of date: run `idem migrate`".into()
            }
            StoreErrorKind::SchemaNewer => {
                "a newer idem upgraded this schema: upgrade the idem tool".into()
            }
            StoreErrorKind::DatabaseMissing if backend == Backend::Sqlite => {
                "create it with `idem migrate`".into()
            }
            StoreErrorKind::DatabaseMissing => "the database in the URL does not exist: check \
                 its name (the part after the last /)"
                .into(),
            StoreErrorKind::Authentication if backend == Backend::DynamoDb => {
                "no valid AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
                 AWS_PROFILE, or run where a role is attached (any will do for DynamoDB Local)"
                    .into()
            }
            StoreErrorKind::Authentication => {
                "authentication failed: check the user and password in the URL".into()
            }
            _ => return None,
        })
    }
}

impl Situation<'_> {
    /// The hints that differ for the outbox's table.
    fn outbox_hint(&self, kind: StoreErrorKind) -> Option<String> {
        let table = self.table.unwrap_or(idem::outbox::DEFAULT_OUTBOX_TABLE);
        let flag = if table == idem::outbox::DEFAULT_OUTBOX_TABLE {
            String::new()
        } else {
            format!(" --outbox-table {table}")
        };
        Some(match kind {
            StoreErrorKind::SchemaMissing | StoreErrorKind::SchemaOutdated => format!(
                "the outbox table is missing or out of date: run `idem outbox{flag} migrate` \
                 (outbox migration {}), or start the application, whose `Outbox::migrate()` \
                 creates it",
                idem::outbox::OUTBOX_SCHEMA_VERSION
            ),
            StoreErrorKind::SchemaNewer => {
                "a newer idem upgraded the outbox table: upgrade the idem tool".into()
            }
            StoreErrorKind::Permission => {
                let privileges = match self.command {
                    "outbox retry" => "SELECT and UPDATE",
                    "outbox purge" => "SELECT and DELETE",
                    "outbox migrate" => return None,
                    _ => "SELECT",
                };
                let role = url_user(self.url).unwrap_or_else(|| "YOUR_ROLE".into());
                format!(
                    "permission denied: `idem {}` needs the {privileges} privilege on the outbox \
                     table and SELECT on its version table; as the table's owner run: GRANT {} \
                     ON {table} TO {role}; GRANT SELECT ON {table}_migrations TO {role};",
                    self.command,
                    privileges.replace(" and", ","),
                )
            }
            _ => return None,
        })
    }
}

/// The URL with its password hidden, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((u, _)) => format!("{scheme}://{u}:***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A store's message without the advice it gives a program's author (`open with
/// migrate_on_open(true)`, `PostgresOptions::migrate`): an operator's fix is a command, which
/// the hint names.
fn for_an_operator(text: &str) -> String {
    match text.find(": run the migrations") {
        Some(at) => text[..at].to_string(),
        None => text.to_string(),
    }
}

/// `host:port` of a store URL, the port defaulted from the scheme when the URL has none (for
/// DynamoDB, the `endpoint` parameter's; `None` for AWS's own endpoint and for files).
pub(crate) fn host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme == "dynamodb" {
        let endpoint = rest
            .split_once('?')?
            .1
            .split('&')
            .find_map(|p| p.strip_prefix("endpoint="))?;
        return host_port(endpoint);
    }
    let default = match scheme {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        "redis" | "rediss" => 6379,
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return None;
    }
    // `[::1]:5432`, `db:5432`, `db`.
    let has_port = host.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (!h.contains(':') || h.ends_with(']'))
    });
    Some(if has_port {
        host.to_string()
    } else {
        format!("{host}:{default}")
    })
}

/// The user of a `scheme://user[:password]@host/...` URL.
fn url_user(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let user = userinfo.split(':').next()?;
    (!user.is_empty()).then(|| user.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_and_users_found() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact("redis://127.0.0.1/"), "redis://127.0.0.1/");
        assert_eq!(url_user("postgres://app:pw@h/d").as_deref(), Some("app"));
        assert_eq!(url_user("postgres://h/d"), None);
    }

    #[test]
    fn unreachable_names_host_and_port() {
        assert_eq!(
            host_port("postgres://app:pw@db:6432/x").as_deref(),
            Some("db:6432")
        );
        assert_eq!(host_port("postgres://db/x").as_deref(), Some("db:5432"));
        assert_eq!(
            host_port("mysql://root@127.0.0.1/test").as_deref(),
            Some("127.0.0.1:3306")
        );
        assert_eq!(
            host_port("redis://127.0.0.1/").as_deref(),
            Some("127.0.0.1:6379")
        );
        assert_eq!(
            host_port("redis://[::1]:7000/").as_deref(),
            Some("[::1]:7000")
        );
        assert_eq!(
            host_port("dynamodb://t?region=eu-west-1&endpoint=http://127.0.0.1:8000").as_deref(),
            Some("127.0.0.1:8000")
        );
        assert_eq!(host_port("dynamodb://t?region=eu-west-1"), None);
        assert_eq!(host_port("sqlite://idem.db"), None);
        let situation = Situation {
            url: "postgres://u:pw@db:6432/x",
            table: None,
            command: "list",
        };
        let failure = situation.failure(idem::Error::store_kind(
            Backend::Postgres,
            "open",
            StoreErrorKind::Unreachable,
            "Connection refused (os error 111)",
        ));
        assert!(failure.message.contains("db:6432"), "{}", failure.message);
        assert!(!failure.message.contains("pw"), "{}", failure.message);
    }

    #[test]
    fn an_operator_gets_no_library_advice() {
        let situation = Situation {
            url: "postgres://db/x",
            table: None,
            command: "list",
        };
        let failure = situation.failure(idem::Error::store_kind(
            Backend::Postgres,
            "open",
            StoreErrorKind::SchemaMissing,
            "table idem_records is missing: run the migrations (`PostgresOptions::migrate`, \
             …), or open with `migrate_on_open(true)`",
        ));
        assert_eq!(failure.code, SCHEMA);
        assert!(
            !failure.message.contains("migrate_on_open"),
            "{}",
            failure.message
        );
        assert!(
            failure.message.contains("table idem_records is missing"),
            "{}",
            failure.message
        );
        assert!(
            failure.message.contains("run `idem migrate`"),
            "{}",
            failure.message
        );
    }
}
