//! A unary gRPC payments service under the `Idempotency-Key` layer, on a tonic server, and a
//! client that retries a charge: the retry gets the first charge back, marked replayed.
//!
//!   cargo run -p idem-integration --example grpc_payments --features grpc

#[path = "grpc/payments.rs"]
mod payments;

use idem::http::IdempotencyLayer;
use payments::{ChargeRequest, PaymentsClient, PaymentsServer};
use tonic::transport::server::TcpIncoming;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = idem::Idem::memory(); // or Idem::postgres(url), shared by every instance
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            // every method of this server is unary; the example has no authentication, so the
            // keys share one anonymous scope
            .layer(IdempotencyLayer::grpc(idem).allow_anonymous(true))
            .add_service(PaymentsServer::default())
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = PaymentsClient::new(channel);
    let req = ChargeRequest {
        order: "order-1001".into(),
        amount: 1200,
        hold: false,
    };
    for attempt in 1..=2 {
        let res = client.charge(Some("\"order-1001\""), req.clone()).await?;
        let replayed = res.metadata().get("idempotent-replayed").is_some();
        let reply = res.into_inner();
        println!(
            "attempt {attempt}: charge {} of {} (replayed: {replayed})",
            reply.id, reply.amount
        );
    }
    Ok(())
}
