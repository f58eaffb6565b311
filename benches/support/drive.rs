//! The load driver every concurrent bench shares: `iters` calls spread over `conc` tasks.

use std::time::{Duration, Instant};

/// Runs `iters` calls of `op` spread over `conc` tasks on the current tokio runtime and returns
/// the wall time. `op` gets a distinct number per call (`0..`), which benches turn into keys.
pub async fn drive<F, Fut>(conc: u64, iters: u64, op: F) -> Duration
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let per = iters.div_ceil(conc);
    let start = Instant::now();
    let tasks: Vec<_> = (0..conc)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                for j in 0..per {
                    op(t * per + j).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Scale to the requested count so criterion's per-iteration time stays exact.
    start.elapsed().mul_f64(iters as f64 / (per * conc) as f64)
}

/// The runtime concurrent benches drive their load on: two workers, one per hardware thread of
/// the development machine, so that client and server share the CPU the same way in every run.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One call of the store benches: namespace `bench`, key `n`, a ten-minute TTL, a body that
/// returns 1; checks that it was replayed, or ran, as the bench expects.
#[allow(dead_code)] // the in-memory benches call their functions directly
pub async fn keyed_call(idem: &idem::Idem, n: u64, replayed: bool) {
    let out = idem
        .call("bench")
        .key(&n)
        .ttl(Duration::from_secs(600))
        .run(async { Ok::<_, idem::Error>(1u64) })
        .await
        .unwrap();
    assert_eq!(out.is_replayed(), replayed);
}
