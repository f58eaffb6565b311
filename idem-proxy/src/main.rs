//! `idem-proxy`: idem's HTTP idempotency layer as a reverse proxy in front of a service
//! written in any language. See README.md beside this package.

mod admin;
mod choices;
mod config;
mod log;
mod principal;
mod proxy;
mod store;

use clap::Parser;
use config::{Cli, Settings};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match std::env::var("IDEM_PROXY_LOG").as_deref() {
        Ok("error") => tracing::Level::ERROR,
        Ok("warn") => tracing::Level::WARN,
        Ok("debug") => tracing::Level::DEBUG,
        _ => tracing::Level::INFO,
    };
    // one line per request: the runtime's own events only from warnings up
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("idem_runtime", level.min(tracing::Level::WARN))
        .with_default(level);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .init();
    let settings = match Settings::load(&cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("idem-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config.is_some() {
        print!("{}", settings.describe());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), String> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    let idem = store::open(&settings.store)
        .await
        .map_err(|e| format!("cannot open the store: {e}"))?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let listen = listener.local_addr().map_err(|e| e.to_string())?;
    let healthy: admin::Healthy = Arc::default();
    let mut admin_addr = None;
    if let Some(addr) = settings.admin_listen {
        let admin = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (admin): {e}"))?;
        admin_addr = Some(admin.local_addr().map_err(|e| e.to_string())?);
        tokio::spawn(admin::serve(admin, metrics.clone(), healthy.clone()));
    }
    // histograms are summarised on upkeep
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let deadline = settings.shutdown_timeout;
    let upstream = settings.upstream.url.clone();
    let proxy = Arc::new(proxy::Proxy::new(settings, idem));
    healthy.store(true, Ordering::Release);
    // the first line on stdout says where it listens (a port 0 is resolved here)
    match admin_addr {
        Some(a) => {
            println!("idem-proxy listening on http://{listen} (admin http://{a}) for {upstream}")
        }
        None => println!("idem-proxy listening on http://{listen} for {upstream}"),
    }
    let stop = {
        let healthy = healthy.clone();
        async move {
            signal().await;
            healthy.store(false, Ordering::Release);
        }
    };
    proxy::serve(listener, proxy, stop, deadline).await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM or SIGINT.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
