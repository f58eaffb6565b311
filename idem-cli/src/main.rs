//! `idem`: find, inspect, release and purge idempotency keys in any idem store.
//!
//! See the README section "Operating idem" for a walk-through, and `idem --help` for the exit
//! codes. The files: `cli` (the command line), `commands` (what each command does), `digest`
//! (the key on the command line), `render` and `format` (what is printed), `failure` (exit
//! codes and hints), `resolve` (parked keys: `pending` and `resolve`).
#![warn(missing_docs)]

mod board;
mod check;
mod cli;
mod commands;
mod digest;
mod failure;
mod format;
mod outbox;
mod render;
mod resolve;

use clap::Parser;
use failure::{STORE, USAGE};
use serde_json::json;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
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
    match rt.block_on(commands::run(cli)) {
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
