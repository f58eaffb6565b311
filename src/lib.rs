//! `idem` makes async functions idempotent.
//!
//! ```
//! use idem::{idempotent, Idem};
//!
//! #[idempotent(key = order_id, store = idem)]
//! async fn charge(order_id: u64, amount: u64, idem: &Idem) -> Result<u64, idem::Error> {
//!     Ok(amount) // the side effect, at most once per order id
//! }
//! ```
//!
//! See the README for the guide: keys, TTLs, leases, stores and guarantees.
#![warn(missing_docs)]

pub use idem_macros::idempotent;
#[doc(hidden)]
pub use idem_runtime::__private;
pub use idem_runtime::*;

// The README's examples run as doc tests of the idem-integration package (integration/), which
// has the HTTP and NATS clients they use.
