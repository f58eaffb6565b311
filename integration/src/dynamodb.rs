//! What the DynamoDB tests share: options for DynamoDB Local, and a client that counts the
//! requests it sends.

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{Intercept, RuntimeComponents};
use aws_sdk_dynamodb::Client;
use idem::store::dynamodb::DynamoDbOptions;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The region the tests name (DynamoDB Local keeps one database per region and access key).
pub const REGION: &str = "us-east-1";

/// Options on the DynamoDB at `url` with throwaway credentials (DynamoDB Local takes any).
pub fn options(url: &str) -> DynamoDbOptions {
    DynamoDbOptions::new()
        .endpoint(url)
        .region(REGION)
        .credentials("idem", "idem")
}

/// Counts every HTTP request a client sends (each attempt, retries included).
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<AtomicUsize>);

impl Requests {
    /// Requests sent so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "idem-test-request-counter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A client on the DynamoDB at `url` whose requests `Requests` counts.
pub async fn counted_client(url: &str) -> (Client, Requests) {
    let base = options(url).client().await.expect("a DynamoDB client");
    let requests = Requests::default();
    let config = base
        .config()
        .to_builder()
        .interceptor(requests.clone())
        .build();
    (Client::from_conf(config), requests)
}

/// A plain client on the DynamoDB at `url`.
pub async fn client(url: &str) -> Client {
    options(url).client().await.expect("a DynamoDB client")
}
