//! A request message over `--max-message-bytes` is refused by tonic before it is decoded, with
//! OUT_OF_RANGE and tonic's own text. The contract (`CONTRACT.md`: "value over the limit →
//! INVALID_ARGUMENT") and the value limit itself answer INVALID_ARGUMENT, so this layer turns
//! that one refusal into INVALID_ARGUMENT with a message naming the server's limit. Every other
//! response passes through untouched.

use tonic::body::Body;
use tonic::{Code, Status};

/// How tonic words the refusal of a message over the decoding limit (`tonic::codec::decode`).
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// The INVALID_ARGUMENT that replaces tonic's refusal of a message over `limit` bytes, for a
/// server whose `--max-message-bytes` is `max`.
fn too_large(limit: usize, max: usize) -> Status {
    if limit != max {
        // The handshake, health and reflection (`server::OPEN_MESSAGE_BYTES`).
        return Status::invalid_argument(format!(
            "the request message is over this method's limit of {limit} bytes per message"
        ));
    }
    if limit == crate::OPEN_MESSAGE_BYTES {
        // Either limit: the response does not say which method refused.
        return Status::invalid_argument(format!(
            "the request message is over the limit of {limit} bytes per message \
             (--max-message-bytes, and the handshake's, health's and reflection's own)"
        ));
    }
    Status::invalid_argument(format!(
        "the request message is over this server's limit of {limit} bytes per message \
         (--max-message-bytes); a cell's value must also fit --max-value-bytes"
    ))
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
            None => resp,
        }
    })
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
}
