//! idem-proxy against calling its upstream directly, paired in one run: the same client, the
//! same upstream (a hyper server in this process, answering at once or after a delay), blocks
//! of requests sent alternately straight to the upstream and through the proxy, so that both
//! sides see the same machine at the same moments.
//!
//! Modes: `fresh` (a new key per request: the proxy claims, forwards, stores) and `replay` (each
//! client task repeats its own key: the proxy answers from the store; the upstream, called
//! directly, runs every time). At c = 1, 16 and 64, on the memory store, and on PostgreSQL when
//! IDEM_TEST_POSTGRES_URL is set. Reports p50 / p99 of each side, what the proxy adds, and the
//! throughput ratio (proxy / direct).
//!
//!   cargo bench --workspace --all-features --bench proxy

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Alternating blocks per measurement, and requests per block and client task.
const ROUNDS: usize = 8;

fn per_task(c: usize) -> usize {
    match c {
        1 => 250,
        16 => 40,
        _ => 12,
    }
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// The upstream: 201 with a small JSON body, after `delay`.
async fn upstream(delay: Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            let runs = runs.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let runs = runs.clone();
                async move {
                    let _ = req.into_body().collect().await;
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let n = runs.fetch_add(1, Ordering::Relaxed);
                    let body = format!("{{\"id\":{n},\"status\":\"charged\",\"amount\":100}}");
                    let res = Response::builder()
                        .status(201)
                        .header("content-type", "application/json")
                        .header("x-charge-id", format!("ch_{n}"))
                        .body(Full::new(Bytes::from(body)))
                        .unwrap();
                    Ok::<_, Infallible>(res)
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

struct Proxy(Child, String);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy (its per-request log lines written, to nowhere) in front of `up`, on `store`.
fn proxy(up: SocketAddr, store: &str) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem-proxy"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("http://{up}"),
            "--store",
            store,
            "--allow-anonymous",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("idem-proxy");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.split_whitespace().nth(3).expect(&line).to_owned();
    Proxy(child, url)
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn send(client: &HttpClient, url: &str, key: &str) -> Duration {
    let req = Request::post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .unwrap();
    let start = Instant::now();
    let res = client.request(req).await.expect("request");
    let status = res.status();
    let _ = res.into_body().collect().await.expect("body");
    let took = start.elapsed();
    assert!(status.is_success(), "{status}");
    took
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Fresh,
    Replay,
}

/// One block: `c` tasks, each `n` requests in sequence; the latencies and the wall time.
async fn block(
    client: &HttpClient,
    url: &str,
    mode: Mode,
    keys: &[String],
    c: usize,
    n: usize,
) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|t| {
            let client = client.clone();
            let url = url.to_owned();
            let replay_key = keys[t].clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(n);
                for _ in 0..n {
                    let key = match mode {
                        Mode::Replay => replay_key.clone(),
                        Mode::Fresh => {
                            format!("\"f-{}\"", NEXT_KEY.fetch_add(1, Ordering::Relaxed))
                        }
                    };
                    lat.push(send(&client, &url, &key).await);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::with_capacity(c * n);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, start.elapsed())
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One paired measurement; prints its row.
async fn measure(
    client: &HttpClient,
    store: &str,
    direct: &str,
    through: &str,
    mode: Mode,
    delay: Duration,
    c: usize,
) {
    let n = per_task(c);
    let keys: Vec<String> = (0..c)
        .map(|_| format!("\"r-{}\"", NEXT_KEY.fetch_add(1, Ordering::Relaxed)))
        .collect();
    // warm both sides (connections, and the replayed keys stored)
    for k in &keys {
        send(client, through, k).await;
        send(client, direct, k).await;
    }
    let (mut d_lat, mut p_lat) = (Vec::new(), Vec::new());
    let (mut d_time, mut p_time) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for via_proxy in order {
            let url = if via_proxy { through } else { direct };
            let (lat, took) = block(client, url, mode, &keys, c, n).await;
            if via_proxy {
                p_lat.extend(lat);
                p_time += took;
            } else {
                d_lat.extend(lat);
                d_time += took;
            }
        }
    }
    d_lat.sort();
    p_lat.sort();
    let (d50, p50) = (pct(&d_lat, 0.5), pct(&p_lat, 0.5));
    let (d99, p99) = (pct(&d_lat, 0.99), pct(&p_lat, 0.99));
    let ratio =
        (p_lat.len() as f64 / p_time.as_secs_f64()) / (d_lat.len() as f64 / d_time.as_secs_f64());
    println!(
        "| {store} | {} | {} | {c} | {:.0} | {:.0} | {:+.0} | {:.0} | {:.0} | {:+.0} | {:.2} |",
        if mode == Mode::Fresh {
            "fresh"
        } else {
            "replay"
        },
        if delay.is_zero() {
            "0".to_owned()
        } else {
            format!("{delay:?}")
        },
        us(d50),
        us(p50),
        us(p50) - us(d50),
        us(d99),
        us(p99),
        us(p99) - us(d99),
        ratio
    );
}

async fn run() {
    let mut stores = vec![("memory", "memory".to_owned())];
    if let Ok(pg) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        stores.push(("postgres", pg));
    }
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    println!("| store | mode | upstream delay | c | direct p50 µs | proxy p50 µs | added p50 | direct p99 µs | proxy p99 µs | added p99 | throughput ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, url) in &stores {
        for delay in [Duration::ZERO, Duration::from_millis(1)] {
            let up = upstream(delay).await;
            let px = proxy(up, url);
            let direct = format!("http://{up}/charges");
            let through = format!("{}/charges", px.1);
            for mode in [Mode::Fresh, Mode::Replay] {
                for c in [1, 16, 64] {
                    measure(&client, name, &direct, &through, mode, delay, c).await;
                }
            }
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; a filter is not supported (one report)
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}
