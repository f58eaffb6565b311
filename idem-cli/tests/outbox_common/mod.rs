//! What the `idem outbox` tests of every database share: a publisher that refuses some
//! messages (to make dead letters; the integration package's, which its own outbox tests use
//! too), and a committed enqueue.

use idem::outbox::{Message, Outbox, OutboxDatabase};
use idem::postgres::sqlx::Pool;

pub use idem_integration::outbox::RefusesSome;

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
