//! A request message over `--max-message-bytes` is refused by tonic before it is decoded, with
//! OUT_OF_RANGE and tonic's own text. The contract (`CONTRACT.md`: "value over the limit →
//! INVALID_ARGUMENT") and the value limit itself answer INVALID_ARGUMENT, so this layer turns
//! that refusal into INVALID_ARGUMENT with a message naming the server's limit. Every other
//! response passes through untouched. So does tonic's INTERNAL for a unary or
//! server-streaming request whose body ended with no message: the caller's fault too, answered
//! INVALID_ARGUMENT.
//!
//! [`DecodeRefusals`] wraps the health service alone: it turns tonic's INTERNAL for a request
//! that is not valid protobuf into INVALID_ARGUMENT. Cube's own services decode through
//! `cube_api::CubeCodec`, which says so itself, but health uses tonic's codec, which calls the
//! caller's malformed message a server error. (Reflection's stream, also on tonic's codec, ends
//! without an error when a request does not decode: tonic-reflection drops it.) Kept to health so
//! that a real INTERNAL of any other service is never relabelled as the caller's fault.

use tonic::body::Body;
use tonic::{Code, Status};

/// How tonic words the refusal of a message over the decoding limit (`tonic::codec::decode`).
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// The INVALID_ARGUMENT that replaces tonic's refusal of a message over `limit` bytes, for a
/// server whose `--max-message-bytes` is `max`.
fn too_large(limit: usize, max: usize) -> Status {
    if limit != max {
        // A method with a smaller limit of its own: the handshake, health, reflection and Access
        // (`server::OPEN_MESSAGE_BYTES`), Cells.Walk (`server::WALK_MESSAGE_BYTES`).
        return over_method_limit(limit);
    }
    if limit == crate::OPEN_MESSAGE_BYTES {
        // Either limit: the response does not say which method refused.
        return Status::invalid_argument(format!(
            "the request message is over the limit of {limit} bytes per message \
             (--max-message-bytes, and the handshake's, health's, reflection's and Access's \
             own)"
        ));
    }
    Status::invalid_argument(format!(
        "the request message is over this server's limit of {limit} bytes per message \
         (--max-message-bytes); a cell's value must also fit --max-value-bytes"
    ))
}

/// The INVALID_ARGUMENT for a request message over `limit`, a method's own limit below
/// `--max-message-bytes` (also said by `crate::receive` for a reflection stream, whose own
/// ending drops tonic's refusal).
pub(crate) fn over_method_limit(limit: usize) -> Status {
    Status::invalid_argument(format!(
        "the request message is over this method's limit of {limit} bytes per message"
    ))
}

/// How tonic words its refusal of a unary or server-streaming request whose body held no
/// message (`tonic::server::grpc`), as INTERNAL.
const TONIC_NO_MESSAGE: &str = "Missing request message.";

/// Whether `headers` carry tonic's INTERNAL for a request with no message (trailers-only).
fn no_message_refusal(headers: &http::HeaderMap) -> bool {
    Status::from_header_map(headers)
        .is_some_and(|s| s.code() == Code::Internal && s.message() == TONIC_NO_MESSAGE)
}

/// The INVALID_ARGUMENT that replaces it.
fn no_message() -> Status {
    Status::invalid_argument(
        "the request carried no message: a call to this method sends exactly one (an empty \
         message is 5 bytes: a 0 flag and a 0 length)",
    )
}

/// How prost words a message it could not decode; tonic's codec answers it as INTERNAL.
const PROST_DECODE_FAILED: &str = "failed to decode Protobuf message";

/// The INVALID_ARGUMENT that replaces tonic's INTERNAL for an undecodable request, worded as
/// `cube_api`'s codec words it for Cube's own services (`reason`: prost's).
fn undecodable(reason: &str) -> Status {
    Status::invalid_argument(format!(
        "the message is not valid protobuf for this method ({reason}); check that the client \
         uses the service's .proto and that string fields hold UTF-8"
    ))
}

/// If `headers` carry tonic's INTERNAL for a request it could not decode (trailers-only, as
/// for every refusal before the service runs), prost's reason.
fn decode_refusal(headers: &http::HeaderMap) -> Option<String> {
    let status = Status::from_header_map(headers)?;
    (status.code() == Code::Internal && status.message().starts_with(PROST_DECODE_FAILED))
        .then(|| status.message().to_string())
}

/// If `headers` carry tonic's refusal of an oversized request ("trailers-only": the status
/// travels in the response headers), the limit it names (`None` if it names none readably).
fn oversize_refusal(headers: &http::HeaderMap) -> Option<Option<usize>> {
    let status = Status::from_header_map(headers)?;
    let message = status.message();
    if status.code() != Code::OutOfRange || !message.starts_with(TONIC_TOO_LARGE) {
        return None;
    }
    // "…: found N bytes, the limit is: M bytes"
    let limit = message
        .rsplit_once("the limit is: ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok());
    Some(limit)
}

/// The layer that rewrites tonic's oversized-request refusal (see the module doc). A plain
/// response map: no boxed future per call.
pub fn layer(
    max_message_bytes: usize,
) -> tower::util::MapResponseLayer<impl Fn(http::Response<Body>) -> http::Response<Body> + Clone> {
    tower::util::MapResponseLayer::new(move |resp: http::Response<Body>| {
        match oversize_refusal(resp.headers()) {
            Some(limit) => {
                too_large(limit.unwrap_or(max_message_bytes), max_message_bytes).into_http()
            }
            None if no_message_refusal(resp.headers()) => no_message().into_http(),
            None => resp,
        }
    })
}

/// A service (health) whose INTERNAL for an undecodable request is answered INVALID_ARGUMENT
/// (see the module doc).
#[derive(Debug, Clone)]
pub struct DecodeRefusals<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for DecodeRefusals<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for DecodeRefusals<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future =
        futures::future::MapOk<S::Future, fn(http::Response<Body>) -> http::Response<Body>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        use futures::TryFutureExt;
        self.0
            .call(req)
            .map_ok(answer_decode_refusal as fn(http::Response<Body>) -> http::Response<Body>)
    }
}

fn answer_decode_refusal(resp: http::Response<Body>) -> http::Response<Body> {
    match decode_refusal(resp.headers()) {
        Some(reason) => undecodable(&reason).into_http(),
        None => resp,
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
        assert_eq!(
            oversize_refusal(tonic_refusal.into_http::<Body>().headers()),
            Some(Some(4194304))
        );
        for other in [
            Status::out_of_range("some other range"),
            Status::invalid_argument(TONIC_TOO_LARGE),
            Status::ok(""),
        ] {
            assert_eq!(oversize_refusal(other.into_http::<Body>().headers()), None);
        }
        // A success carries no status in its headers.
        assert_eq!(oversize_refusal(&http::HeaderMap::new()), None);
    }

    #[test]
    fn only_tonics_missing_message_refusal_is_recognised() {
        let tonic_refusal = Status::internal(TONIC_NO_MESSAGE);
        assert!(no_message_refusal(
            tonic_refusal.into_http::<Body>().headers()
        ));
        for other in [
            Status::internal("Missing request message"),
            Status::invalid_argument(TONIC_NO_MESSAGE),
            Status::internal("the read failed on the server"),
        ] {
            assert!(!no_message_refusal(other.into_http::<Body>().headers()));
        }
        assert!(!no_message_refusal(&http::HeaderMap::new()));
    }

    #[test]
    fn only_tonics_decode_failure_is_recognised() {
        let tonic_failure = Status::internal(format!(
            "{PROST_DECODE_FAILED}: HealthCheckRequest.service: invalid string value: data is not UTF-8 encoded"
        ));
        let reason = decode_refusal(tonic_failure.into_http::<Body>().headers()).unwrap();
        assert!(reason.ends_with("not UTF-8 encoded"), "{reason}");
        for other in [
            Status::internal("a server fault"),
            Status::invalid_argument(PROST_DECODE_FAILED),
            Status::ok(""),
        ] {
            assert_eq!(decode_refusal(other.into_http::<Body>().headers()), None);
        }
        assert_eq!(decode_refusal(&http::HeaderMap::new()), None);
    }
}
