//! The HTTP webhook publisher (feature `outbox-webhook`): each message is `POST`ed with
//! `Idempotency-Key` set to the message id, so a receiver that deduplicates on that header (an
//! `idem::http` layer, Stripe-style APIs) applies a relay's re-post once. Any 2xx answer is a
//! delivery; anything else, or no answer, is a failed attempt.

use super::{Delivery, Publisher};
use crate::error::BoxError;
use crate::store::BoxFuture;
pub use reqwest;

/// `POST`s outbox messages to a URL.
#[derive(Debug, Clone)]
pub struct WebhookPublisher {
    client: reqwest::Client,
    url: String,
}

impl WebhookPublisher {
    /// Posts every message to `url` (the topic goes in the `Idem-Topic` header).
    pub fn new(url: impl Into<String>) -> WebhookPublisher {
        WebhookPublisher::with_client(reqwest::Client::new(), url)
    }

    /// The same with a client of your own (TLS, proxies, timeouts, default headers).
    pub fn with_client(client: reqwest::Client, url: impl Into<String>) -> WebhookPublisher {
        WebhookPublisher {
            client,
            url: url.into(),
        }
    }
}

impl Publisher for WebhookPublisher {
    fn publish<'a>(&'a self, message: &'a Delivery) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let mut request = self.client.post(&self.url);
            for (name, value) in &message.headers {
                request = request.header(name.as_str(), value.as_str());
            }
            let response = request
                .header("Idempotency-Key", message.id.as_str())
                .header("Idem-Topic", message.topic.as_str())
                .header("Idem-Ordering-Key", message.ordering_key.as_str())
                .body(message.payload.clone())
                .send()
                .await?;
            let status = response.status();
            if status.is_success() {
                Ok(())
            } else {
                Err(format!("the webhook answered {status}").into())
            }
        })
    }
}
