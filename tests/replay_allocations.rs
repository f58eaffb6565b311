//! A replay retains nothing and allocates a small, fixed number of blocks: the builder's box and
//! key buffer, the call's boxed work, the store step's future, the record it reads and the
//! decoded result's own data — none of it kept after the call, and none of it growing with the
//! number of calls. Counted by a global allocator of this test binary, on the thread that runs
//! the calls. (A replay free of allocations was a microbenchmark's goal, since withdrawn: it
//! took per-thread machinery on every call for no path users run.)

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting this thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to `System` unchanged; the count is a thread-local `Cell` with
// a const initialiser and no destructor, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() + layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() - layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() + new_size as i64 - layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn live_bytes() -> i64 {
    LIVE_BYTES.with(Cell::get)
}

/// The most blocks one replay may allocate (7 today, listed above).
const MAX_PER_REPLAY: u64 = 8;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    amount: u64,
    note: String,
}

#[idempotent(key = order, store = idem, skip(idem))]
async fn charge(order: u64, amount: u64, idem: &Idem) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        id: order,
        amount,
        note: "charged".into(),
    })
}

#[test]
fn a_replay_retains_nothing_and_allocates_a_fixed_few_blocks() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let idem = Idem::memory();
        charge(7, 100, &idem).await.unwrap();
        // The first replay remembers the key's digests.
        charge(7, 100, &idem).await.unwrap();
        let mut per_batch = Vec::new();
        for replays in [100u64, 200] {
            let (before, kept) = (allocations(), live_bytes());
            for _ in 0..replays {
                let receipt = charge(7, 100, &idem).await.unwrap();
                assert_eq!(receipt.note, "charged");
            }
            assert_eq!(live_bytes(), kept, "bytes kept after {replays} replays");
            let per_replay = (allocations() - before) as f64 / replays as f64;
            assert!(
                per_replay <= MAX_PER_REPLAY as f64,
                "{per_replay} allocations per replay"
            );
            per_batch.push(per_replay);
        }
        assert_eq!(per_batch[0], per_batch[1], "the same count per replay");
    });
}
