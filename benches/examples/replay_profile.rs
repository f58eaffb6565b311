//! N replays of one `#[idempotent]` call on the memory store, for an instruction profile of the
//! replay path (docs/benchmarks.md, "The replay path"):
//!
//! ```text
//! cargo build --release -p idem-benches --example replay_profile
//! valgrind --tool=callgrind --callgrind-out-file=cg.10k target/release/examples/replay_profile 10000
//! valgrind --tool=callgrind --callgrind-out-file=cg.20k target/release/examples/replay_profile 20000
//! callgrind_annotate --inclusive=yes cg.20k   # per replay: (20k figure - 10k figure) / 10 000
//! ```
//!
//! Two runs of different lengths, so that the difference is the replays alone (the runtime's
//! start and the first, fresh call cancel out). A second argument `cached` profiles the peer
//! the ratio is taken against instead: the memoiser `cached` on the same function
//! (`benches/peers.rs`), so that both sides are counted the same way; `unit` profiles the
//! replay of a unit result, which has next to nothing to decode.

use cached::proc_macro::cached;
use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::hint::black_box;

#[derive(Clone, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    amount: u64,
}

/// The call of `benches/peers.rs`.
#[idempotent(key = order, store = idem, skip(idem))]
async fn with_idem(order: u64, amount: u64, idem: &Idem) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        id: black_box(order),
        amount,
    })
}

/// [`with_idem`] with a unit result (`benches/peers.rs`): a replay with next to nothing to
/// decode.
#[idempotent(key = order, store = idem, skip(idem))]
async fn with_idem_unit(order: u64, idem: &Idem) -> Result<(), idem::Error> {
    black_box(order);
    Ok(())
}

/// The peer of `benches/peers.rs`: memoised, no claim.
#[cached]
async fn with_cached(order: u64) -> Receipt {
    Receipt {
        id: black_box(order),
        amount: 100,
    }
}

fn main() -> Result<(), idem::Error> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let variant = std::env::args().nth(2);
    let peer = variant.as_deref() == Some("cached");
    let unit = variant.as_deref() == Some("unit");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| idem::Error::config(format!("a tokio runtime: {e}")))?;
    let idem = Idem::memory();
    if peer {
        rt.block_on(async {
            let mut sum = with_cached(7).await.id;
            for _ in 0..n {
                sum += with_cached(7).await.id;
            }
            black_box(sum);
        });
        return Ok(());
    }
    if unit {
        return rt.block_on(async {
            with_idem_unit(7, &idem).await?;
            for _ in 0..n {
                with_idem_unit(7, &idem).await?;
            }
            Ok(())
        });
    }
    rt.block_on(async {
        with_idem(7, 100, &idem).await?;
        let mut sum = 0;
        for _ in 0..n {
            sum += with_idem(7, 100, &idem).await?.id;
        }
        black_box(sum);
        Ok(())
    })
}
