//! A unary gRPC payments service written without protoc: prost messages derived by hand and
//! the service routed by hand, as tonic's generated code does it. Shared by the
//! `grpc_payments` example and the `grpc_tonic` test.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

/// The method's path: `/<package>.<service>/<method>`.
pub const CHARGE: &str = "/payments.Payments/Charge";

/// `message ChargeRequest { string order = 1; uint64 amount = 2; bool hold = 3; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeRequest {
    #[prost(string, tag = "1")]
    pub order: String,
    #[prost(uint64, tag = "2")]
    pub amount: u64,
    /// The handler waits at the ledger's gate before charging (tests hold it there).
    #[prost(bool, tag = "3")]
    pub hold: bool,
}

/// `message ChargeReply { uint64 id = 1; uint64 amount = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChargeReply {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub amount: u64,
}

/// The side effects: how many charges were made, and the gate held calls wait at.
#[derive(Clone)]
pub struct Ledger {
    pub charges: Arc<AtomicU64>,
    pub gate: Arc<Semaphore>,
    /// Calls that reached the handler (whether they charged or not).
    pub calls: Arc<AtomicU64>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            charges: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            calls: Arc::default(),
        }
    }
}

impl Ledger {
    async fn charge(&self, req: ChargeRequest) -> Result<ChargeReply, Status> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if req.hold {
            self.gate.acquire().await.unwrap().forget();
        }
        match req.amount {
            0 => Err(Status::invalid_argument("amount must be positive")),
            // the gateway is down for the first call of an order of 13: a status that says
            // "try again", so the key is released
            13 if call == 1 => Err(Status::unavailable("gateway timeout")),
            amount => {
                let id = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(ChargeReply { id, amount })
            }
        }
    }
}

/// The `payments.Payments` service.
#[derive(Clone, Default)]
pub struct PaymentsServer {
    pub ledger: Ledger,
}

impl NamedService for PaymentsServer {
    const NAME: &'static str = "payments.Payments";
}

struct Charge(Ledger);

impl UnaryService<ChargeRequest> for Charge {
    type Response = ChargeReply;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ChargeReply>, Status>> + Send>>;

    fn call(&mut self, req: Request<ChargeRequest>) -> Self::Future {
        let ledger = self.0.clone();
        Box::pin(async move { ledger.charge(req.into_inner()).await.map(Response::new) })
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> tower::Service<http::Request<B>> for PaymentsServer
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let ledger = self.ledger.clone();
        match req.uri().path() {
            CHARGE => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Charge(ledger), req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// A client of `payments.Payments` on `channel`, without generated code.
#[derive(Clone)]
pub struct PaymentsClient {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl PaymentsClient {
    pub fn new(channel: tonic::transport::Channel) -> Self {
        PaymentsClient {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Calls `Charge` with `idempotency-key` metadata (none: no key).
    pub async fn charge(
        &mut self,
        key: Option<&str>,
        req: ChargeRequest,
    ) -> Result<Response<ChargeReply>, Status> {
        let mut req = Request::new(req);
        if let Some(key) = key {
            let value = key.parse().map_err(|_| Status::invalid_argument("key"))?;
            req.metadata_mut().insert("idempotency-key", value);
        }
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unknown(e.to_string()))?;
        let path = http::uri::PathAndQuery::from_static(CHARGE);
        self.grpc.unary(req, path, ProstCodec::default()).await
    }
}
