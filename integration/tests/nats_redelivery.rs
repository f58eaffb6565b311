//! A JetStream consumer whose handler is slower than `ack_wait` under load: the broker
//! redelivers, and the idempotent handler still charges every message exactly once.
//! Needs `IDEM_TEST_NATS_URL` (ignored without it, failing in CI with `IDEM_REQUIRE_SERVICES=1`).

#[path = "../examples/redelivery/scenario.rs"]
mod scenario;

use scenario::{Mode, Setup};

async fn redelivered_messages_are_charged_once(url: String) {
    let setup = Setup::default();

    // The control: without idem the same load double-charges, so the scenario does redeliver
    // messages that are still being handled.
    let bare = scenario::run(&url, Mode::Unprotected, setup).await.unwrap();
    assert!(bare.deliveries > bare.messages, "{bare:?}");
    assert!(
        bare.double_charged() > 0 && bare.total_charges() > bare.messages,
        "the unprotected handler should have charged someone twice: {bare:?}"
    );

    let r = scenario::run(&url, Mode::Idempotent(idem::Idem::memory()), setup)
        .await
        .unwrap();
    assert!(
        r.deliveries > r.messages,
        "the broker redelivered: {} deliveries of {} messages",
        r.deliveries,
        r.messages
    );
    assert!(r.max_delivered >= 2, "{r:?}");
    assert!(
        r.in_progress > 0,
        "some redeliveries came while the first was running: {r:?}"
    );
    assert_eq!(r.charges.len(), r.messages, "every message charged: {r:?}");
    for (msg, n) in &r.charges {
        assert_eq!(*n, 1, "{msg} charged {n} times: {r:?}");
    }
}

idem_integration::server_tests! {
    NATS => [
        redelivered_messages_are_charged_once,
    ],
}
