//! What the `idem outbox` tests of every database share: a publisher that refuses some
//! messages (to make dead letters), and a committed enqueue.

use idem::outbox::{Delivery, Message, Outbox, OutboxDatabase, Publisher};
use idem::postgres::sqlx::Pool;
use idem::BoxError;
use std::future::Future;
use std::pin::Pin;

/// Accepts every message but those of topic `refused`.
pub struct RefusesSome;

impl Publisher for RefusesSome {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            if message.topic == "refused" {
                return Err("HTTP 503 from the consumer".into());
            }
            Ok(())
        })
    }
}

/// Enqueues message `id` (a new one) of `topic` and ordering key `key` in a transaction of its
/// own, and commits.
pub async fn enqueue<Db: OutboxDatabase>(
    outbox: &Outbox<Db>,
    pool: &Pool<Db>,
    id: &str,
    topic: &str,
    key: &str,
) {
    let mut tx = pool.begin().await.unwrap();
    let e = outbox
        .enqueue(
            &mut tx,
            Message::new(topic, b"{}".to_vec()).ordering_key(key).id(id),
        )
        .await
        .unwrap();
    assert!(e.new);
    tx.commit().await.unwrap();
}
