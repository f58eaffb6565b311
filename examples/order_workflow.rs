//! An order workflow of three steps — reserve stock, charge, ship — that dies in the middle
//! and is retried: the retry replays the finished step, reconciles the one that was in flight
//! (the charge, looked up at the gateway by the step's own key) and runs the rest. The shipment
//! step cannot be looked up at the carrier, so it parks instead of booking twice.
//!
//! `cargo run --example order_workflow` (docs/steps.md explains it)

use idem::{idempotent, Idem};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// A downstream service that keeps each operation under the idempotency key it was sent.
#[derive(Default)]
pub struct Service {
    done: Mutex<HashMap<String, u64>>,
    pub calls: Mutex<u32>,
}

impl Service {
    /// Performs an operation under the current step's key.
    pub async fn perform(&self, value: u64) -> u64 {
        let key = idem::current_key().expect("inside a step");
        *self.calls.lock().unwrap() += 1;
        *self.done.lock().unwrap().entry(key).or_insert(value)
    }

    /// What was performed under the current step's key, if anything (a reconcile).
    pub async fn lookup(&self) -> Result<Option<u64>, idem::Error> {
        let key = idem::current_key().expect("inside a step");
        Ok(self.done.lock().unwrap().get(&key).copied())
    }
}

/// The services an order talks to.
#[derive(Default)]
pub struct Services {
    pub warehouse: Service,
    pub gateway: Service,
    pub carrier: Service,
}

#[idempotent(step, key = order, skip(s), lease = "200ms", reconcile = s.warehouse.lookup())]
async fn reserve_stock(order: u64, s: &Services) -> Result<u64, idem::Error> {
    Ok(s.warehouse.perform(order).await)
}

#[idempotent(step, key = order, skip(s, dies), lease = "200ms",
             reconcile = s.gateway.lookup())]
async fn charge(order: u64, cents: u64, s: &Services, dies: bool) -> Result<u64, idem::Error> {
    let charged = s.gateway.perform(cents).await;
    if dies {
        // The process dies after the charge, before the step's result is stored.
        std::future::pending::<()>().await;
    }
    Ok(charged)
}

/// The carrier has no look-up: an abandoned booking parks for an operator.
#[idempotent(step, key = order, skip(s), lease = "200ms", on_abandoned = park)]
async fn ship(order: u64, s: &Services) -> Result<u64, idem::Error> {
    Ok(s.carrier.perform(order + 1000).await)
}

/// The workflow: its own retry reruns it, which replays or reconciles its steps. (Leases are
/// short here so that the demo's retry comes soon after the crash; a step has its own lease.)
#[idempotent(key = order, store = idem, skip(idem, s, dies), lease = "200ms")]
pub async fn place_order(
    order: u64,
    cents: u64,
    idem: &Idem,
    s: &Services,
    dies: bool,
) -> Result<(u64, u64, u64), idem::Error> {
    let reserved = reserve_stock(order, s).await?;
    let charged = charge(order, cents, s, dies).await?;
    let shipment = ship(order, s).await?;
    Ok((reserved, charged, shipment))
}

/// The story, returned for the test that runs it: what the retry placed, and how many calls
/// the warehouse, the gateway and the carrier got.
pub async fn demo() -> ((u64, u64, u64), [u32; 3]) {
    let idem = Idem::memory();
    let s = Services::default();
    let died = tokio::time::timeout(
        Duration::from_millis(50),
        place_order(7, 2500, &idem, &s, true),
    )
    .await;
    assert!(died.is_err(), "the workflow died after the charge");
    // The retry comes once the leases lapsed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let placed = place_order(7, 2500, &idem, &s, false).await.unwrap();
    let calls = [&s.warehouse, &s.gateway, &s.carrier].map(|svc| *svc.calls.lock().unwrap());
    (placed, calls)
}

#[tokio::main]
async fn main() {
    let (placed, [warehouse, gateway, carrier]) = demo().await;
    println!(
        "the workflow died after the charge and was retried: placed {placed:?}; \
         warehouse calls {warehouse}, gateway calls {gateway}, carrier calls {carrier}"
    );
}
