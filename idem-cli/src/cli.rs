//! The command line as clap sees it: the global options, the commands and their arguments.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::time::Duration;

/// What `idem --help` ends with.
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  not found: no live record for that key (nothing to show or release)
  2  usage or configuration error: bad arguments, a URL that does not parse, an unknown scheme
  3  refused: `release` of a live record without --force, `resolve` of a key that is in
     progress or completed, not parked (nothing was changed)
  4  store error: cannot connect, authentication failed, permission denied, a query failed
  5  schema missing or out of date: run `idem migrate` (`idem outbox migrate` for the outbox)
  6  `idem check`: at least one check failed

The store URL comes from --url or IDEM_URL: sqlite://FILE, postgres://USER@HOST:PORT/DATABASE,
redis://HOST:PORT/, dynamodb://TABLE?region=REGION&endpoint=URL (AWS credentials from the
environment). With --json every command prints one JSON document on stdout (errors too,
as {\"error\": {...}}); messages for people always go to stderr.";

/// Find, inspect, release and purge idempotency keys in an idem store.
#[derive(Parser, Debug)]
#[command(name = "idem", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// The store: sqlite://FILE, postgres://USER@HOST:PORT/DATABASE, redis://HOST:PORT/ or
    /// dynamodb://TABLE?region=REGION&endpoint=URL
    #[arg(long, env = "IDEM_URL", global = true, hide_env_values = true)]
    pub(crate) url: Option<String>,
    /// The SQL or DynamoDB table (default: idem_records; a SQLite file written by idem 0.1 keeps its idem_keys)
    #[arg(long, env = "IDEM_TABLE", global = true)]
    pub(crate) table: Option<String>,
    /// The Redis key prefix (default: idem)
    #[arg(long, env = "IDEM_REDIS_PREFIX", global = true)]
    pub(crate) prefix: Option<String>,
    /// The outbox table of `idem outbox …` (default: idem_outbox)
    #[arg(long, env = "IDEM_OUTBOX_TABLE", global = true)]
    pub(crate) outbox_table: Option<String>,
    /// Print one JSON document on stdout instead of tables
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create or upgrade the schema (SQLite: creates the file too; Redis: nothing to do)
    Migrate,
    /// Show the record of one key: status, age, lease or TTL left, token, result
    Show {
        #[command(flatten)]
        key: KeyArgs,
        /// Also print the stored result
        #[arg(long)]
        value: bool,
        /// Decrypt an encrypted result with these keys: id:HEX,id:HEX (64 hex digits each)
        #[arg(long, env = "IDEM_KEYRING", hide_env_values = true, requires = "value")]
        keyring: Option<String>,
    },
    /// List live records, oldest claim first
    List {
        /// Only this namespace (the `name = …` of the function, by default its name)
        #[arg(long)]
        name: Option<String>,
        /// Only records in this state
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only records claimed at least this long ago: 30s, 10m, 2h, 1d
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// At most this many records
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// List tombstones instead: keys whose result expired and whose digest and
        /// fingerprint are still kept (`tombstone = …`), refusing a late repeat
        #[arg(long)]
        tombstones: bool,
    },
    /// Free a stuck key (refuses a live record unless --force) and say what was done
    Release {
        #[command(flatten)]
        key: KeyArgs,
        /// Delete the record even though it is live: an in-progress claim (check first that
        /// no process still runs it) or a completed result (the next call runs the body again)
        #[arg(long)]
        force: bool,
    },
    /// Delete records that are no longer live, in batches
    Purge {
        /// Delete expired records (the only kind `purge` deletes; required so that a bare
        /// `idem purge` does nothing by accident)
        #[arg(long, required = true)]
        expired: bool,
        /// Records deleted per statement
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
    /// Count records by namespace and state
    Stats,
    /// List parked keys: abandoned attempts (`on_abandoned = park`) whose outcome waits for an
    /// operator's `idem resolve`, oldest first. A record keeps its key's digest, not the key or
    /// its scope: `idem resolve --digest HEX` names a key as listed
    Pending {
        /// Only this namespace (the `name = …` of the function, by default its name)
        name: Option<String>,
        /// At most this many keys
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Decide a parked key: the abandoned attempt's effect happened (--applied, with the result
    /// callers get) or did not (--not-applied: the next call runs the body)
    Resolve(ResolveArgs),
    /// The operators' web board: counts, lists, a key's record and steps, confirmed actions
    Board(crate::board::BoardArgs),
    /// The transactional outbox (PostgreSQL or MySQL, by the URL): its messages, dead letters and purge
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Check an HTTP API's idempotency from the outside (no store needed): the same key twice,
    /// another body, concurrent duplicates, a hang-up then a retry, two principals
    Check(crate::check::CheckArgs),
}

/// `idem outbox …`.
#[derive(Subcommand, Debug)]
pub(crate) enum OutboxCommand {
    /// Create or upgrade the outbox table (what `Outbox::migrate()` does)
    Migrate,
    /// Messages pending, delivered (awaiting purge) and dead, and the oldest pending one's age
    Stats,
    /// Messages, oldest first: by default the pending and dead ones
    List {
        /// Only messages in this state
        #[arg(long, value_enum)]
        state: Option<OutboxStateArg>,
        /// Only messages of this topic
        #[arg(long)]
        topic: Option<String>,
        /// Only messages of this ordering key
        #[arg(long)]
        ordering_key: Option<String>,
        /// At most this many messages
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Put dead letters back in the queue (attempts reset): the one with ID, or --all
    Retry {
        /// The message id, as `idem outbox list --state dead` prints it
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every dead letter
        #[arg(long)]
        all: bool,
    },
    /// Delete delivered messages older than a retention (pending and dead ones are kept)
    Purge {
        /// Delete messages delivered at least this long ago: 30s, 10m, 2h, 1d (0s: every
        /// delivered message)
        #[arg(long, value_parser = parse_duration, required = true)]
        delivered_older_than: Option<Duration>,
    },
}

/// `idem outbox list --state`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum OutboxStateArg {
    Pending,
    Delivered,
    Dead,
}

impl Command {
    /// The command's name, as typed.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Command::Migrate => "migrate",
            Command::Show { .. } => "show",
            Command::List { .. } => "list",
            Command::Release { .. } => "release",
            Command::Purge { .. } => "purge",
            Command::Stats => "stats",
            Command::Pending { .. } => "pending",
            Command::Resolve(_) => "resolve",
            Command::Check(_) => "check",
            Command::Board(_) => "board",
            Command::Outbox { command, .. } => match command {
                OutboxCommand::Migrate => "outbox migrate",
                OutboxCommand::Stats => "outbox stats",
                OutboxCommand::List { .. } => "outbox list",
                OutboxCommand::Retry { .. } => "outbox retry",
                OutboxCommand::Purge { .. } => "outbox purge",
            },
        }
    }
}

/// Which key: NAME and KEY as the runtime derives its digest, or the digest itself (with NAME,
/// the record must be in that namespace).
#[derive(Args, Debug)]
pub(crate) struct KeyArgs {
    /// The namespace: `name = …` of `#[idempotent]`, or the function's name. With --digest it is
    /// optional, and checked against the record's
    #[arg(required_unless_present = "digest")]
    pub(crate) name: Option<String>,
    /// The key as a string: the same digest as a call made with `.key("KEY")` or
    /// `key = order_id` where order_id is a String / &str holding KEY
    #[arg(required_unless_present_any = ["digest", "json_key"], conflicts_with = "json_key")]
    pub(crate) key: Option<String>,
    /// The key as JSON, for structured keys: numbers, strings, booleans, arrays, tuples and
    /// structs (as objects). Not for keys holding an Option, an enum or a map with non-string
    /// keys: those encode differently from their JSON
    #[arg(long, value_name = "JSON")]
    pub(crate) json_key: Option<String>,
    /// The scope, as a string (`scope = …`, `.scope("S")`)
    #[arg(long, conflicts_with = "json_scope")]
    pub(crate) scope: Option<String>,
    /// The scope as JSON (same rules as --json-key)
    #[arg(long, value_name = "JSON")]
    pub(crate) json_scope: Option<String>,
    /// The key's digest (64 hex digits, as `idem list` prints it) instead of KEY
    #[arg(long, value_name = "HEX", conflicts_with_all = ["key", "json_key", "scope", "json_scope"])]
    pub(crate) digest: Option<String>,
    /// The secret of a store written with keyed digests (`with_digest_secret`), as hex: KEY
    /// then names the record by its HMAC, as the application's calls do. Not needed with
    /// --digest
    #[arg(
        long,
        value_name = "HEX",
        env = "IDEM_DIGEST_SECRET",
        hide_env_values = true
    )]
    pub(crate) digest_secret: Option<String>,
}

/// `idem resolve`: the key and the verdict.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["applied", "not_applied"])))]
pub(crate) struct ResolveArgs {
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// The abandoned attempt's effect happened: store --value as the call's result; every call
    /// with the key gets it as if the body had returned it
    #[arg(long)]
    pub(crate) applied: bool,
    /// With --applied: the result as JSON, as the function's Ok value serializes (e.g. 4200,
    /// "ch_1", {"id": 7}). Without --value the result is JSON null, right for a function
    /// returning () or Option<T> (None); for any other type the next call gets a codec error
    #[arg(long, value_name = "JSON", conflicts_with = "not_applied")]
    pub(crate) value: Option<String>,
    /// With --applied: how long the result is kept and replayed (30s, 10m, 2h, 1d)
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub(crate) ttl: Duration,
    /// The effect did not happen: free the key; the next call with it runs the body
    #[arg(long)]
    pub(crate) not_applied: bool,
}

/// `--status`.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum StatusArg {
    InProgress,
    Completed,
    Parked,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    idem::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
