//! The crash-window examples run: `examples/payment_reconcile.rs` (docs/crash-window.md) and
//! `examples/order_workflow.rs` (docs/steps.md) tell the story they print.

#[allow(dead_code)]
#[path = "../examples/payment_reconcile.rs"]
mod payment_reconcile;

#[allow(dead_code)]
#[path = "../examples/order_workflow.rs"]
mod order_workflow;

/// The payment died after the charge; the next calls get that charge, and there is one.
#[tokio::test]
async fn the_payment_reconcile_charges_once() {
    let (got, made) = payment_reconcile::demo().await;
    let first = payment_reconcile::Charge { id: 1, cents: 1999 };
    assert_eq!(got, vec![first, first]);
    assert_eq!(made, 1);
}

/// The order died after the charge; the retry places it with one call to each service.
#[tokio::test]
async fn the_order_workflow_reconciles_its_charge() {
    let (placed, calls) = order_workflow::demo().await;
    assert_eq!(placed, (7, 2500, 1007));
    assert_eq!(calls, [1, 1, 1]);
}

/// A frozen holder that wakes after a takeover is refused by the gateway: the token it passes
/// down is below the one the takeover's look-up raised the fence to.
#[tokio::test]
async fn a_fenced_gateway_refuses_a_frozen_holder() {
    let gateway = payment_reconcile::Gateway::default();
    // The takeover (token 2) looked the key up: nothing there yet.
    assert_eq!(gateway.find("k", 2).await.unwrap(), None);
    // The frozen first attempt (token 1) wakes and tries to charge.
    assert!(gateway.charge("k", 1, 500).await.is_err());
    // The takeover charges.
    assert_eq!(gateway.charge("k", 2, 500).await.unwrap().id, 1);
    assert_eq!(*gateway.made.lock().unwrap(), 1);
}
