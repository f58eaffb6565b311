//! The `Idempotency-Key` layer on unary gRPC calls (feature `grpc`), for a tonic server or any
//! gRPC server built on tower and `http`.
//!
//! gRPC metadata are HTTP/2 header fields, and a unary call is one `POST` with one message each
//! way: [`IdempotencyLayer::grpc`] is the same layer as for HTTP APIs, speaking gRPC. The key is
//! the `idempotency-key` metadata (the same value syntax: `"8e03…"` or a bare value); the
//! first call with a key runs the method and its response (message, metadata and trailers,
//! `grpc-status` included) is stored; a repeat gets it back with the metadata
//! `idempotent-replayed: true` and the method does not run again. Handlers are detached from
//! the connection as with HTTP ([`IdempotencyLayer::detached`]): a client whose deadline
//! passes or who cancels does not cut the method half-way.
//!
//! ```no_run
//! # extern crate idem_runtime as idem;
//! # fn doc<S>(payments_server: S) {
//! use idem::http::IdempotencyLayer;
//! use tower_layer::Layer as _;
//! // wrap a unary service (tonic: `Server::builder().layer(..)` for a server whose methods
//! // are all unary, or `tonic::service::LayerExt::named_layer` for one service)
//! let layer = IdempotencyLayer::grpc(idem::Idem::memory()).allow_anonymous(true);
//! let service = layer.layer(payments_server);
//! # }
//! ```
//!
//! **Unary calls only**: the layer buffers the request and the response; a streaming method
//! under it would lose its streaming. Apply it to services whose methods are unary (or use
//! [`IdempotencyLayer::optional_key`] and send no key to streaming methods).
//!
//! # Status codes
//!
//! The refusals of the layer are trailers-only gRPC responses (HTTP 200, `grpc-status`,
//! `grpc-message`, and the metadata `idempotency-problem` with the problem type of the HTTP
//! layer, [`problem`](super::problem)). The codes follow the gRPC guidance on choosing between
//! `UNAVAILABLE` (retry this call), `ABORTED` (retry at a higher level, a concurrency conflict)
//! and `FAILED_PRECONDITION` (do not retry until the state is fixed), and the HTTP mapping of
//! `google.rpc.Code`:
//!
//! | HTTP layer | gRPC | why |
//! |---|---|---|
//! | 400 key missing / malformed | `INVALID_ARGUMENT` | the call itself is wrong, whatever the state; fix the call |
//! | 409 in progress | `ABORTED` | a concurrency conflict with the first call (`google.rpc.Code` maps 409 to it); retry the same call, with the same key, after the pushback: it then gets the first call's response |
//! | 413 body too large | `RESOURCE_EXHAUSTED` | what gRPC servers answer to a message above their limit |
//! | 422 key reused | `FAILED_PRECONDITION` | the same call with a fresh key is valid: the state (the key's first use), not the argument, refuses it, and retrying cannot help |
//! | 423 outcome unknown | `FAILED_PRECONDITION` | the key is parked: an abandoned call's outcome is unknown and only an operator's resolve changes that; do not retry until then |
//! | 500 principal missing / internal | `INTERNAL` | a server-side fault |
//! | 503 store unavailable / overloaded / shutting down / outcome undecided | `UNAVAILABLE` | the call did not run; retrying it as it is, with the same key, is safe (gRPC retry policies retry it) |
//!
//! Where the HTTP layer sends `Retry-After`, the gRPC one sends the same seconds (the one rule,
//! [`Error::retry_after`](crate::Error::retry_after) for an in-progress call) as `retry-after`
//! metadata and as `grpc-retry-pushback-ms`, which gRPC clients' retry policies obey.
//!
//! # What is stored
//!
//! By [`store_policy`]: `OK` and the codes that say the call was decided (`INVALID_ARGUMENT`,
//! `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`,
//! `UNIMPLEMENTED`, `UNAUTHENTICATED`) are stored and replayed; the codes that say "try again"
//! (`CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
//! `UNAVAILABLE`, `DATA_LOSS`) release the key, as a 5xx does over HTTP. Change it with
//! [`IdempotencyLayer::store_grpc_if`].

use super::config::{GrpcStoreIfFn, Protocol};
use super::stored::GRPC_STORED_HEADERS;
use super::IdempotencyLayer;
use crate::policy::OnError;
use crate::Idem;
use http::Method;
use std::sync::Arc;

pub use super::grpc_status::{
    store_policy, Code, GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, IDEMPOTENCY_PROBLEM,
};

impl IdempotencyLayer {
    /// A layer for unary gRPC calls on `idem`: every call (`POST`) with the key in its
    /// `idempotency-key` metadata, refusals as gRPC statuses, [`store_policy`] on
    /// `grpc-status`, namespace `"grpc"`; the other defaults of [`IdempotencyLayer::new`].
    pub fn grpc(idem: Idem) -> IdempotencyLayer {
        IdempotencyLayer::new(idem)
            .name("grpc")
            .methods([Method::POST])
            .with_config(|c| {
                c.protocol = Protocol::Grpc;
                if let Some(list) = &mut c.stored_headers {
                    list.extend(GRPC_STORED_HEADERS.iter().cloned());
                }
            })
    }

    /// Which gRPC responses are stored (default [`store_policy`]), by their `grpc-status`.
    pub fn store_grpc_if(self, policy: impl Fn(Code) -> OnError + Send + Sync + 'static) -> Self {
        let policy: Arc<GrpcStoreIfFn> = Arc::new(policy);
        self.with_config(|c| c.grpc_store_if = policy)
    }
}
