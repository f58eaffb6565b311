//! The commands: each opens the store, does one thing, and hands what it found to `render`.

use crate::cli::{Cli, Command, KeyArgs, StatusArg};
use crate::digest::{shown_key, Named};
use crate::failure::{Failure, Situation, REFUSED};
use crate::render;
use idem::admin::{self, Filter, Inspect, State, Target};
use idem::store::{Backend, Record, Status};
use std::io::{IsTerminal, Write};

/// Everything a command needs: the store and how to print.
pub(crate) struct Ctx {
    url: String,
    target: Target,
    pub(crate) json: bool,
    command: &'static str,
}

/// Runs the command line: what to print on stdout, or the failure.
pub(crate) async fn run(cli: Cli) -> Result<String, Failure> {
    // the one command without a store
    if let Command::Check(args) = cli.command {
        return crate::check::run(args, cli.json).await;
    }
    let Some(url) = crate::board::store_url(&cli.command).or(cli.url) else {
        return Err(Failure::usage(
            "no store URL: pass --url (or set IDEM_URL) to sqlite://FILE, \
             postgres://USER@HOST:PORT/DATABASE or redis://HOST:PORT/",
        ));
    };
    let outbox_table = cli
        .outbox_table
        .unwrap_or_else(|| idem::outbox::DEFAULT_OUTBOX_TABLE.to_string());
    let ctx = Ctx {
        url,
        target: Target::new(cli.table, cli.prefix).application_name("idem-cli"),
        json: cli.json,
        command: cli.command.name(),
    };
    match cli.command {
        Command::Migrate => migrate(&ctx).await,
        Command::Show {
            key,
            value,
            keyring,
        } => show(&ctx, &key, value, keyring.as_deref()).await,
        Command::List {
            name,
            status,
            older_than,
            limit,
            tombstones,
        } => {
            let filter = Filter::new()
                .name(name)
                .status(status.map(|s| match s {
                    StatusArg::InProgress => Status::InProgress,
                    StatusArg::Completed => Status::Completed,
                    StatusArg::Parked => Status::Parked,
                }))
                .older_than(older_than)
                .limit(limit)
                .tombstones(tombstones);
            list(&ctx, &filter).await
        }
        Command::Release { key, force } => release(&ctx, &key, force).await,
        Command::Purge { batch, .. } => purge(&ctx, batch).await,
        Command::Stats => stats(&ctx).await,
        Command::Pending { name, limit } => {
            crate::resolve::pending(&ctx, name.as_deref(), limit).await
        }
        Command::Resolve(args) => crate::resolve::resolve(&ctx, &args).await,
        Command::Check(args) => crate::check::run(args, ctx.json).await,
        Command::Board(args) => crate::board::run(args, ctx.url, ctx.target, outbox_table).await,
        Command::Outbox { command } => {
            crate::outbox::run(&ctx.url, &outbox_table, ctx.command, ctx.json, command).await
        }
    }
}

impl Ctx {
    pub(crate) async fn open(&self) -> Result<Box<dyn Inspect>, Failure> {
        admin::open(&self.url, &self.target)
            .await
            .map_err(|e| self.failure(e))
    }

    /// An `idem::Error` as a failure whose message says what to do.
    pub(crate) fn failure(&self, e: idem::Error) -> Failure {
        Situation {
            url: &self.url,
            table: self.target.table.as_deref(),
            command: self.command,
        }
        .failure(e)
    }

    /// The live record of `key`, or `missing()`; a record outside the namespace given with
    /// `--digest` is not this key's.
    pub(crate) async fn live_record(
        &self,
        store: &dyn Inspect,
        key: &Named,
        missing: impl FnOnce() -> Failure,
    ) -> Result<Record, Failure> {
        let r = store
            .get(&key.digest)
            .await
            .map_err(|e| self.failure(e))?
            .ok_or_else(missing)?;
        key.check_namespace(&r.name)
            .map_err(|other| wrong_namespace(key, other))?;
        Ok(r)
    }
}

/// The record under a `--digest` is in another namespace than the one given beside it.
fn wrong_namespace(key: &Named, found: &str) -> Failure {
    Failure::not_found(format!(
        "no live record for {} (digest {}): the record with that digest is in namespace \
         `{found}`, not `{}`. Nothing was changed.",
        key.label,
        key.digest,
        key.namespace.as_deref().unwrap_or_default()
    ))
}

async fn migrate(ctx: &Ctx) -> Result<String, Failure> {
    let m = admin::migrate(&ctx.url, &ctx.target)
        .await
        .map_err(|e| ctx.failure(e))?;
    Ok(render::migrated(&m, ctx.json))
}

async fn show(
    ctx: &Ctx,
    k: &KeyArgs,
    with_value: bool,
    keyring: Option<&str>,
) -> Result<String, Failure> {
    let keyring = keyring
        .map(idem::Keyring::parse)
        .transpose()
        .map_err(|e| Failure::usage(format!("--keyring: {e}")))?;
    let key = Named::from_args(k)?;
    let store = ctx.open().await?;
    let missing = || {
        Failure::not_found(format!(
            "no live record for {} (digest {}): the key is free, the next call with it runs \
             the body. If you expected one, check the namespace, the key's exact spelling and \
             type (a number key needs --json-key, e.g. --json-key 1234) and --scope; \
             `idem list --name NAME` shows what is there.",
            key.label, key.digest
        ))
    };
    let r = ctx.live_record(store.as_ref(), &key, missing).await?;
    let value = with_value.then(|| match &keyring {
        Some(ring) => admin::open_value_with(&r, ring),
        None => admin::open_value(&r),
    });
    Ok(render::record(
        &r,
        &key.digest,
        shown_key(k),
        value,
        ctx.json,
    ))
}

async fn list(ctx: &Ctx, filter: &Filter) -> Result<String, Failure> {
    let store = ctx.open().await?;
    let rows = store.list(filter).await.map_err(|e| ctx.failure(e))?;
    Ok(render::records(&rows, filter.limit, ctx.json))
}

async fn release(ctx: &Ctx, k: &KeyArgs, force: bool) -> Result<String, Failure> {
    let key = Named::from_args(k)?;
    let store = ctx.open().await?;
    let nothing = || {
        Failure::not_found(format!(
            "nothing to release: no live record for {} (digest {}). The key is free already \
             (a claim whose lease ended needs no release); the next call runs the body.",
            key.label, key.digest
        ))
    };
    // Without --force, look before refusing; with --digest and NAME, make sure the record is
    // in that namespace before deleting anything.
    if !force || key.namespace.is_some() {
        let r = ctx.live_record(store.as_ref(), &key, nothing).await?;
        if !force {
            return Err(Failure::new(
                REFUSED,
                "refused",
                render::refusal(&key.label, &r),
            ));
        }
    }
    let r = store
        .force_release(&key.digest)
        .await
        .map_err(|e| ctx.failure(e))?
        .ok_or_else(nothing)?;
    Ok(render::released(&key.label, &key.digest, &r, ctx.json))
}

async fn stats(ctx: &Ctx) -> Result<String, Failure> {
    let store = ctx.open().await?;
    let stats = store.stats().await.map_err(|e| ctx.failure(e))?;
    Ok(render::stats(&stats, ctx.json))
}

async fn purge(ctx: &Ctx, batch: usize) -> Result<String, Failure> {
    let store = ctx.open().await?;
    // Redis expires records itself; no other store does.
    if store.backend() == Backend::Redis {
        return Ok(render::nothing_to_purge(
            "Redis expires idem records by itself (PEXPIREAT): nothing to purge.",
            ctx.json,
        ));
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
    Ok(render::purged(purged, ctx.json))
}
