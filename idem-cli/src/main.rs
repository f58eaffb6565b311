//! `idem`: find, inspect, release and purge idempotency keys in any idem store.
//!
//! See the README section "Operating idem" for a walk-through, and `idem --help` for the exit
//! codes.
#![warn(missing_docs)]

mod output;

use clap::{Args, Parser, Subcommand, ValueEnum};
use idem::admin::{self, Filter, Inspect, KeyInfo, OpenError, State, StoredValue, Target};
use idem::key::{self, Digest};
use idem::store::{Record, Status};
use output::{human, ms, utc};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  not found: no live record for that key (nothing to show or release)
  2  usage or configuration error: bad arguments, a URL that does not parse, an unknown scheme
  3  refused: `release` of a live record without --force (nothing was changed)
  4  store error: cannot connect, authentication failed, permission denied, a query failed
  5  schema missing or out of date: run `idem migrate`

The store URL comes from --url or IDEM_URL: sqlite://FILE, postgres://USER@HOST:PORT/DATABASE,
redis://HOST:PORT/. With --json every command prints one JSON document on stdout (errors too,
as {\"error\": {...}}); messages for people always go to stderr.";

/// Find, inspect, release and purge idempotency keys in an idem store.
#[derive(Parser, Debug)]
#[command(name = "idem", version, after_help = EXIT_CODES)]
struct Cli {
    /// The store: sqlite://FILE, postgres://USER@HOST:PORT/DATABASE or redis://HOST:PORT/
    #[arg(long, env = "IDEM_URL", global = true, hide_env_values = true)]
    url: Option<String>,
    /// The SQL table (default: idem_keys for SQLite, idem_records for PostgreSQL)
    #[arg(long, env = "IDEM_TABLE", global = true)]
    table: Option<String>,
    /// The Redis key prefix (default: idem)
    #[arg(long, env = "IDEM_REDIS_PREFIX", global = true)]
    prefix: Option<String>,
    /// Print one JSON document on stdout instead of tables
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the schema (SQLite: creates the file too; Redis: nothing to do)
    Migrate,
    /// Show the record of one key: status, age, lease or TTL left, token, result
    Show {
        #[command(flatten)]
        key: KeyArgs,
        /// Also print the stored result
        #[arg(long)]
        value: bool,
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
        older_than: Option<std::time::Duration>,
        /// At most this many records
        #[arg(long, default_value_t = 100)]
        limit: usize,
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
}

/// Which key: NAME and KEY as the runtime derives its digest, or the digest itself.
#[derive(Args, Debug)]
struct KeyArgs {
    /// The namespace: `name = …` of #[idempotent], or the function's name
    #[arg(required_unless_present = "digest")]
    name: Option<String>,
    /// The key as a string: the same digest as a call made with `.key("KEY")` or
    /// `key = order_id` where order_id is a String / &str holding KEY
    #[arg(required_unless_present_any = ["digest", "json_key"], conflicts_with = "json_key")]
    key: Option<String>,
    /// The key as JSON, for structured keys: numbers, strings, booleans, arrays, tuples and
    /// structs (as objects). Not for keys holding an Option, an enum or a map with non-string
    /// keys: those encode differently from their JSON
    #[arg(long, value_name = "JSON")]
    json_key: Option<String>,
    /// The scope, as a string (`scope = …`, `.scope("S")`)
    #[arg(long, conflicts_with = "json_scope")]
    scope: Option<String>,
    /// The scope as JSON (same rules as --json-key)
    #[arg(long, value_name = "JSON")]
    json_scope: Option<String>,
    /// The key's digest (64 hex digits, as `idem list` prints it) instead of NAME and KEY
    #[arg(long, value_name = "HEX", conflicts_with_all = ["name", "key", "json_key", "scope", "json_scope"])]
    digest: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum StatusArg {
    InProgress,
    Completed,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    idem::parse_duration(s).map_err(|e| e.to_string())
}

/// A failure, with the exit code it maps to.
struct Failure {
    code: u8,
    kind: &'static str,
    message: String,
}

impl Failure {
    fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Self {
        Failure {
            code,
            kind,
            message: message.into(),
        }
    }
}

const NOT_FOUND: u8 = 1;
const USAGE: u8 = 2;
const REFUSED: u8 = 3;
const STORE: u8 = 4;
const SCHEMA: u8 = 5;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are not errors; a usage error still owes a script its
            // JSON document.
            if e.use_stderr() && std::env::args().any(|a| a == "--json") {
                let message = e.kind().to_string();
                let doc =
                    json!({"error": {"exit_code": USAGE, "kind": "usage", "message": message}});
                println!("{doc}");
            }
            e.exit()
        }
    };
    let json = cli.json;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: cannot start: {e}");
            return ExitCode::from(STORE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("idem: {}", f.message);
            if json {
                let doc =
                    json!({"error": {"exit_code": f.code, "kind": f.kind, "message": f.message}});
                println!("{doc}");
            }
            ExitCode::from(f.code)
        }
    }
}

/// Everything a command needs: the store and how to print.
struct Ctx {
    url: String,
    target: Target,
    json: bool,
    command: &'static str,
}

async fn run(cli: Cli) -> Result<String, Failure> {
    let Some(url) = cli.url else {
        return Err(Failure::new(
            USAGE,
            "usage",
            "no store URL: pass --url (or set IDEM_URL) to sqlite://FILE, \
             postgres://USER@HOST:PORT/DATABASE or redis://HOST:PORT/",
        ));
    };
    let target = Target::new(cli.table, cli.prefix);
    let command = match &cli.command {
        Command::Migrate => "migrate",
        Command::Show { .. } => "show",
        Command::List { .. } => "list",
        Command::Release { .. } => "release",
        Command::Purge { .. } => "purge",
        Command::Stats => "stats",
    };
    let ctx = Ctx {
        url,
        target,
        json: cli.json,
        command,
    };
    match cli.command {
        Command::Migrate => migrate(&ctx).await,
        Command::Show { key, value } => show(&ctx, &key, value).await,
        Command::List {
            name,
            status,
            older_than,
            limit,
        } => {
            let filter = Filter::new()
                .name(name)
                .status(status.map(|s| match s {
                    StatusArg::InProgress => Status::InProgress,
                    StatusArg::Completed => Status::Completed,
                }))
                .older_than(older_than)
                .limit(limit);
            list(&ctx, &filter).await
        }
        Command::Release { key, force } => release(&ctx, &key, force).await,
        Command::Purge { batch, .. } => purge(&ctx, batch).await,
        Command::Stats => stats(&ctx).await,
    }
}

impl Ctx {
    async fn open(&self) -> Result<Box<dyn Inspect>, Failure> {
        admin::open(&self.url, &self.target)
            .await
            .map_err(|e| match e {
                OpenError::NotMigrated { what } => Failure::new(SCHEMA, "schema", what),
                OpenError::Error(e) => self.failure(e),
            })
    }

    /// An `idem::Error` as a failure whose message says what to do.
    fn failure(&self, e: idem::Error) -> Failure {
        match e {
            idem::Error::Config(m) => Failure::new(USAGE, "config", m),
            idem::Error::Store(s) => {
                let text = s.to_string();
                match self.hint(&s) {
                    Some((SCHEMA, hint)) => {
                        Failure::new(SCHEMA, "schema", format!("{text}\n  {hint}"))
                    }
                    Some((_, hint)) => Failure::new(STORE, "store", format!("{text}\n  {hint}")),
                    None => Failure::new(STORE, "store", text),
                }
            }
            other => Failure::new(STORE, "store", other.to_string()),
        }
    }

    /// What to do about a store failure, when we can tell.
    fn hint(&self, s: &idem::StoreError) -> Option<(u8, String)> {
        use idem::postgres::sqlx;
        let table = self
            .target
            .table
            .clone()
            .unwrap_or_else(|| match s.backend {
                "sqlite" => "idem_keys".into(),
                _ => idem::postgres::DEFAULT_TABLE.into(),
            });
        let db = match s.source.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(db)) => Some(db),
            Some(sqlx::Error::Io(_)) => {
                return Some((
                    STORE,
                    format!(
                        "cannot reach the server of {}: is it running, and are host and port \
                         right?",
                        redact(&self.url)
                    ),
                ))
            }
            _ => None,
        };
        let text = s.source.to_string();
        let code = db.and_then(|d| d.code()).map(|c| c.into_owned());
        match code.as_deref() {
            Some("42501") => {
                let privileges = match self.command {
                    "release" | "purge" => "SELECT and DELETE",
                    _ => "SELECT",
                };
                let role = pg_user(&self.url).unwrap_or_else(|| "YOUR_ROLE".into());
                Some((
                    STORE,
                    format!(
                        "permission denied: `idem {}` needs the {privileges} privilege on the \
                         idem table and SELECT on its version table; as the table's owner run: \
                         GRANT {} ON {table} TO {role}; GRANT SELECT ON {table}_migrations TO \
                         {role};",
                        self.command,
                        privileges.replace(" and", ","),
                    ),
                ))
            }
            Some("42P01") => Some((
                SCHEMA,
                "the idem table is missing: run `idem migrate`".into(),
            )),
            Some("28P01") | Some("28000") => Some((
                STORE,
                "authentication failed: check the user and password in the URL".into(),
            )),
            Some("3D000") => Some((
                STORE,
                "the database in the URL does not exist: check its name (the part after the \
                 last /)"
                    .into(),
            )),
            _ if text.contains("no such table") => Some((
                SCHEMA,
                "the idem table is missing: run `idem migrate`".into(),
            )),
            _ if text.contains("NOPERM") || text.contains("no permissions") => Some((
                STORE,
                "the Redis user lacks a permission: idem needs SCAN, HMGET, HSTRLEN, TIME, \
                 EVALSHA and SCRIPT LOAD on its key prefix"
                    .into(),
            )),
            _ => None,
        }
    }
}

/// The URL with its password hidden, for messages.
fn redact(url: &str) -> String {
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

/// The user of a `postgres://user[:password]@host/...` URL.
fn pg_user(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let user = userinfo.split(':').next()?;
    (!user.is_empty()).then(|| user.to_string())
}

/// The digest of the key the arguments name, and a label for messages.
fn digest_of(k: &KeyArgs) -> Result<(Digest, String), Failure> {
    if let Some(hex) = &k.digest {
        let d = Digest::from_hex(hex.trim()).ok_or_else(|| {
            Failure::new(
                USAGE,
                "usage",
                format!("--digest `{hex}` is not 64 hex digits (copy it from `idem list`)"),
            )
        })?;
        return Ok((d, format!("key {d}")));
    }
    let name = k.name.as_deref().unwrap_or_default();
    let (key, key_label) = match (&k.key, &k.json_key) {
        (_, Some(j)) => (json_value("--json-key", j)?, j.clone()),
        (Some(s), None) => (encode(&s.as_str())?, s.clone()),
        (None, None) => {
            return Err(Failure::new(
                USAGE,
                "usage",
                "give the key: KEY, --json-key JSON or --digest HEX",
            ))
        }
    };
    let scope = match (&k.scope, &k.json_scope) {
        (Some(s), _) => Some(encode(&s.as_str())?),
        (None, Some(j)) => Some(json_value("--json-scope", j)?),
        (None, None) => None,
    };
    let digest = key::key_digest(name, scope.as_deref(), &key);
    let scope_label = match (&k.scope, &k.json_scope) {
        (Some(s), _) | (None, Some(s)) => format!(" (scope {s})"),
        _ => String::new(),
    };
    Ok((digest, format!("{name} {key_label}{scope_label}")))
}

fn encode<T: serde::Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, Failure> {
    key::canonical(v).map_err(|e| Failure::new(USAGE, "usage", e.to_string()))
}

/// A key or scope given as JSON, canonically encoded. `null` is refused: it could stand for
/// `None` or `()`, which encode differently, so no digest computed from it could be trusted.
fn json_value(flag: &str, text: &str) -> Result<Vec<u8>, Failure> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Failure::new(USAGE, "usage", format!("{flag} is not valid JSON: {e}")))?;
    fn has_null(v: &Value) -> bool {
        match v {
            Value::Null => true,
            Value::Array(a) => a.iter().any(has_null),
            Value::Object(o) => o.values().any(has_null),
            _ => false,
        }
    }
    if has_null(&v) {
        return Err(Failure::new(
            USAGE,
            "usage",
            format!(
                "{flag} contains null: a key with an Option or () cannot be given as JSON \
                 (None, Some and () encode differently from JSON); use --digest with the \
                 digest from `idem list`, or idem::current_key() logged by the application"
            ),
        ));
    }
    encode(&v)
}

fn status_str(s: Status) -> &'static str {
    match s {
        Status::InProgress => "in-progress",
        Status::Completed => "completed",
    }
}

/// The JSON of a record (without its value).
fn info_json(i: &KeyInfo) -> Value {
    let left = i.expires_at.saturating_sub(i.now).max(0);
    json!({
        "name": i.name,
        "digest": i.key.to_hex(),
        "status": status_str(i.status),
        "created_at": utc(i.created_at),
        "age_ms": i.now.saturating_sub(i.created_at).max(0),
        "expires_at": utc(i.expires_at),
        "lease_left_ms": (i.status == Status::InProgress).then_some(left),
        "ttl_left_ms": (i.status == Status::Completed).then_some(left),
        "token": i.token,
        "fingerprint": i.fingerprint.to_hex(),
        "value_size": i.value_size,
    })
}

/// The stored result, as JSON (`{"ok": …}` / `{"err": …}`) and as text.
fn value_of(bytes: &[u8]) -> (Value, String) {
    match admin::stored_value(bytes) {
        Ok(StoredValue::Ok(j)) => {
            let v = serde_json::from_slice(j).unwrap_or(Value::Null);
            (
                json!({"ok": v}),
                format!("Ok({})", String::from_utf8_lossy(j)),
            )
        }
        Ok(StoredValue::Err(j)) => {
            let v = serde_json::from_slice(j).unwrap_or(Value::Null);
            (
                json!({"err": v}),
                format!("Err({})", String::from_utf8_lossy(j)),
            )
        }
        Err(e) => (json!({"unreadable": e.to_string()}), e.to_string()),
    }
}

fn doc(v: Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

async fn migrate(ctx: &Ctx) -> Result<String, Failure> {
    let m = admin::migrate(&ctx.url, &ctx.target)
        .await
        .map_err(|e| ctx.failure(e))?;
    if ctx.json {
        return Ok(doc(json!({
            "backend": m.backend, "location": m.location, "from": m.from, "to": m.to,
            "changed": m.from != m.to,
        })));
    }
    Ok(match (m.backend, m.from, m.to) {
        ("redis", _, _) => format!(
            "redis ({}): Redis needs no schema; the server is reachable and accepted idem's \
             scripts. Nothing to do.\n",
            m.location
        ),
        (b, 0, to) => format!("{b} {}: created the schema (version {to}).\n", m.location),
        (b, from, to) if from == to => format!(
            "{b} {}: the schema is current (version {to}). Nothing to do.\n",
            m.location
        ),
        (b, from, to) => format!(
            "{b} {}: upgraded the schema from version {from} to {to}.\n",
            m.location
        ),
    })
}

/// Why a live record is there and what happens next, in words.
fn explain(r: &Record) -> String {
    let left = human(r.remaining());
    match r.status {
        Status::InProgress => format!(
            "An attempt claimed this key {} ago and has not finished. Until its lease ends \
             (in {left}; a running attempt keeps renewing it) every call with this key gets \
             `in progress` (or waits). If the process that ran it is gone (crashed, killed, \
             redeployed), the key frees itself when the lease ends; to free it now, check \
             that the side effect did not happen (or reconcile it), then `idem release --force`.",
            human(ms(r.now - r.created_at))
        ),
        Status::Completed => format!(
            "The call finished; its stored result is replayed to every call with this key for \
             another {left}. `idem release --force` deletes it: the next call runs the body \
             again."
        ),
    }
}

async fn show(ctx: &Ctx, k: &KeyArgs, with_value: bool) -> Result<String, Failure> {
    let (digest, label) = digest_of(k)?;
    let store = ctx.open().await?;
    let record = store.get(&digest).await.map_err(|e| ctx.failure(e))?;
    let Some(r) = record else {
        return Err(Failure::new(
            NOT_FOUND,
            "not-found",
            format!(
                "no live record for {label} (digest {digest}): the key is free, the next call \
                 with it runs the body. If you expected one, check the namespace, the key's \
                 exact spelling and type (a number key needs --json-key, e.g. --json-key 1234) \
                 and --scope; `idem list --name NAME` shows what is there."
            ),
        ));
    };
    let info = KeyInfo::from(&r);
    if ctx.json {
        let mut v = info_json(&info);
        v["why"] = Value::String(explain(&r));
        if with_value {
            v["value"] = r.value.as_deref().map_or(Value::Null, |b| value_of(b).0);
        }
        return Ok(doc(v));
    }
    let left = human(r.remaining());
    let key = match (&k.digest, &k.json_key, &k.key) {
        (Some(_), _, _) => "(given by its digest)".to_string(),
        (None, Some(j), _) => j.clone(),
        (None, None, key) => key.clone().unwrap_or_default(),
    };
    let key = match (&k.scope, &k.json_scope) {
        (Some(s), _) | (None, Some(s)) => format!("{key} (scope {s})"),
        _ => key,
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("name", r.name.clone()),
        ("key", key),
        ("digest", digest.to_hex()),
        ("status", status_str(r.status).into()),
        (
            "claimed",
            format!(
                "{} ({} ago)",
                utc(r.created_at),
                human(ms(r.now - r.created_at))
            ),
        ),
    ];
    match r.status {
        Status::InProgress => rows.push((
            "lease left",
            format!("{left} (until {})", utc(r.expires_at)),
        )),
        Status::Completed => {
            rows.push(("ttl left", format!("{left} (until {})", utc(r.expires_at))))
        }
    }
    rows.push(("token", r.token.to_string()));
    rows.push(("fingerprint", r.fingerprint.to_hex()));
    rows.push((
        "result",
        r.value.as_ref().map_or("none (not finished)".into(), |v| {
            format!("{} bytes", v.len())
        }),
    ));
    if with_value {
        if let Some(v) = &r.value {
            rows.push(("value", value_of(v).1));
        }
    }
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<12} {v}\n"));
    }
    out.push('\n');
    out.push_str(&explain(&r));
    out.push('\n');
    Ok(out)
}

async fn list(ctx: &Ctx, filter: &Filter) -> Result<String, Failure> {
    let store = ctx.open().await?;
    let rows = store.list(filter).await.map_err(|e| ctx.failure(e))?;
    if ctx.json {
        return Ok(doc(Value::Array(rows.iter().map(info_json).collect())));
    }
    if rows.is_empty() {
        return Ok("no live records match\n".into());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                status_str(i.status).into(),
                human(ms(i.now - i.created_at)),
                human(ms(i.expires_at - i.now)),
                i.token.to_string(),
                i.value_size.map_or("-".into(), |n| n.to_string()),
                i.key.to_hex(),
            ]
        })
        .collect();
    let mut out = output::table(
        &["NAME", "STATUS", "AGE", "LEFT", "TOKEN", "SIZE", "DIGEST"],
        &cells,
        &[4, 5],
    );
    if rows.len() == filter.limit {
        out.push_str(&format!(
            "(first {} shown: raise --limit or narrow with --name / --status / --older-than)\n",
            filter.limit
        ));
    }
    Ok(out)
}

async fn release(ctx: &Ctx, k: &KeyArgs, force: bool) -> Result<String, Failure> {
    let (digest, label) = digest_of(k)?;
    let store = ctx.open().await?;
    let nothing = || {
        Failure::new(
            NOT_FOUND,
            "not-found",
            format!(
                "nothing to release: no live record for {label} (digest {digest}). The key is \
                 free already (a claim whose lease ended needs no release); the next call runs \
                 the body."
            ),
        )
    };
    if !force {
        let r = store
            .get(&digest)
            .await
            .map_err(|e| ctx.failure(e))?
            .ok_or_else(nothing)?;
        let ago = human(ms(r.now - r.created_at));
        let left = human(r.remaining());
        let message = match r.status {
            Status::InProgress => format!(
                "refused: {label} is in progress, claimed {ago} ago (token {}), and its lease \
                 is live for another {left}. A live lease means an attempt may still be running \
                 the body: releasing now lets a retry run it a second time, at the same time. \
                 Check that no process still works on it (and whether its side effect \
                 happened), then run again with --force. Nothing was changed.",
                r.token
            ),
            Status::Completed => format!(
                "refused: {label} completed {ago} ago; its result ({} bytes) is replayed to \
                 every retry for another {left}. Releasing deletes that result, and the next \
                 call runs the body again (its side effect repeats). If that is what you want, \
                 run again with --force. Nothing was changed.",
                r.value.as_ref().map_or(0, Vec::len)
            ),
        };
        return Err(Failure::new(REFUSED, "refused", message));
    }
    let r = store
        .force_release(&digest)
        .await
        .map_err(|e| ctx.failure(e))?
        .ok_or_else(nothing)?;
    let live = r.expires_at > r.now;
    let what = match (r.status, live) {
        (_, false) => "deleted an expired record (it was not live)".to_string(),
        (Status::InProgress, true) => format!(
            "deleted the in-progress claim (token {}, claimed {} ago, {} of lease left)",
            r.token,
            human(ms(r.now - r.created_at)),
            human(r.remaining())
        ),
        (Status::Completed, true) => format!(
            "deleted the completed result ({} bytes, {} of TTL left)",
            r.value.as_ref().map_or(0, Vec::len),
            human(r.remaining())
        ),
    };
    if ctx.json {
        let mut was = info_json(&KeyInfo::from(&r));
        was["live"] = Value::Bool(live);
        return Ok(doc(
            json!({"released": true, "digest": digest.to_hex(), "was": was}),
        ));
    }
    Ok(format!(
        "released {label}: {what}. The next call with this key runs the body.\n"
    ))
}

async fn stats(ctx: &Ctx) -> Result<String, Failure> {
    let store = ctx.open().await?;
    let stats = store.stats().await.map_err(|e| ctx.failure(e))?;
    // One row per namespace: [in progress, completed, expired].
    let mut by_name: std::collections::BTreeMap<String, [u64; 3]> = Default::default();
    let mut total = [0u64; 3];
    for s in &stats {
        let i = match s.state {
            State::InProgress => 0,
            State::Completed => 1,
            State::Expired => 2,
        };
        by_name.entry(s.name.clone()).or_default()[i] += s.count;
        total[i] += s.count;
    }
    if ctx.json {
        let names: Vec<Value> = by_name
            .iter()
            .map(|(n, c)| json!({"name": n, "in_progress": c[0], "completed": c[1], "expired": c[2]}))
            .collect();
        return Ok(doc(json!({
            "names": names,
            "total": {"in_progress": total[0], "completed": total[1], "expired": total[2]},
        })));
    }
    let mut rows: Vec<Vec<String>> = by_name
        .iter()
        .map(|(n, c)| {
            let mut row = vec![n.clone()];
            row.extend(c.iter().map(u64::to_string));
            row
        })
        .collect();
    let mut last = vec!["(total)".to_string()];
    last.extend(total.iter().map(u64::to_string));
    rows.push(last);
    Ok(output::table(
        &["NAME", "IN-PROGRESS", "COMPLETED", "EXPIRED"],
        &rows,
        &[1, 2, 3],
    ))
}

async fn purge(ctx: &Ctx, batch: usize) -> Result<String, Failure> {
    let store = ctx.open().await?;
    if store.backend() == "redis" {
        let msg = "Redis expires idem records by itself (PEXPIREAT): nothing to purge.";
        return Ok(if ctx.json {
            doc(json!({"purged": 0, "note": msg}))
        } else {
            format!("{msg}\n")
        });
    }
    let terminal = std::io::stderr().is_terminal();
    // The bar needs a total: one counting query, only when someone watches.
    let expected = if terminal {
        let stats = store.stats().await.map_err(|e| ctx.failure(e))?;
        Some(
            stats
                .iter()
                .filter(|s| s.state == State::Expired)
                .map(|s| s.count)
                .sum::<u64>(),
        )
    } else {
        None
    };
    let mut stderr = std::io::stderr();
    let purged = admin::purge_expired(store.as_ref(), batch, |done| {
        if let Some(total) = expected.filter(|t| *t > 0) {
            let pct = (done.min(total) * 100) / total;
            let width = 30usize;
            let fill = (pct as usize * width) / 100;
            let _ = write!(
                stderr,
                "\rpurging [{}{}] {done}/{total} ({pct}%)",
                "#".repeat(fill),
                " ".repeat(width - fill)
            );
            let _ = stderr.flush();
        }
    })
    .await
    .map_err(|e| ctx.failure(e))?;
    if expected.is_some_and(|t| t > 0) {
        eprintln!();
    }
    Ok(if ctx.json {
        doc(json!({"purged": purged}))
    } else {
        format!("purged {purged} expired records.\n")
    })
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
        assert_eq!(pg_user("postgres://app:pw@h/d").as_deref(), Some("app"));
        assert_eq!(pg_user("postgres://h/d"), None);
    }

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

    #[test]
    fn cli_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
