//! A small payment API made idempotent with `idem::http::axum::IdempotencyLayer`.
//!
//! ```text
//! cargo run -p idem-integration --example http_payments --features axum             # a demo against itself
//! cargo run -p idem-integration --example http_payments --features axum -- --serve  # serves on 127.0.0.1:3000
//! ```
//!
//! `POST /charges` with a JSON body `{"amount": 1200, "currency": "eur"}`, an
//! `Authorization: Bearer <user>` header (a stand-in for real authentication) and an
//! `Idempotency-Key`. A retry of the same request with the same key gets the same charge back
//! (`Idempotent-Replayed: true`) instead of charging the customer twice.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::axum::{IdempotencyLayer, Principal};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

#[derive(Deserialize)]
struct NewCharge {
    amount: u64,
    currency: String,
}

#[derive(Serialize, Clone)]
struct Charge {
    id: String,
    owner: String,
    amount: u64,
    currency: String,
}

#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<Charge>>>);

async fn create_charge(
    State(ledger): State<Ledger>,
    axum::Extension(Principal(owner)): axum::Extension<Principal>,
    Json(new): Json<NewCharge>,
) -> Response {
    if new.amount == 0 {
        // A 4xx is a final answer: it is stored and replayed like a success.
        return (StatusCode::BAD_REQUEST, "amount must be above zero").into_response();
    }
    let mut charges = ledger.0.lock().unwrap();
    let charge = Charge {
        id: format!("ch_{}", charges.len() + 1),
        owner,
        amount: new.amount,
        currency: new.currency,
    };
    charges.push(charge.clone());
    let location = format!("/charges/{}", charge.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(charge),
    )
        .into_response()
}

async fn list_charges(
    State(ledger): State<Ledger>,
    axum::Extension(Principal(owner)): axum::Extension<Principal>,
) -> Json<Vec<Charge>> {
    let charges = ledger.0.lock().unwrap();
    Json(
        charges
            .iter()
            .filter(|c| c.owner == owner)
            .cloned()
            .collect(),
    )
}

/// A stand-in for real authentication: `Authorization: Bearer <user>` makes `<user>` the
/// principal. It runs *outside* the idempotency layer, so the layer sees the principal.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|u| !u.is_empty())
        .map(str::to_owned);
    match user {
        Some(user) => {
            req.extensions_mut().insert(Principal::new(user));
            next.run(req).await
        }
        None => (StatusCode::UNAUTHORIZED, "missing bearer token").into_response(),
    }
}

fn app(idem: idem::Idem, ledger: Ledger) -> Router {
    Router::new()
        .route("/charges", post(create_charge).get(list_charges))
        // POST and PATCH under this layer need an Idempotency-Key; GET passes through
        .layer(IdempotencyLayer::new(idem))
        // outside it: authentication, so every request reaching the layer has a Principal
        .layer(middleware::from_fn(authenticate))
        // added after both layers: neither applies to it
        .route("/health", get(|| async { "ok" }))
        .with_state(ledger)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_only = std::env::args().any(|a| a == "--serve");
    let idem = idem::Idem::memory();
    let ledger = Ledger::default();
    let addr = if serve_only {
        "127.0.0.1:3000"
    } else {
        "127.0.0.1:0"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let app = app(idem, ledger.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    if serve_only {
        println!("listening on http://{addr}");
        server.await??;
        return Ok(());
    }

    let http = reqwest::Client::new();
    let url = format!("http://{addr}/charges");
    let charge = |user: &'static str, key: &'static str, amount: u64| {
        http.post(&url)
            .bearer_auth(user)
            .header("Idempotency-Key", format!("\"{key}\""))
            .json(&serde_json::json!({ "amount": amount, "currency": "eur" }))
            .send()
    };
    let show = |what: &str, res: &reqwest::Response| {
        println!(
            "{what:<46} -> {} replayed={}",
            res.status(),
            res.headers()
                .get("idempotent-replayed")
                .map_or("-", |v| v.to_str().unwrap_or("?"))
        );
    };

    let first = charge("alice", "order-1001", 1200).await?;
    show("alice: POST /charges (order-1001)", &first);
    println!("    {}", first.text().await?);
    let retry = charge("alice", "order-1001", 1200).await?;
    show("alice: the same request again (a retry)", &retry);
    println!("    {}", retry.text().await?);
    let other = charge("alice", "order-1001", 9900).await?;
    show("alice: the same key, another amount", &other);
    println!("    {}", other.text().await?);
    let bob = charge("bob", "order-1001", 1200).await?;
    show("bob: the same key (his own order-1001)", &bob);
    let missing = http
        .post(&url)
        .bearer_auth("alice")
        .json(&serde_json::json!({ "amount": 5, "currency": "eur" }))
        .send()
        .await?;
    show("alice: no Idempotency-Key", &missing);
    println!("    {}", missing.text().await?);

    let charges = ledger.0.lock().unwrap().len();
    println!("\ncharges in the ledger: {charges} (one for alice, one for bob)");
    assert_eq!(charges, 2);
    server.abort();
    Ok(())
}
