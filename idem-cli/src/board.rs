//! `idem board`: the operators' web board (the `idem-board` crate) on the store of `--url` /
//! `--store`, until Ctrl-C.

use crate::cli::Command;
use crate::failure::{Failure, Situation};
use clap::Args;
use idem::admin::Target;
use std::net::SocketAddr;

/// `idem board`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct BoardArgs {
    /// The store (the same as --url)
    #[arg(long, value_name = "URL", env = "IDEM_URL", hide_env_values = true)]
    store: Option<String>,
    /// Where to listen; an address other than loopback needs --token
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// The token every request must carry (bearer, or the login form's cookie); at least 16
    /// characters
    #[arg(long, env = "IDEM_BOARD_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// The URL `idem board --store` gives, which wins over `--url`.
pub(crate) fn store_url(command: &Command) -> Option<String> {
    match command {
        Command::Board(args) => args.store.clone(),
        _ => None,
    }
}

/// Serves the board until Ctrl-C.
pub(crate) async fn run(
    args: BoardArgs,
    url: String,
    target: Target,
    outbox_table: String,
) -> Result<String, Failure> {
    let situation = Situation {
        url: &url,
        table: target.table.as_deref(),
        command: "board",
    };
    let options = idem_board::BoardOptions::new(url.clone())
        .target(target.clone())
        .outbox_table(outbox_table)
        .listen(args.listen)
        .token(args.token);
    idem_board::run(options)
        .await
        .map_err(|e| situation.failure(e))?;
    Ok(String::new())
}
