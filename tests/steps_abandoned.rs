//! Steps are calls (contract, "Abandoned attempts"): a step whose attempt was abandoned (its
//! process died, its caller dropped the future) reconciles or parks by its own options, and a
//! workflow retried after a crash replays its finished steps and reconciles the one that was in
//! flight.
//!
//! The workflow: an order that reserves stock, charges a card and books a shipment, each a step
//! with its own choice. The crash is a dropped future (the whole workflow stops mid-step, as a
//! killed process would); the next call comes once the leases lapsed.

use idem::{idempotent, Idem, Resolution};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How long after a crash the retry comes: past every lease (250 ms).
const PAST_THE_LEASE: Duration = Duration::from_millis(400);

/// A downstream service that records each operation under the idempotency key it is sent
/// (`idem::current_key()` of the step), and counts what it really did.
#[derive(Default)]
struct Service {
    done: Mutex<HashMap<String, u64>>,
    effects: AtomicUsize,
}

impl Service {
    fn apply(&self, value: u64) -> u64 {
        let key = idem::current_key().expect("inside a step");
        self.effects.fetch_add(1, Ordering::SeqCst);
        *self.done.lock().unwrap().entry(key).or_insert(value)
    }

    /// The reconcile: the operation sent under this step's key, if it reached the service.
    async fn find(&self) -> Result<Option<u64>, idem::Error> {
        let key = idem::current_key().expect("inside a step");
        Ok(self.done.lock().unwrap().get(&key).copied())
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }
}

/// Where the workflow dies, if it does: after the effect of this step.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Crash {
    None,
    AfterCharge,
    AfterShip,
}

struct Shop {
    warehouse: Service,
    gateway: Service,
    carrier: Service,
    /// The workflow's `current_key()`, for the operator's resolve of its step.
    order_key: Mutex<Option<String>>,
    /// How many times the body of `reserve` ran (a replayed step does not run).
    reserve_runs: AtomicUsize,
}

impl Shop {
    fn new() -> Shop {
        Shop {
            warehouse: Service::default(),
            gateway: Service::default(),
            carrier: Service::default(),
            order_key: Mutex::new(None),
            reserve_runs: AtomicUsize::new(0),
        }
    }
}

async fn die_if(crash: Crash, here: Crash) {
    if crash == here {
        // The process dies after the effect, before idem stores the step's result.
        std::future::pending::<()>().await;
    }
}

#[idempotent(step, key = order, skip(shop), lease = "250ms", reconcile = shop.warehouse.find())]
async fn reserve(order: u64, shop: &Shop) -> Result<u64, idem::Error> {
    shop.reserve_runs.fetch_add(1, Ordering::SeqCst);
    Ok(shop.warehouse.apply(order * 10))
}

#[idempotent(step, key = order, skip(shop, crash), lease = "250ms",
             reconcile = shop.gateway.find())]
async fn charge(order: u64, shop: &Shop, crash: Crash) -> Result<u64, idem::Error> {
    let charged = shop.gateway.apply(order * 100);
    die_if(crash, Crash::AfterCharge).await;
    Ok(charged)
}

/// No way to ask the carrier what it booked: the step parks instead of booking twice.
#[idempotent(step, key = order, skip(shop, crash), lease = "250ms", on_abandoned = park)]
async fn ship(order: u64, shop: &Shop, crash: Crash) -> Result<u64, idem::Error> {
    let booked = shop.carrier.apply(order * 1000);
    die_if(crash, Crash::AfterShip).await;
    Ok(booked)
}

/// The workflow: three steps; its own takeover reruns it (the default), which is safe since
/// every effect is in a step.
#[idempotent(key = order, store = idem, skip(idem, shop, crash), lease = "250ms")]
async fn place_order(
    order: u64,
    idem: &Idem,
    shop: &Shop,
    crash: Crash,
) -> Result<(u64, u64, u64), idem::Error> {
    *shop.order_key.lock().unwrap() = idem::current_key();
    let reserved = reserve(order, shop).await?;
    let charged = charge(order, shop, crash).await?;
    let shipped = ship(order, shop, crash).await?;
    Ok((reserved, charged, shipped))
}

/// Runs the workflow until it dies at `crash` (its future dropped), then waits past the leases.
async fn crash_at(order: u64, idem: &Idem, shop: &Shop, crash: Crash) {
    let died = tokio::time::timeout(
        Duration::from_millis(100),
        place_order(order, idem, shop, crash),
    )
    .await;
    assert!(died.is_err(), "the workflow died mid-step");
    tokio::time::sleep(PAST_THE_LEASE).await;
}

/// The workflow died right after the charge reached the gateway. Its retry replays the reserved
/// stock, reconciles the charge (found at the gateway under the step's key: stored, not made
/// again) and runs the shipment.
#[tokio::test]
async fn a_retried_workflow_replays_finished_steps_and_reconciles_the_one_in_flight() {
    let idem = Idem::memory();
    let shop = Shop::new();
    crash_at(1, &idem, &shop, Crash::AfterCharge).await;
    assert_eq!(
        (shop.warehouse.effects(), shop.gateway.effects()),
        (1, 1),
        "the first attempt reserved and charged, then died"
    );

    let placed = place_order(1, &idem, &shop, Crash::None).await.unwrap();
    assert_eq!(placed, (10, 100, 1000));
    assert_eq!(
        shop.reserve_runs.load(Ordering::SeqCst),
        1,
        "reserve replayed"
    );
    assert_eq!(
        shop.gateway.effects(),
        1,
        "the charge was reconciled, not made again"
    );
    assert_eq!(shop.carrier.effects(), 1);

    // Done: every later call replays, and nothing runs.
    assert_eq!(
        place_order(1, &idem, &shop, Crash::None).await.unwrap(),
        placed
    );
    assert_eq!(
        shop.warehouse.effects() + shop.gateway.effects() + shop.carrier.effects(),
        3
    );
}

/// A reconcile that finds nothing (the workflow died in the charge step before the gateway saw
/// it: here, the gateway lost it) lets the step's body run.
#[tokio::test]
async fn a_step_whose_reconcile_finds_nothing_runs_again() {
    let idem = Idem::memory();
    let shop = Shop::new();
    crash_at(2, &idem, &shop, Crash::AfterCharge).await;
    shop.gateway.done.lock().unwrap().clear();

    let placed = place_order(2, &idem, &shop, Crash::None).await.unwrap();
    assert_eq!(placed, (20, 200, 2000));
    assert_eq!(shop.gateway.effects(), 2, "not found: charged again");
    assert_eq!(shop.reserve_runs.load(Ordering::SeqCst), 1);
}

/// The workflow died right after the carrier booked the shipment. The shipment step parks:
/// its retry gets `OutcomeUnknown` (the workflow fails with it, its own key released), nothing is
/// booked again; once an operator resolves the step's key, the workflow completes with the
/// resolved value and the steps before it replayed.
#[tokio::test]
async fn a_crashed_step_with_park_waits_for_an_operator() {
    let idem = Idem::memory();
    let shop = Shop::new();
    crash_at(3, &idem, &shop, Crash::AfterShip).await;

    for _ in 0..2 {
        let err = place_order(3, &idem, &shop, Crash::None).await.unwrap_err();
        assert!(err.is_outcome_unknown(), "{err}");
    }
    assert_eq!(shop.carrier.effects(), 1, "nothing booked twice");
    assert_eq!(shop.gateway.effects(), 1, "the charge replayed");

    // The operator: the step's namespace is `<workflow key>/<step name>`.
    let parent = shop.order_key.lock().unwrap().clone().unwrap();
    let booked = shop.carrier.done.lock().unwrap().values().next().copied();
    assert_eq!(booked, Some(3000));
    idem.resolve(
        &format!("{parent}/ship"),
        &3u64,
        Resolution::Applied(3000u64),
    )
    .await
    .unwrap();

    assert_eq!(
        place_order(3, &idem, &shop, Crash::None).await.unwrap(),
        (30, 300, 3000)
    );
    assert_eq!(
        (
            shop.warehouse.effects(),
            shop.gateway.effects(),
            shop.carrier.effects()
        ),
        (1, 1, 1)
    );
}

/// A step's options are its own: the same crash after the charge, with a charge step that
/// parks, parks the charge (and not the workflow, which reruns).
#[tokio::test]
async fn a_steps_options_are_its_own() {
    #[idempotent(step, key = order, skip(shop), lease = "250ms", on_abandoned = park)]
    async fn charge_or_park(order: u64, shop: &Shop) -> Result<u64, idem::Error> {
        let charged = shop.gateway.apply(order);
        std::future::pending::<()>().await;
        Ok(charged)
    }

    #[idempotent(key = order, store = idem, skip(idem, shop), lease = "250ms")]
    async fn workflow(order: u64, idem: &Idem, shop: &Shop) -> Result<u64, idem::Error> {
        charge_or_park(order, shop).await
    }

    let idem = Idem::memory();
    let shop = Shop::new();
    let died = tokio::time::timeout(Duration::from_millis(100), workflow(4, &idem, &shop)).await;
    assert!(died.is_err());
    tokio::time::sleep(PAST_THE_LEASE).await;
    let err = workflow(4, &idem, &shop).await.unwrap_err();
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(shop.gateway.effects(), 1);
}
