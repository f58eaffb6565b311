//! Helpers shared by the PostgreSQL test binaries: what every SQL backend's tests share
//! (`sql_common`), an admin pool, and a loopback proxy that counts the round trips of the wire
//! protocol.
#![allow(dead_code)]

#[path = "../sql_common/mod.rs"]
mod sql_common;
#[allow(unused_imports)]
pub use sql_common::*;

use sqlx::postgres::{PgPool, PgPoolOptions};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A small pool for the test's own statements.
pub async fn admin(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("admin connection to PostgreSQL")
}

/// Drops a store table and its version table.
pub async fn drop_table(admin: &PgPool, table: &str) {
    for t in [table.to_string(), format!("{table}_migrations")] {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
            .execute(admin)
            .await;
    }
}

/// `host:port` of a `postgres://…@host:port/…` URL (loopback in these tests).
pub fn server_addr(url: &str) -> SocketAddr {
    let after_at = url.rsplit('@').next().unwrap();
    let host_port = after_at.split('/').next().unwrap();
    let host_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    let host_port = host_port.replace("localhost", "127.0.0.1");
    host_port.parse().expect("a loopback host:port in the URL")
}

/// `url` with its host and port replaced by `addr`, and TLS off (so the proxy can read it).
pub fn url_via(url: &str, addr: SocketAddr) -> String {
    let (head, rest) = url.rsplit_once('@').unwrap();
    let path = rest.split_once('/').map(|(_, p)| p).unwrap_or("");
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{head}@{addr}/{path}{sep}sslmode=disable")
}

/// What the client side of the wire protocol sent, by kind of round trip.
#[derive(Default, Debug)]
pub struct Counts {
    /// Syncs that closed a Bind/Execute: one statement executed, one wait for its answer.
    pub statements: AtomicUsize,
    /// Syncs that closed a Parse without an Execute: a statement prepared (first use on a
    /// connection; sqlx caches it afterwards).
    pub prepares: AtomicUsize,
    /// Syncs with nothing before them: sqlx's liveness pings.
    pub pings: AtomicUsize,
    /// Simple-protocol queries (`BEGIN`, `COMMIT`, DDL).
    pub simple: AtomicUsize,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    pub statements: usize,
    pub prepares: usize,
    pub pings: usize,
    pub simple: usize,
}

impl std::ops::Sub for Seen {
    type Output = Seen;
    fn sub(self, o: Seen) -> Seen {
        Seen {
            statements: self.statements - o.statements,
            prepares: self.prepares - o.prepares,
            pings: self.pings - o.pings,
            simple: self.simple - o.simple,
        }
    }
}

/// A TCP proxy on 127.0.0.1 in front of the server that parses the frontend messages of the
/// PostgreSQL protocol and counts the client's round trips: every `Sync` (extended protocol)
/// and every `Query` (simple protocol) is a point where the client stops and waits for the
/// server's `ReadyForQuery`.
pub struct Proxy {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Counts::default());
        let conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Default::default();
        let (c, cs) = (counts.clone(), conns.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let h = tokio::spawn(relay(client, server, c.clone()));
                cs.lock().unwrap().push(h);
            }
        });
        Proxy {
            addr,
            counts,
            task,
            conns,
        }
    }

    pub fn seen(&self) -> Seen {
        let c = &self.counts;
        Seen {
            statements: c.statements.load(Ordering::SeqCst),
            prepares: c.prepares.load(Ordering::SeqCst),
            pings: c.pings.load(Ordering::SeqCst),
            simple: c.simple.load(Ordering::SeqCst),
        }
    }

    /// Stops accepting and cuts every relayed connection: the server looks down from behind
    /// the proxy (connections refused, established ones reset).
    pub fn stop(&self) {
        self.task.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn relay(client: TcpStream, server: TcpStream, counts: Arc<Counts>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
    });
    let up = async move {
        // Startup phase: untyped messages (SSLRequest / GSSENCRequest, then StartupMessage).
        loop {
            let mut len = [0u8; 4];
            cr.read_exact(&mut len).await?;
            let n = u32::from_be_bytes(len) as usize;
            let mut body = vec![0u8; n.saturating_sub(4)];
            cr.read_exact(&mut body).await?;
            sw.write_all(&len).await?;
            sw.write_all(&body).await?;
            let code = body
                .get(..4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()));
            if !matches!(code, Some(80877103) | Some(80877104)) {
                break;
            }
        }
        let (mut parsed, mut executed) = (false, false);
        loop {
            let mut head = [0u8; 5];
            cr.read_exact(&mut head).await?;
            let n = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
            let mut body = vec![0u8; n.saturating_sub(4)];
            cr.read_exact(&mut body).await?;
            match head[0] {
                b'P' => parsed = true,
                b'E' => executed = true,
                b'Q' => {
                    counts.simple.fetch_add(1, Ordering::SeqCst);
                }
                b'S' => {
                    let c = if executed {
                        &counts.statements
                    } else if parsed {
                        &counts.prepares
                    } else {
                        &counts.pings
                    };
                    c.fetch_add(1, Ordering::SeqCst);
                    (parsed, executed) = (false, false);
                }
                _ => {}
            }
            sw.write_all(&head).await?;
            sw.write_all(&body).await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    };
    let _ = up.await;
    down.abort();
}
