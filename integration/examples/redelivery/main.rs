//! A JetStream consumer that survives redelivery.
//!
//! ```text
//! nats-server -js &                                   # JetStream on 127.0.0.1:4222
//! cargo run -p idem-integration --example redelivery  # or NATS_URL=nats://host:4222
//! ```
//!
//! The consumer's `ack_wait` is 1 s; the handler calls a payment gateway that takes 300 ms and
//! serves three calls at once. Alone it is fast enough; under a burst the queue makes it slower
//! than `ack_wait`, the broker redelivers messages still being handled, and the unprotected
//! handler charges those customers twice. The idempotent handler keys the charge on the
//! message id (`Nats-Msg-Id`): a redelivery of a message being handled is `InProgress` and is
//! not acked (it comes back), one already handled replays the stored charge and is acked.
//!
//! (JetStream's own `Nats-Msg-Id` de-duplication is on the *publish* side: it does not stop a
//! consumer from receiving one message several times.)

mod scenario;

use scenario::{Mode, Report, Setup};

fn show(what: &str, r: &Report) {
    println!("{what}");
    println!(
        "  {} messages, {} deliveries (max delivered count {}), {} charges, {} customers charged twice or more",
        r.messages,
        r.deliveries,
        r.max_delivered,
        r.total_charges(),
        r.double_charged()
    );
    println!(
        "  {} redeliveries answered in-progress (not acked), {} replayed, in {:.1?}",
        r.in_progress, r.replayed, r.elapsed
    );
}

#[tokio::main]
async fn main() -> Result<(), scenario::BoxError> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let setup = Setup::default();

    let unprotected = scenario::run(&url, Mode::Unprotected, setup).await?;
    show("unprotected handler:", &unprotected);

    let idem = idem::Idem::memory();
    let protected = scenario::run(&url, Mode::Idempotent(idem), setup).await?;
    show("idempotent handler (key = Nats-Msg-Id):", &protected);

    assert!(
        protected.deliveries > protected.messages,
        "the broker redelivered"
    );
    assert!(
        protected.charges.values().all(|&n| n == 1),
        "every customer charged once"
    );
    println!("\nwith idem: every message charged exactly once despite the redeliveries");
    Ok(())
}
