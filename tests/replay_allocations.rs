//! A replay on the memory store allocates nothing of its own (issue 24, item 6): the call is set
//! up and claimed at its first poll, its future is not boxed, the stored value is shared rather
//! than copied, and the builder's box (with its key buffer) is reused from the call before on the
//! thread. Only the decoded result's own data is allocated. Counted by a global allocator of
//! this test binary, on the thread that runs the calls (3 allocations per replay before; 3 with
//! the builder's box not reused: the box and the key buffer).

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting this thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to `System` unchanged; the count is a thread-local `Cell` with
// a const initialiser and no destructor, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

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
fn a_replay_on_the_memory_store_allocates_only_its_result() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let idem = Idem::memory();
        charge(7, 100, &idem).await.unwrap();
        // The first replay remembers the key's digests; the second leaves its key buffer for
        // the next call on this thread.
        for _ in 0..2 {
            charge(7, 100, &idem).await.unwrap();
        }
        let before = allocations();
        let replays = 100;
        for _ in 0..replays {
            let receipt = charge(7, 100, &idem).await.unwrap();
            assert_eq!(receipt.note, "charged");
        }
        // The `String` of each decoded result is the caller's; nothing else is allocated.
        assert_eq!(
            allocations() - before,
            replays,
            "allocations in {replays} replays"
        );
    });
}
