//! The scenarios, by topic. Each takes a handle on the store under test.

use crate::error::Error;
use crate::store::{Claim, ClaimOutcome, Complete, Status};
use crate::testkit::support::*;
use crate::{Call, Idem, KeepErrors, Outcome};
use std::sync::Arc;
use std::time::Duration;

mod abandoned;
mod calls;
mod failures;
mod operators;
mod resume;
mod sizes;
mod steps;
mod takeovers;
mod tombstones;

pub use abandoned::*;
pub use calls::*;
pub use failures::*;
pub use operators::*;
pub use resume::*;
pub use sizes::*;
pub use steps::*;
pub use takeovers::*;
pub use tombstones::*;

async fn charge(
    idem: &Idem,
    name: &str,
    key: &str,
    counter: &Counter,
) -> Result<Outcome<Receipt>, Failure> {
    let counter = counter.clone();
    idem.call(name.to_string())
        .key(key)
        .run(async move {
            let id = counter.hit() as u64;
            Ok(Receipt {
                id,
                memo: format!("charged {id}"),
            })
        })
        .await
}
