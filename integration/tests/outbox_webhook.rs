//! The outbox's webhook publisher against a real PostgreSQL and a real HTTP server: every
//! message is POSTed with `Idempotency-Key` = its id, and a failed POST is retried with the
//! same key.

mod pg_common;

use axum::http::{HeaderMap, StatusCode};
use axum::{extract::State, routing::post, Router};
use idem::outbox::webhook::WebhookPublisher;
use idem::outbox::{Message, Outbox, Relay, RelayOptions};
use pg_common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the receiver got: (Idempotency-Key, topic, body); it answers 503 to the first POST.
type Seen = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

async fn receive(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let header = |n: &str| {
        headers
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let mut seen = seen.lock().unwrap();
    seen.push((
        header("idempotency-key"),
        header("idem-topic"),
        body.to_vec(),
    ));
    if seen.len() == 1 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn messages_are_posted_with_their_id_as_idempotency_key(url: String) {
    let admin = admin(&url).await;
    let table = unique_table("obxw");
    let outbox = Outbox::with_table(admin.clone(), &table)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let seen: Seen = Default::default();
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut tx = admin.begin().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        let m = Message::new("invoice.sent", format!("body-{i}").into_bytes()).id(format!("w-{i}"));
        ids.push(outbox.enqueue(&mut tx, m).await.unwrap().id);
    }
    tx.commit().await.unwrap();

    let publisher = WebhookPublisher::new(format!("http://{addr}/hook"));
    let options =
        RelayOptions::default().backoff(Duration::from_millis(1), Duration::from_millis(1));
    loop {
        let pending: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{table}\" WHERE status <> 1"
        ))
        .fetch_one(&admin)
        .await
        .unwrap();
        if pending == 0 {
            break;
        }
        Relay::deliver_once(&outbox, &publisher, &options)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        4,
        "three messages, the first POST refused once: {seen:?}"
    );
    assert_eq!(seen[0].0, "w-0");
    assert_eq!(
        seen[1].0, "w-0",
        "the retry carries the same Idempotency-Key"
    );
    let mut keys: Vec<String> = seen.iter().map(|s| s.0.clone()).collect();
    keys.dedup();
    assert_eq!(keys, ids);
    assert!(seen.iter().all(|s| s.1 == "invoice.sent"));
    assert_eq!(seen[3].2, b"body-2");
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    POSTGRES => [
        messages_are_posted_with_their_id_as_idempotency_key,
    ],
}
