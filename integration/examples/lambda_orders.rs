//! An AWS Lambda function whose charge runs once per order, whatever the retries: Lambda's own
//! (an asynchronous invocation is retried twice on error), a queue's redelivery, or a client
//! that invokes again after a timeout. The idempotency records are in DynamoDB.
//!
//! Build it for Lambda with `cargo lambda build --release --example lambda_orders --features
//! dynamodb` (or any `bootstrap` build for `provided.al2023`); the function's role needs
//! `dynamodb:PutItem`, `UpdateItem`, `GetItem` and `DescribeTable` on the table (see the
//! README's DynamoDB section), and its environment `IDEM_TABLE` (default `idem_records`).
//!
//! Invoked with `{"order_id": "o-42", "amount_cents": 4999}`, it answers with the receipt; a
//! second invocation with the same order answers with the same receipt without charging again,
//! and one with the same order and another amount fails (`Error::Mismatch`).

use idem::{idempotent, Idem};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct Order {
    order_id: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    order_id: String,
    charge_id: String,
    amount_cents: u64,
}

/// The side effect that must happen once per order: the key is the order id, the fingerprint
/// the amount (the same order id with another amount is refused, not charged).
#[idempotent(
    key = &order.order_id,
    fingerprint = order.amount_cents,
    name = "orders.charge.v1",
    ttl = "7d",
    lease = "30s"
)]
async fn charge(order: Order) -> Result<Receipt, idem::Error> {
    // Pass the call's stable id on as the payment provider's own idempotency key.
    let key = idem::current_key().expect("inside an idempotent call");
    Ok(Receipt {
        charge_id: format!("ch_{}", &key[..16]),
        order_id: order.order_id,
        amount_cents: order.amount_cents,
    })
}

async fn handler(event: LambdaEvent<Order>) -> Result<Receipt, Error> {
    Ok(charge(event.payload).await?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Opened once per execution environment (a cold start), reused by every invocation.
    let table = std::env::var("IDEM_TABLE").unwrap_or_else(|_| "idem_records".to_string());
    Idem::dynamodb(&table).await?.install();
    lambda_runtime::run(service_fn(handler)).await
}
