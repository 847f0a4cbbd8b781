//! A request message over `--max-message-bytes` is refused by tonic before it is decoded, with
//! OUT_OF_RANGE and tonic's own text. The contract (`CONTRACT.md`: "value over the limit →
//! INVALID_ARGUMENT") and the value limit itself answer INVALID_ARGUMENT, so this layer turns
//! that one refusal into INVALID_ARGUMENT with a message naming the server's limit. Every other
//! response passes through untouched.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::{Code, Status};

/// How tonic words the refusal of a message over the decoding limit (`tonic::codec::decode`).
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// The INVALID_ARGUMENT that replaces tonic's refusal of a message over `max_message_bytes`.
fn too_large(max_message_bytes: usize) -> Status {
    Status::invalid_argument(format!(
        "the request message is over this server's limit of {max_message_bytes} bytes per \
         message (--max-message-bytes); a cell's value must also fit --max-value-bytes"
    ))
}

/// Whether `headers` carry tonic's refusal of an oversized request ("trailers-only": the
/// status travels in the response headers).
fn is_oversize_refusal(headers: &http::HeaderMap) -> bool {
    Status::from_header_map(headers)
        .is_some_and(|s| s.code() == Code::OutOfRange && s.message().starts_with(TONIC_TOO_LARGE))
}

/// Tower layer that rewrites tonic's oversized-request refusal (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct OversizeLayer {
    max_message_bytes: usize,
}

impl OversizeLayer {
    pub fn new(max_message_bytes: usize) -> OversizeLayer {
        OversizeLayer { max_message_bytes }
    }
}

impl<S> tower::Layer<S> for OversizeLayer {
    type Service = Oversize<S>;

    fn layer(&self, inner: S) -> Oversize<S> {
        Oversize {
            inner,
            max_message_bytes: self.max_message_bytes,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Oversize<S> {
    inner: S,
    max_message_bytes: usize,
}

impl<S, B> tower::Service<http::Request<B>> for Oversize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let max = self.max_message_bytes;
        Box::pin(async move {
            let resp = fut.await?;
            if is_oversize_refusal(resp.headers()) {
                return Ok(too_large(max).into_http());
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_oversize_refusal_is_recognised() {
        let tonic_refusal = Status::out_of_range(format!(
            "{TONIC_TOO_LARGE}: found 5242885 bytes, the limit is: 4194304 bytes"
        ));
        assert!(is_oversize_refusal(
            tonic_refusal.into_http::<Body>().headers()
        ));
        for other in [
            Status::out_of_range("some other range"),
            Status::invalid_argument(TONIC_TOO_LARGE),
            Status::ok(""),
        ] {
            assert!(!is_oversize_refusal(other.into_http::<Body>().headers()));
        }
        // A success carries no status in its headers.
        assert!(!is_oversize_refusal(&http::HeaderMap::new()));
    }
}
