//! Work that finishes itself: an order workflow (reserve stock, charge, ship, each a step) whose
//! process is killed in each step in turn, finished by a resumer in another process.
//!
//! ```text
//! cargo run --example order_workflow_resume
//! ```
//!
//! The example runs itself as its child processes: a `caller` that starts the workflow and is
//! killed (SIGKILL) inside the step it is told to, then a `worker` that runs only
//! `Idem::resumer()`. The worker's resumed call replays the finished steps (they print nothing)
//! and runs the rest: every step's effect happens once.

use idem::{idempotent, Idem};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
enum ShopError {
    Idem(#[allow(dead_code)] idem::Error),
}

impl From<idem::Error> for ShopError {
    fn from(e: idem::Error) -> Self {
        ShopError::Idem(e)
    }
}

fn say(line: String) {
    let role = std::env::var("ORDER_ROLE").unwrap_or_default();
    println!("  [{role:>6} {}] {line}", std::process::id());
    std::io::stdout().flush().unwrap();
}

/// In the caller, the step it is told to die in hangs there (and the parent kills it).
async fn maybe_die(step: &str, die_in: &str) {
    if std::env::var("ORDER_ROLE").as_deref() == Ok("caller") && step == die_in {
        say(format!("{step}: in progress… (killed here)"));
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

/// A step of the workflow with a short lease of its own: a step killed mid-way is taken over by
/// the resumed call once this lease lapsed (a step's lease is the handle's default otherwise).
async fn step<T, F>(name: &'static str, body: F) -> Result<T, ShopError>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
    F: std::future::Future<Output = Result<T, ShopError>>,
{
    let call = idem::Call::installed(name)
        .step()
        .lease(Duration::from_secs(1));
    Ok(call.key(&()).run(body).await?.into_inner())
}

#[idempotent(resume, lease = "1s", wait = "5s", name = "orders.fulfil")]
async fn fulfil(order: u64, die_in: String) -> Result<String, ShopError> {
    let reserved = step("reserve", async {
        say(format!("reserve: stock for order {order}"));
        maybe_die("reserve", &die_in).await;
        say(format!("reserve: done (reservation R-{order})"));
        Ok::<_, ShopError>(format!("R-{order}"))
    })
    .await?;
    let charged = step("charge", async {
        say(format!("charge: card for order {order} ({reserved})"));
        maybe_die("charge", &die_in).await;
        say(format!("charge: done (payment P-{order})"));
        Ok::<_, ShopError>(format!("P-{order}"))
    })
    .await?;
    let shipped = step("ship", async {
        say(format!("ship: order {order} ({charged})"));
        maybe_die("ship", &die_in).await;
        say(format!("ship: done (parcel S-{order})"));
        Ok::<_, ShopError>(format!("S-{order}"))
    })
    .await?;
    Ok(shipped)
}

fn child(role: &str, db: &str, order: u64, die_in: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .env("ORDER_ROLE", role)
        .env("ORDER_DB", db)
        .env("ORDER_ID", order.to_string())
        .env("ORDER_DIE_IN", die_in)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Echoes a child's lines until one contains `until`.
fn follow(child: &mut std::process::Child, until: &str) -> bool {
    let out = BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        let line = line.unwrap();
        println!("{line}");
        if line.contains(until) {
            return true;
        }
    }
    false
}

#[tokio::main]
async fn main() -> Result<(), ShopError> {
    if let Ok(role) = std::env::var("ORDER_ROLE") {
        let db = std::env::var("ORDER_DB").unwrap();
        let idem = Idem::sqlite(&db).await?;
        idem.clone().install();
        if role == "caller" {
            let order: u64 = std::env::var("ORDER_ID").unwrap().parse().unwrap();
            fulfil(order, std::env::var("ORDER_DIE_IN").unwrap()).await?;
        } else {
            let _resumer = idem.resumer().poll(Duration::from_millis(200)).spawn()?;
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        return Ok(());
    }

    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("orders.db").display());
    for (order, die_in) in [(1, "reserve"), (2, "charge"), (3, "ship")] {
        println!("order {order}: the caller is killed in `{die_in}`");
        let mut caller = child("caller", &db, order, die_in);
        assert!(follow(&mut caller, "killed here"));
        caller.kill().unwrap();
        caller.wait().unwrap();
        let killed = Instant::now();
        println!("  caller killed; a worker process resumes the call");
        let mut worker = child("worker", &db, order, die_in);
        assert!(follow(&mut worker, &format!("parcel S-{order}")));
        println!(
            "  finished {} ms after the kill",
            killed.elapsed().as_millis()
        );
        // The caller's retry gets the stored result: nothing runs again.
        let idem = Idem::sqlite(&db).await?;
        idem.clone().install();
        let shipped = fulfil(order, die_in.to_string()).await?;
        println!("  a retry by the caller replays: {shipped}\n");
        worker.kill().unwrap();
        worker.wait().unwrap();
    }
    Ok(())
}
