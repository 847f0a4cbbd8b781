//! The behaviour `vendor/h2`'s patch exists for (vendor/h2/CUBE-PATCH.md): a client's new
//! stream is opened at once, so it has send capacity before the connection task has run, and a
//! request's HEADERS and DATA frames leave in one write. With upstream h2 the capacity stays 0
//! until the connection task has written the HEADERS frame on its own.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

/// A transport that records the size of every write.
struct CountingIo {
    inner: DuplexStream,
    writes: Arc<Mutex<Vec<usize>>>,
}

impl AsyncRead for CountingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.writes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(*n);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_new_request_stream_has_capacity_at_once_and_goes_out_in_one_write() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (got_tx, got_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        let (req, mut respond) = conn.accept().await.unwrap().unwrap();
        let mut body = req.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        respond
            .send_response(http::Response::new(()), true)
            .unwrap();
        let _ = got_tx.send(got);
        // Polling the connection is what writes the response; keep doing it.
        while let Some(Ok(_)) = conn.accept().await {}
    });

    let writes = Arc::new(Mutex::new(Vec::new()));
    let io = CountingIo {
        inner: client_io,
        writes: Arc::clone(&writes),
    };
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    // Let the connection task exchange SETTINGS, then forget the writes that took.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    writes.lock().unwrap().clear();

    let req = http::Request::post("http://cube.test/cube.v1.Cells/Read")
        .body(())
        .unwrap();
    let (response, mut stream) = client.send_request(req, false).unwrap();
    // No await since send_request: the connection task has not run.
    stream.reserve_capacity(5);
    assert!(
        stream.capacity() >= 5,
        "a new stream got no send capacity before the connection task ran (upstream h2 \
         behaviour: is vendor/h2's patch applied?)"
    );
    stream
        .send_data(tonic::codegen::Bytes::from_static(b"hello"), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);

    let request_writes: Vec<usize> = writes.lock().unwrap().clone();
    // HEADERS (9-byte frame header + the header block) and DATA (9 + 5 bytes) together.
    assert_eq!(
        request_writes.len(),
        1,
        "HEADERS and DATA should leave in one write; the writes were {request_writes:?}"
    );
    assert!(request_writes[0] > 9 + 9 + 5, "{request_writes:?}");
    assert_eq!(got_rx.await.unwrap(), b"hello");
    server.abort();
    conn.abort();
}

/// A request reset before the connection task wrote its HEADERS (a caller that gave up at once,
/// as hyper does when a response future is dropped) still sends those HEADERS before its
/// RST_STREAM: a RST_STREAM on a stream the server never saw is a connection error (RFC 9113
/// §6.4), which would fail every other call on the connection. With the patch's streams opened
/// at once, the reset used to drop the queued HEADERS (vendor/h2/CUBE-PATCH.md, change 5).
#[tokio::test(flavor = "current_thread")]
async fn a_request_reset_before_its_headers_were_written_leaves_the_connection_up() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        while let Some(Ok((_req, mut respond))) = conn.accept().await {
            let _ = respond.send_response(http::Response::new(()), true);
        }
    });
    let (client, conn) = h2::client::handshake(client_io).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let req = || {
        http::Request::post("http://cube.test/cube.v1.Cells/Read")
            .body(())
            .unwrap()
    };
    let (_given_up, mut stream) = client.send_request(req(), false).unwrap();
    // No await since send_request: its HEADERS are not written yet.
    stream.send_reset(h2::Reason::CANCEL);
    let mut client = client.ready().await.unwrap();
    let (response, _) = client.send_request(req(), true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(5), response)
        .await
        .expect("the second request got no answer")
        .expect("the connection was closed after the first request's reset");
    assert_eq!(response.status(), http::StatusCode::OK);
    server.abort();
    conn.abort();
}

/// A request reset after its body (and then also its trailers) was queued, before the
/// connection task wrote anything: the reset keeps the request's HEADERS (change 5) but not
/// what is queued behind them (change 6). The reset takes the stream's send capacity back, so
/// queued DATA could never be written, and the RST_STREAM behind it would never leave: the
/// server would keep the stream open waiting for its body, and the client would never get its
/// concurrency slot back (the server here allows one stream at a time, so the next request
/// would wait for ever). Trailers are a HEADERS frame too: sent before the RST_STREAM they
/// would end the stream, and the server would take the abandoned request as complete.
#[tokio::test(flavor = "current_thread")]
async fn a_request_reset_with_its_body_queued_frees_its_stream_and_is_not_completed() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let completed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::clone(&completed);
    let server = tokio::spawn(async move {
        let mut conn = h2::server::Builder::new()
            .max_concurrent_streams(1)
            .handshake::<_, tonic::codegen::Bytes>(server_io)
            .await
            .unwrap();
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                // The whole body and its trailers first, as a gRPC handler reads them.
                let mut body = req.into_body();
                while let Some(chunk) = body.data().await {
                    if chunk.is_err() {
                        return;
                    }
                }
                if body.trailers().await.is_err() {
                    return;
                }
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = respond.send_response(http::Response::new(()), true);
            });
        }
    });
    let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
    let conn = tokio::spawn(conn);
    client = client.ready().await.unwrap();
    // The server's SETTINGS (one stream at a time) arrive.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let req = || {
        http::Request::post("http://cube.test/cube.v1.Cells/Read")
            .body(())
            .unwrap()
    };
    for with_trailers in [false, true] {
        client = tokio::time::timeout(std::time::Duration::from_secs(5), client.ready())
            .await
            .expect("no stream slot: the reset stream before still holds the only one")
            .unwrap();
        let (_given_up, mut stream) = client.send_request(req(), false).unwrap();
        // No await from here to the reset: nothing of this stream is written yet.
        stream.reserve_capacity(5);
        stream
            .send_data(tonic::codegen::Bytes::from_static(b"hello"), false)
            .unwrap();
        if with_trailers {
            stream.send_trailers(http::HeaderMap::new()).unwrap();
        }
        stream.send_reset(h2::Reason::CANCEL);
    }
    let answered = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut client = client.ready().await.unwrap();
        let (response, _) = client.send_request(req(), true).unwrap();
        response.await
    })
    .await
    .expect("the last request got no answer: a reset stream still holds the only slot")
    .expect("the connection was closed");
    assert_eq!(answered.status(), http::StatusCode::OK);
    assert_eq!(
        completed.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the last request reached the server whole"
    );
    server.abort();
    conn.abort();
}

/// The response headers a server encodes against a dynamic table that keeps evicting, with
/// values that change now and then (as a server's `date` does once a second) and values that
/// come back from deeper in the table: every response decodes to exactly what was sent. Guards
/// change 7 (vendor/h2/CUBE-PATCH.md), which looks for a header among the newest table entries
/// before walking its name's chain: a wrong index there decodes as another entry's value, or
/// as a compression error that closes the connection.
#[tokio::test(flavor = "current_thread")]
async fn response_headers_decode_as_sent_while_the_table_churns() {
    const RESPONSES: usize = 600;
    let headers_of = |i: usize| -> Vec<(&'static str, String)> {
        vec![
            (
                "date",
                format!("Mon, 07 Dec 2026 20:{:02}:00 GMT", i / 5 % 60),
            ),
            ("x-slow", format!("s{}", i / 11)),
            // Back and forth among a few values, some still in the table, some evicted.
            ("x-pool", format!("p{}", (i * 7 + i / 3) % 13)),
            ("content-type", "application/grpc".to_string()),
        ]
    };
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        let mut i = 0;
        while let Some(Ok((_req, mut respond))) = conn.accept().await {
            let mut response = http::Response::builder();
            for (name, value) in headers_of(i) {
                response = response.header(name, value);
            }
            let _ = respond.send_response(response.body(()).unwrap(), true);
            i += 1;
        }
    });
    // A small table (the server encodes against the size its client allows), so that entries
    // are evicted every few responses.
    let (mut client, conn) = h2::client::Builder::new()
        .header_table_size(256)
        .handshake::<_, tonic::codegen::Bytes>(client_io)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    for i in 0..RESPONSES {
        client = client.ready().await.unwrap();
        let req = http::Request::post("http://cube.test/cube.v1.Cells/Read")
            .body(())
            .unwrap();
        let (response, _) = client.send_request(req, true).unwrap();
        let response = tokio::time::timeout(std::time::Duration::from_secs(5), response)
            .await
            .expect("no answer within 5 s")
            .unwrap_or_else(|e| panic!("response {i}: {e}"));
        for (name, value) in headers_of(i) {
            assert_eq!(
                response.headers().get(name).map(|v| v.to_str().unwrap()),
                Some(value.as_str()),
                "response {i}, header {name}"
            );
        }
    }
    server.abort();
    conn.abort();
}
