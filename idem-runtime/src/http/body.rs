//! The bodies the layer hands on: a buffered one (a request body it read, a response it
//! stored or made), or the inner service's own, untouched, for requests that pass through.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A body the layer holds in memory: its bytes, then its trailers if it has any (a gRPC
/// response's `grpc-status` is a trailer).
#[derive(Debug, Default, Clone)]
pub struct Buffered {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Buffered {
    /// A body of `data` and `trailers`.
    pub fn new(data: Bytes, trailers: Option<HeaderMap>) -> Buffered {
        Buffered {
            data: (!data.is_empty()).then_some(data),
            trailers,
        }
    }
}

impl From<Vec<u8>> for Buffered {
    fn from(data: Vec<u8>) -> Self {
        Buffered::new(Bytes::from(data), None)
    }
}

impl From<Bytes> for Buffered {
    fn from(data: Bytes) -> Self {
        Buffered::new(data, None)
    }
}

impl Body for Buffered {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// The body of a request or response through the layer: [`Buffered`] (`Left`) when the layer
/// read or made it, the original body (`Right`) when the request passed through.
pub type LayerBody<B> = http_body_util::Either<Buffered, B>;
