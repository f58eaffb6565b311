//! `idem outbox …`: the transactional outbox's messages on PostgreSQL or MySQL / MariaDB (by
//! the URL's scheme) — what is pending or dead, dead letters put back in the queue, delivered
//! messages purged — and what each prints.

use crate::cli::{OutboxCommand, OutboxStateArg};
use crate::failure::{Failure, Situation};
use crate::format::{human, table};
use crate::render::doc;
use idem::outbox::{ListFilter, MessageInfo, MessageState, Outbox, OutboxDatabase, OutboxStats};
use idem::postgres::sqlx::mysql::MySqlPoolOptions;
use idem::postgres::sqlx::postgres::PgPoolOptions;
use idem::postgres::sqlx::{MySql, Pool, Postgres};
use serde_json::{json, Value};
use std::future::Future;
use std::time::Duration;

/// A database the outbox commands open by URL: each opens its outbox its own way.
trait OutboxUrl: OutboxDatabase {
    /// `Outbox::connect…`: checked, nothing created.
    fn open(url: &str, table: &str) -> impl Future<Output = Result<Outbox<Self>, idem::Error>>;
    /// An outbox on a lazy one-connection pool, for `idem outbox migrate`.
    fn for_migration(url: &str, table: &str) -> Result<Outbox<Self>, idem::Error>;
    /// Closes the pool.
    fn close(pool: &Pool<Self>) -> impl Future<Output = ()>;
}

impl OutboxUrl for Postgres {
    fn open(url: &str, table: &str) -> impl Future<Output = Result<Outbox<Self>, idem::Error>> {
        Outbox::connect_as(url, table, Some("idem-cli"))
    }
    fn for_migration(url: &str, table: &str) -> Result<Outbox<Self>, idem::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy(url)
            .map_err(|e| idem::Error::config(format!("invalid PostgreSQL URL: {e}")))?;
        Outbox::with_table(pool, table)
    }
    fn close(pool: &Pool<Self>) -> impl Future<Output = ()> {
        pool.close()
    }
}

impl OutboxUrl for MySql {
    fn open(url: &str, table: &str) -> impl Future<Output = Result<Outbox<Self>, idem::Error>> {
        Outbox::connect_mysql(url, table)
    }
    fn for_migration(url: &str, table: &str) -> Result<Outbox<Self>, idem::Error> {
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy(url)
            .map_err(|e| idem::Error::config(format!("invalid MySQL URL: {e}")))?;
        Outbox::mysql_with_table(pool, table)
    }
    fn close(pool: &Pool<Self>) -> impl Future<Output = ()> {
        pool.close()
    }
}

/// True for a MySQL / MariaDB URL; anything else is opened as PostgreSQL, which refuses what
/// is not its own.
fn is_mysql(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}

/// Where the command runs: for hints and the outbox's connection.
struct Here<'a> {
    url: &'a str,
    table: &'a str,
    command: &'static str,
    json: bool,
}

impl Here<'_> {
    fn failure(&self, e: idem::Error) -> Failure {
        Situation {
            url: self.url,
            table: Some(self.table),
            command: self.command,
        }
        .failure(e)
    }

    async fn open<Db: OutboxUrl>(&self) -> Result<Outbox<Db>, Failure> {
        Db::open(self.url, self.table)
            .await
            .map_err(|e| self.failure(e))
    }
}

/// Runs one `idem outbox` command: what to print on stdout, or the failure.
pub(crate) async fn run(
    url: &str,
    table: &str,
    command: &'static str,
    json: bool,
    what: OutboxCommand,
) -> Result<String, Failure> {
    let here = Here {
        url,
        table,
        command,
        json,
    };
    if is_mysql(url) {
        run_on::<MySql>(&here, what).await
    } else {
        run_on::<Postgres>(&here, what).await
    }
}

/// One command on an outbox of database `Db`.
async fn run_on<Db: OutboxUrl>(here: &Here<'_>, what: OutboxCommand) -> Result<String, Failure> {
    let (table, json) = (here.table, here.json);
    match what {
        OutboxCommand::Migrate => migrate::<Db>(here).await,
        OutboxCommand::Stats => {
            let stats = here
                .open::<Db>()
                .await?
                .stats()
                .await
                .map_err(|e| here.failure(e))?;
            Ok(render_stats(table, &stats, json))
        }
        OutboxCommand::List {
            state,
            topic,
            ordering_key,
            limit,
        } => {
            let mut filter = ListFilter::new().limit(limit);
            if let Some(s) = state {
                filter = filter.state(match s {
                    OutboxStateArg::Pending => MessageState::Pending,
                    OutboxStateArg::Delivered => MessageState::Delivered,
                    OutboxStateArg::Dead => MessageState::Dead,
                });
            }
            if let Some(t) = topic {
                filter = filter.topic(t);
            }
            if let Some(k) = ordering_key {
                filter = filter.ordering_key(k);
            }
            let outbox = here.open::<Db>().await?;
            let rows = outbox.list(&filter).await.map_err(|e| here.failure(e))?;
            Ok(render_list(&rows, limit, json))
        }
        OutboxCommand::Retry { id, .. } => retry::<Db>(here, id.as_deref()).await,
        OutboxCommand::Purge {
            delivered_older_than,
        } => {
            let older = delivered_older_than.unwrap_or_default();
            let outbox = here.open::<Db>().await?;
            let n = outbox
                .purge_delivered(older)
                .await
                .map_err(|e| here.failure(e))?;
            Ok(if json {
                doc(json!({"purged": n, "delivered_older_than_ms": older.as_millis() as u64}))
            } else {
                format!(
                    "purged {n} delivered messages (delivered more than {} ago); pending and \
                     dead messages are kept.\n",
                    human(older)
                )
            })
        }
    }
}

async fn migrate<Db: OutboxUrl>(here: &Here<'_>) -> Result<String, Failure> {
    if !(here.url.starts_with("postgres://")
        || here.url.starts_with("postgresql://")
        || is_mysql(here.url))
    {
        return Err(Failure::usage(
            "the outbox is on PostgreSQL or MySQL: --url must be \
             postgres://USER@HOST:PORT/DATABASE or mysql://USER@HOST:PORT/DATABASE",
        ));
    }
    let outbox = Db::for_migration(here.url, here.table).map_err(|e| here.failure(e))?;
    let from = outbox.schema_version().await.map_err(|e| here.failure(e))?;
    let outbox = outbox.migrate().await.map_err(|e| here.failure(e))?;
    let to = outbox.schema_version().await.map_err(|e| here.failure(e))?;
    Db::close(outbox.pool()).await;
    Ok(if here.json {
        doc(json!({"table": here.table, "from": from, "to": to, "changed": from != to}))
    } else if from == 0 {
        format!("outbox table {}: created (version {to}).\n", here.table)
    } else if from == to {
        format!(
            "outbox table {}: the schema is current (version {to}). Nothing to do.\n",
            here.table
        )
    } else {
        format!(
            "outbox table {}: upgraded from version {from} to {to}.\n",
            here.table
        )
    })
}

async fn retry<Db: OutboxUrl>(here: &Here<'_>, id: Option<&str>) -> Result<String, Failure> {
    let outbox = here.open::<Db>().await?;
    let n = outbox.retry_dead(id).await.map_err(|e| here.failure(e))?;
    if let (Some(id), 0) = (id, n) {
        // Say why nothing was done: no such message, or one that is not dead.
        let state = outbox.state_of(id).await.map_err(|e| here.failure(e))?;
        return Err(Failure::not_found(match state {
            None => format!(
                "no message with id {id} in outbox table {} (never enqueued, or delivered and \
                 purged). `idem outbox list --state dead` shows the dead letters. Nothing was \
                 changed.",
                here.table
            ),
            Some(s) => format!(
                "message {id} is {}, not dead: there is nothing to retry (the relays deliver \
                 pending messages themselves). Nothing was changed.",
                s.as_str()
            ),
        }));
    }
    Ok(if here.json {
        doc(json!({"retried": n, "id": id}))
    } else {
        match id {
            Some(id) => format!(
                "re-queued dead letter {id} (attempts reset): the relays deliver it at their \
                 next round.\n"
            ),
            None if n == 0 => "no dead letters: nothing to retry.\n".into(),
            None => format!(
                "re-queued {n} dead letters (attempts reset): the relays deliver them at their \
                 next round.\n"
            ),
        }
    })
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// `idem outbox stats`.
fn render_stats(table: &str, s: &OutboxStats, json: bool) -> String {
    if json {
        return doc(json!({
            "table": table,
            "pending": s.pending,
            "delivered": s.delivered,
            "dead": s.dead,
            "oldest_pending_ms": s.oldest_pending.map(ms),
        }));
    }
    let oldest = s.oldest_pending.map_or(String::new(), |d| {
        format!(" (the oldest waiting for {})", human(d))
    });
    let mut out = format!(
        "outbox table {table}\n\
         pending     {}{oldest}\n\
         dead        {}\n\
         delivered   {} (awaiting purge)\n",
        s.pending, s.dead, s.delivered
    );
    if s.dead > 0 {
        out.push_str(
            "\nDead letters failed every attempt and are no longer tried: `idem outbox list \
             --state dead` shows them with their last error; `idem outbox retry ID` (or --all) \
             puts them back in the queue.\n",
        );
    }
    out
}

fn info_json(m: &MessageInfo) -> Value {
    json!({
        "id": m.id,
        "topic": m.topic,
        "ordering_key": m.ordering_key,
        "state": m.state.as_str(),
        "attempts": m.attempts,
        "age_ms": ms(m.age),
        "next_attempt_in_ms": m.next_attempt_in.map(ms),
        "last_error": m.last_error,
        "payload_len": m.payload_len,
    })
}

/// The first `n` characters of one line of `s`, with `…` when cut.
fn clip(s: &str, n: usize) -> String {
    let line = s.lines().next().unwrap_or_default();
    if line.chars().count() <= n && line.len() == s.len() {
        return line.to_string();
    }
    let mut out: String = line.chars().take(n).collect();
    out.push('…');
    out
}

/// `idem outbox list`.
fn render_list(rows: &[MessageInfo], limit: usize, json: bool) -> String {
    if json {
        return doc(Value::Array(rows.iter().map(info_json).collect()));
    }
    if rows.is_empty() {
        return "no outbox messages match\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.state.as_str().into(),
                m.topic.clone(),
                if m.ordering_key.is_empty() {
                    "-".into()
                } else {
                    m.ordering_key.clone()
                },
                m.attempts.to_string(),
                human(m.age),
                m.next_attempt_in.map_or("-".into(), human),
                m.last_error.as_deref().map_or("-".into(), |e| clip(e, 60)),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "STATE",
            "TOPIC",
            "KEY",
            "ATTEMPTS",
            "AGE",
            "NEXT",
            "LAST ERROR",
        ],
        &cells,
        &[4],
    );
    if rows.len() == limit {
        out.push_str(&format!(
            "(first {limit} shown: raise --limit or narrow with --state / --topic / --ordering-key)\n"
        ));
    }
    out
}
