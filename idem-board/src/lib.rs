//! The operators' web board of an idem store: what `idem board --url URL --listen ADDR` serves.
//!
//! Server-rendered HTML on the same admin API as the `idem` command line
//! ([`idem::admin::open`], [`Inspect`]): an overview (records by state and function, the oldest
//! attempt in flight, keys expiring soon, the outbox's pending and dead messages), lists with
//! filters and keyset paging ([`Inspect::page`]), a key's page (its record, value and steps),
//! and actions behind a confirmation page: force-release a key, purge expired records, put dead
//! letters back in the queue.
//!
//! Safe by default: without a token the board listens on loopback only and answers only
//! requests addressed to a loopback host name; with one, every request needs it (a bearer
//! token, or the cookie the login form sets), compared in constant time. Actions are POSTs
//! carrying a CSRF token. The store URL's password is never shown.
#![warn(missing_docs)]

mod auth;
mod counts;
mod key;
mod outbox;
mod pages;
mod parked;
mod routes;
mod time;

use idem::admin::{self, Inspect, Target};
use idem::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// How to start a board.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BoardOptions {
    /// The store's URL, as the `idem` command line takes it.
    pub url: String,
    /// The store's table or key prefix.
    pub target: Target,
    /// The outbox table shown beside the records (PostgreSQL and MySQL stores).
    pub outbox_table: String,
    /// Where to listen.
    pub listen: SocketAddr,
    /// The token every request must carry; without one the board binds loopback only.
    pub token: Option<String>,
}

impl BoardOptions {
    /// A board of the store at `url` on `127.0.0.1:9090`, default table, no token.
    pub fn new(url: impl Into<String>) -> Self {
        BoardOptions {
            url: url.into(),
            target: Target::default(),
            outbox_table: idem::outbox::DEFAULT_OUTBOX_TABLE.to_string(),
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
        }
    }

    /// The store's table (SQL, DynamoDB) and key prefix (Redis).
    pub fn target(mut self, target: Target) -> Self {
        self.target = target;
        self
    }

    /// The outbox table (default `idem_outbox`).
    pub fn outbox_table(mut self, table: impl Into<String>) -> Self {
        self.outbox_table = table.into();
        self
    }

    /// Where to listen (port 0: any free port, see [`Board::local_addr`]).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The token every request must carry (`None`: loopback only, no token).
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }
}

/// What every request handler shares.
pub(crate) struct App {
    pub(crate) store: Box<dyn Inspect>,
    pub(crate) outbox: Option<outbox::OutboxHandle>,
    /// The store URL without its password.
    pub(crate) shown_url: String,
    /// The password, scrubbed from any error text a page shows.
    pub(crate) password: Option<String>,
    pub(crate) auth: auth::Auth,
    /// The overview's last count.
    pub(crate) counts: counts::Counts,
}

impl App {
    /// An error's text as a page may show it: never the store's password.
    pub(crate) fn scrub(&self, e: &Error) -> String {
        let text = e.to_string();
        match &self.password {
            Some(p) if !p.is_empty() => {
                let encoded =
                    percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC)
                        .to_string();
                text.replace(p.as_str(), "***").replace(&encoded, "***")
            }
            _ => text,
        }
    }
}

/// A board bound to its address, ready to serve.
pub struct Board {
    listener: tokio::net::TcpListener,
    router: axum::Router,
    addr: SocketAddr,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board").field("addr", &self.addr).finish()
    }
}

impl Board {
    /// Opens the store (creating nothing), its outbox when it has one, and binds the address.
    /// A non-loopback address without a token is [`Error::Config`].
    pub async fn bind(options: BoardOptions) -> Result<Board, Error> {
        if options.token.is_none() && !options.listen.ip().is_loopback() {
            return Err(Error::config(format!(
                "refusing to listen on {} without --token: the board shows every key of the \
                 store; give a token (at least 16 characters) or listen on 127.0.0.1",
                options.listen
            )));
        }
        if options.token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err(Error::config(
                "the board's token must be at least 16 characters long",
            ));
        }
        let target = options.target.clone().application_name("idem-board");
        let store = admin::open(&options.url, &target).await?;
        let outbox = outbox::OutboxHandle::open(&options.url, &options.outbox_table).await;
        let (shown_url, password) = redact(&options.url);
        let app = Arc::new(App {
            store,
            outbox,
            shown_url,
            password,
            auth: auth::Auth::new(options.token)?,
            counts: counts::Counts::default(),
        });
        // The first count starts now, so that the first overview seldom waits for it.
        counts::recount(&app);
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|e| Error::config(format!("cannot listen on {}: {e}", options.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::config(format!("cannot listen on {}: {e}", options.listen)))?;
        Ok(Board {
            listener,
            router: routes::router(app),
            addr,
        })
    }

    /// The address the board listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        // A failing accept is retried by axum itself; serve returns only at shutdown.
        let _ = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
    }
}

/// Serves the board of `options` until Ctrl-C, telling the operator where on stderr.
pub async fn run(options: BoardOptions) -> Result<(), Error> {
    let board = Board::bind(options).await?;
    eprintln!(
        "idem board: http://{}/ (Ctrl-C stops it)",
        board.local_addr()
    );
    board
        .serve_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}

/// The URL with its password replaced by `***`, and the password.
fn redact(url: &str) -> (String, Option<String>) {
    match url::Url::parse(url) {
        Ok(mut parsed) => match parsed.password().map(str::to_string) {
            Some(password) => {
                let _ = parsed.set_password(Some("***"));
                let decoded = percent_encoding::percent_decode_str(&password)
                    .decode_utf8_lossy()
                    .into_owned();
                (parsed.to_string(), Some(decoded))
            }
            None => (url.to_string(), None),
        },
        // Not a URL the parser reads (a bare SQLite path): nothing to hide in it.
        Err(_) => (url.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_never_shown() {
        let (shown, password) = redact("postgres://app:s3%2Fcret@db:5432/x");
        assert_eq!(shown, "postgres://app:***@db:5432/x");
        assert_eq!(password.as_deref(), Some("s3/cret"));
        assert_eq!(redact("sqlite://a.db").1, None);
        assert_eq!(
            redact("redis://127.0.0.1:6379/").0,
            "redis://127.0.0.1:6379/"
        );
    }
}
