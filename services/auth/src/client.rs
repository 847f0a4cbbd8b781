//! Client side of both auth models:
//! - per call: [`Signing`], a tower layer that adds the `x-cube-*` metadata to every outgoing
//!   request, signed for that request's method path (wrap a tonic `Channel`, hand the result to
//!   any generated client);
//! - per connection: [`handshake`], which runs Auth.Challenge + Auth.Hello on one channel (one
//!   HTTP/2 connection) and checks the server's proof; later calls on it need no credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue};

use crate::{PreparedKey, Secret, headers};

// Parsed once, not on every call.
static H_TENANT: HeaderName = HeaderName::from_static(headers::TENANT);
static H_KEY: HeaderName = HeaderName::from_static(headers::KEY);
static H_TS: HeaderName = HeaderName::from_static(headers::TS);
static H_NONCE: HeaderName = HeaderName::from_static(headers::NONCE);
static H_SIG: HeaderName = HeaderName::from_static(headers::SIG);

/// Who signs: the key prepared once, the constant headers encoded once.
#[derive(Debug, Clone)]
pub struct CallSigner {
    tenant: Arc<str>,
    key_id: Arc<str>,
    key: PreparedKey,
    tenant_header: Option<HeaderValue>,
    key_header: Option<HeaderValue>,
}

impl CallSigner {
    pub fn new(tenant: &str, key_id: &str, secret: Secret) -> CallSigner {
        CallSigner {
            tenant: tenant.into(),
            key_id: key_id.into(),
            key: PreparedKey::new(&secret),
            // Tenant names and key ids are ASCII by construction. Another one is not sent (a
            // control character) or sent as bytes the server cannot read (non-ASCII): either way
            // the server answers UNAUTHENTICATED, as for an unsigned call. cubec checks them
            // before it connects.
            tenant_header: HeaderValue::from_str(tenant).ok(),
            key_header: HeaderValue::from_str(key_id).ok(),
        }
    }

    /// Add signed metadata for `method_path` to `headers_map`. The per-call values are marked
    /// sensitive (never indexed) unless `index_names`: then HPACK puts `x-cube-ts`,
    /// `x-cube-nonce` and `x-cube-sig` (with this call's values) into both ends' dynamic tables,
    /// and later calls on the same connection refer to those names by index and send only their
    /// values as literals, instead of the names too. [`Signing`] asks for that on a connection's
    /// first call.
    pub fn sign_headers(
        &self,
        method_path: &str,
        headers_map: &mut http::HeaderMap,
        index_names: bool,
    ) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut nonce = [0u8; 32];
        // NOTE: 16 random bytes always encode into exactly 32 hex characters.
        let _ = hex::encode_to_slice(rand::random::<[u8; 16]>(), &mut nonce);
        let nonce = std::str::from_utf8(&nonce).unwrap_or_default();
        let mac = self
            .key
            .call_mac(method_path, &self.tenant, &self.key_id, ts, nonce);
        let mut sig = [0u8; 64];
        let _ = hex::encode_to_slice(mac, &mut sig);
        // Room for the five headers at once, instead of the map growing under them.
        headers_map.reserve(5);
        if let (Some(t), Some(k)) = (&self.tenant_header, &self.key_header) {
            headers_map.insert(&H_TENANT, t.clone());
            headers_map.insert(&H_KEY, k.clone());
        }
        // Values unique to each call are marked sensitive: HPACK then sends them as never-indexed
        // literals instead of churning both ends' dynamic tables (measured: docs/benchmarks.md).
        // Only the first call of a connection (`index_names`) leaves its values indexable, to
        // put the names into the tables; its signature is then kept in both ends' compression
        // contexts for the connection's life, which gives nothing away: it authenticates that
        // one call only, and the replay cache refuses it a second time.
        let mut put = |name: &'static HeaderName, value: Option<HeaderValue>| {
            if let Some(mut v) = value {
                v.set_sensitive(!index_names);
                headers_map.insert(name, v);
            }
        };
        put(&H_TS, Some(HeaderValue::from(ts)));
        put(&H_NONCE, HeaderValue::from_bytes(nonce.as_bytes()).ok());
        put(&H_SIG, HeaderValue::from_bytes(&sig).ok());
    }
}

/// A tower service that signs each request, then passes it on. Built with
/// [`Signing::passthrough`] it signs nothing (for a connection authenticated by the handshake),
/// so one client type serves both models.
///
/// The first call through a `Signing` (and its clones) sends the per-call headers indexable, so
/// that later calls send their names as HPACK indexes ([`CallSigner::sign_headers`]).
/// That assumes `inner` is one HTTP/2 connection; over several (or after a reconnect) the other
/// connections get the names as literals, as before: slower, never wrong.
#[derive(Debug, Clone)]
pub struct Signing<S> {
    inner: S,
    /// Shared: a client is cloned for each call (tonic's way), and a signer's clone copied its
    /// prepared HMAC states and took four reference counts.
    signer: Option<Arc<CallSigner>>,
    names_sent: Arc<AtomicBool>,
}

impl<S> Signing<S> {
    pub fn new(inner: S, signer: CallSigner) -> Signing<S> {
        Signing {
            inner,
            signer: Some(Arc::new(signer)),
            names_sent: Arc::default(),
        }
    }

    pub fn passthrough(inner: S) -> Signing<S> {
        Signing {
            inner,
            signer: None,
            names_sent: Arc::default(),
        }
    }

    /// The service the calls are passed on to (the connection, for a caller that watches it).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, B> tower::Service<http::Request<B>> for Signing<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(signer) = &self.signer else {
            return self.inner.call(req);
        };
        // Split so the path can be borrowed while the headers are changed (no copy of it).
        let (mut parts, body) = req.into_parts();
        let first = !self.names_sent.load(Ordering::Relaxed)
            && !self.names_sent.swap(true, Ordering::Relaxed);
        signer.sign_headers(parts.uri.path(), &mut parts.headers, first);
        self.inner.call(http::Request::from_parts(parts, body))
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("the server refused the handshake: {0}")]
    Refused(#[from] tonic::Status),
    #[error("the server's proof (server_mac) is wrong: it does not know this key")]
    BadServerProof,
    #[error("the server authenticated the connection as '{got}', not as '{expected}'")]
    WrongPrincipal { expected: String, got: String },
    /// A challenge nonce of another size than the protocol's 32 bytes: a client must not sign
    /// whatever a server (or something posing as one) hands it.
    #[error("the server's challenge nonce is {0} bytes, not 32: not a Cube server's challenge")]
    BadChallenge(usize),
    /// Its source says how (so the message does not repeat it in an error chain).
    #[error("the credentials' secret is malformed")]
    Secret(#[from] crate::SecretError),
}

/// Authenticate the connection behind `channel` as `creds`; returns the principal
/// (`tenant/key_id`). `channel` must be any gRPC service over exactly one HTTP/2 connection (a
/// `Channel` from a plain `Endpoint::connect`, or cube-load's own `Conn`), and a reconnect loses
/// the session.
pub async fn handshake<T>(channel: T, creds: &crate::Credentials) -> Result<String, HandshakeError>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    use cube_api::v1::auth_client::AuthClient;
    use cube_api::v1::{ChallengeRequest, HelloRequest};
    let secret = creds.secret()?;
    let mut auth = AuthClient::new(channel);
    let challenge = auth
        .challenge(ChallengeRequest {
            tenant: creds.tenant.clone(),
            key_id: creds.key_id.clone(),
        })
        .await?
        .into_inner();
    if challenge.nonce.len() != 32 {
        return Err(HandshakeError::BadChallenge(challenge.nonce.len()));
    }
    let client_nonce: [u8; 16] = rand::random();
    let mac = crate::hello_mac(
        &secret,
        &creds.tenant,
        &creds.key_id,
        &challenge.nonce,
        &client_nonce,
    );
    let hello = auth
        .hello(HelloRequest {
            tenant: creds.tenant.clone(),
            key_id: creds.key_id.clone(),
            nonce: challenge.nonce.clone(),
            client_nonce: client_nonce.to_vec(),
            mac: mac.to_vec(),
        })
        .await?
        .into_inner();
    // Step 5 of docs/protocol.md: the proof compared in constant time, then the principal.
    if !crate::verify_server_mac(&secret, &challenge.nonce, &client_nonce, &hello.server_mac) {
        return Err(HandshakeError::BadServerProof);
    }
    let principal = format!("{}/{}", creds.tenant, creds.key_id);
    if hello.principal != principal {
        return Err(HandshakeError::WrongPrincipal {
            expected: principal,
            got: hello.principal,
        });
    }
    Ok(hello.principal)
}

/// Verify audit entries as `Tenant.Audit` returns them (oldest first); see
/// [`crate::verify_audit_chain`].
pub fn verify_audit_entries(entries: &[cube_api::v1::AuditEntry]) -> Result<usize, (u64, String)> {
    crate::verify_audit_chain(entries.iter().map(|e| crate::AuditLink {
        seq: e.seq,
        ts_ms: e.ts_ms,
        principal: &e.principal,
        op: &e.op,
        detail: &e.detail,
        prev_hash: &e.prev_hash,
        hash: &e.hash,
    }))
}

/// [`verify_audit_entries`] for entries as the bytes they were sent as, each read in place
/// ([`audit_link_of`]) without decoding it into owned fields. `Err` if an entry is not a
/// `cube.v1.AuditEntry` (what is wrong with it), else the chain's verdict.
pub fn verify_encoded_audit_entries<B: AsRef<[u8]>>(
    entries: &[B],
) -> Result<Result<usize, (u64, String)>, String> {
    let links = entries
        .iter()
        .map(|b| audit_link_of(b.as_ref()))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(crate::verify_audit_chain(links))
}

/// A `cube.v1.AuditEntry` read in place from its encoding, its fields borrowed. Decodes as
/// prost does: a field missing is its default, the last occurrence of a field wins, unknown
/// fields are skipped, strings must be UTF-8; an encoding prost would refuse is an error that
/// says what is wrong.
pub fn audit_link_of(mut buf: &[u8]) -> Result<crate::AuditLink<'_>, String> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    let invalid = |e: prost::DecodeError| e.to_string();
    let mut e = crate::AuditLink {
        seq: 0,
        ts_ms: 0,
        principal: "",
        op: "",
        detail: "",
        prev_hash: &[],
        hash: &[],
    };
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(invalid)?;
        match (tag, wire_type) {
            (1, WireType::Varint) => e.seq = decode_varint(&mut buf).map_err(invalid)?,
            // int64 is the varint's two's complement: `as` is the conversion prost makes.
            (2, WireType::Varint) => e.ts_ms = decode_varint(&mut buf).map_err(invalid)? as i64,
            (3..=7, WireType::LengthDelimited) => {
                let len = usize::try_from(decode_varint(&mut buf).map_err(invalid)?)
                    .ok()
                    .filter(|&len| len <= buf.len())
                    .ok_or_else(|| format!("field {tag} runs past the end of the entry"))?;
                let (field, rest) = buf.split_at(len);
                buf = rest;
                let text = || {
                    std::str::from_utf8(field)
                        .map_err(|_| format!("string field {tag} is not UTF-8"))
                };
                match tag {
                    3 => e.principal = text()?,
                    4 => e.op = text()?,
                    5 => e.detail = text()?,
                    6 => e.prev_hash = field,
                    _ => e.hash = field,
                }
            }
            (1..=7, _) => return Err(format!("field {tag} has wire type {wire_type:?}")),
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default()).map_err(invalid)?,
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CallSignature;
    use std::convert::Infallible;
    use std::future::{Ready, ready};
    use std::sync::Mutex;
    use tower::Service;

    /// Stands in for the connection: keeps the headers of every request it is given.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<http::HeaderMap>>>);

    impl Service<http::Request<()>> for Recorder {
        type Response = ();
        type Error = Infallible;
        type Future = Ready<Result<(), Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            self.0.lock().unwrap().push(req.headers().clone());
            ready(Ok(()))
        }
    }

    const PATH: &str = "/cube.v1.Cells/Read";

    fn read_request() -> http::Request<()> {
        http::Request::builder().uri(PATH).body(()).unwrap()
    }

    fn value<'a>(h: &'a http::HeaderMap, name: &HeaderName) -> &'a str {
        h.get(name).unwrap().to_str().unwrap()
    }

    #[test]
    fn only_the_first_call_of_a_connection_sends_its_per_call_values_indexable() {
        let secret = Secret::from_bytes([7; 32]);
        let recorder = Recorder::default();
        let mut first = Signing::new(
            recorder.clone(),
            CallSigner::new("acme", "k1", secret.clone()),
        );
        // A clone shares the connection (tonic clients clone their service for every call).
        let mut clone = first.clone();
        first.call(read_request()).into_inner().unwrap();
        clone.call(read_request()).into_inner().unwrap();
        first.call(read_request()).into_inner().unwrap();
        // Another `Signing` is another connection: its first call puts the names in its tables.
        let mut other = Signing::new(
            recorder.clone(),
            CallSigner::new("acme", "k1", secret.clone()),
        );
        other.call(read_request()).into_inner().unwrap();

        let seen = recorder.0.lock().unwrap();
        let sensitive =
            |h: &http::HeaderMap| [&H_TS, &H_NONCE, &H_SIG].map(|n| h[n].is_sensitive());
        assert_eq!(sensitive(&seen[0]), [false; 3]);
        assert_eq!(sensitive(&seen[1]), [true; 3]);
        assert_eq!(sensitive(&seen[2]), [true; 3]);
        assert_eq!(sensitive(&seen[3]), [false; 3]);
        for h in seen.iter() {
            // The constant headers are indexable on every call (one byte each once indexed).
            assert!(!h[&H_TENANT].is_sensitive() && !h[&H_KEY].is_sensitive());
            // Indexable or not, every call is signed the same way, and verifies.
            assert!(CallSignature::verify_prepared(
                &crate::PreparedKey::new(&secret),
                PATH,
                value(h, &H_TENANT),
                value(h, &H_KEY),
                value(h, &H_TS),
                value(h, &H_NONCE),
                value(h, &H_SIG).as_bytes(),
            ));
        }
        // Fresh nonces on every call, the first one included.
        let mut nonces: Vec<&str> = seen.iter().map(|h| value(h, &H_NONCE)).collect();
        nonces.sort_unstable();
        nonces.dedup();
        assert_eq!(nonces.len(), seen.len());
    }

    #[test]
    fn a_passthrough_layer_adds_nothing() {
        let recorder = Recorder::default();
        Signing::passthrough(recorder.clone())
            .call(read_request())
            .into_inner()
            .unwrap();
        assert!(recorder.0.lock().unwrap()[0].is_empty());
    }
    #[test]
    fn encoded_entries_are_verified_like_decoded_ones() {
        use prost::Message;
        let mut prev = crate::AUDIT_GENESIS.to_vec();
        let entries: Vec<cube_api::v1::AuditEntry> = (1..=3u64)
            .map(|seq| {
                let detail = format!("({seq},1,1) v{seq}");
                let hash = crate::audit_hash(&prev, seq, 1000 + seq as i64, "k1", "write", &detail);
                cube_api::v1::AuditEntry {
                    seq,
                    ts_ms: 1000 + seq as i64,
                    principal: "k1".into(),
                    op: "write".into(),
                    detail,
                    prev_hash: std::mem::replace(&mut prev, hash.to_vec()),
                    hash: hash.to_vec(),
                }
            })
            .collect();
        let encoded: Vec<Vec<u8>> = entries.iter().map(Message::encode_to_vec).collect();
        assert_eq!(verify_audit_entries(&entries), Ok(3));
        assert_eq!(verify_encoded_audit_entries(&encoded), Ok(Ok(3)));
        // A detail altered in transit: both name the same link.
        let mut tampered = entries.clone();
        tampered[1].detail.push('!');
        let tampered_encoded: Vec<Vec<u8>> = tampered.iter().map(Message::encode_to_vec).collect();
        let verdict = verify_audit_entries(&tampered);
        assert_eq!(verdict.as_ref().map_err(|(seq, _)| *seq), Err(2));
        assert_eq!(verify_encoded_audit_entries(&tampered_encoded), Ok(verdict));
        // Bytes that are no AuditEntry at all (field 3 runs past the end).
        let err = verify_encoded_audit_entries(&[vec![(3 << 3) | 2, 9, b'x']]).unwrap_err();
        assert!(err.contains("field 3"), "{err}");
    }

    fn entry() -> cube_api::v1::AuditEntry {
        cube_api::v1::AuditEntry {
            seq: 300,
            ts_ms: -5,
            principal: "key-1".into(),
            op: "write".into(),
            detail: "(1,2,3) v7\nmore".into(),
            prev_hash: vec![1; 32],
            hash: vec![2; 32],
        }
    }

    fn owned(e: crate::AuditLink<'_>) -> cube_api::v1::AuditEntry {
        cube_api::v1::AuditEntry {
            seq: e.seq,
            ts_ms: e.ts_ms,
            principal: e.principal.into(),
            op: e.op.into(),
            detail: e.detail.into(),
            prev_hash: e.prev_hash.into(),
            hash: e.hash.into(),
        }
    }

    #[test]
    fn an_entry_read_in_place_is_the_entry_prost_decodes() {
        use prost::Message;
        let full = entry();
        let bytes = full.encode_to_vec();
        assert_eq!(owned(audit_link_of(&bytes).unwrap()), full);
        // Defaults are not encoded at all.
        let empty = cube_api::v1::AuditEntry::default();
        assert_eq!(owned(audit_link_of(&[]).unwrap()), empty);
        // Negative timestamps and the largest seq survive the varints.
        let edge = cube_api::v1::AuditEntry {
            seq: u64::MAX,
            ts_ms: i64::MIN,
            ..entry()
        };
        assert_eq!(owned(audit_link_of(&edge.encode_to_vec()).unwrap()), edge);
    }

    #[test]
    fn unknown_fields_are_skipped_and_the_last_occurrence_wins() {
        use prost::Message;
        let mut bytes = entry().encode_to_vec();
        // Field 9 (varint 7), field 10 (length-delimited "xy"), then op again as "seal".
        bytes.extend_from_slice(&[9 << 3, 7, (10 << 3) | 2, 2, b'x', b'y']);
        bytes.extend_from_slice(&[(4 << 3) | 2, 4, b's', b'e', b'a', b'l']);
        let prost_view = cube_api::v1::AuditEntry::decode(bytes.as_slice()).unwrap();
        let read = audit_link_of(&bytes).unwrap();
        assert_eq!(read.op, "seal");
        assert_eq!(owned(read), prost_view);
    }

    #[test]
    fn what_prost_refuses_is_refused() {
        use prost::Message;
        let bytes = entry().encode_to_vec();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "truncated inside a field",
                bytes[..bytes.len() - 1].to_vec(),
            ),
            ("a length past the end", vec![(3 << 3) | 2, 5, b'a']),
            ("principal not UTF-8", vec![(3 << 3) | 2, 1, 0xff]),
            ("seq sent as bytes", vec![(1 << 3) | 2, 1, 0]),
            ("a varint never ending", vec![1 << 3, 0x80]),
            ("tag 0", vec![0, 1]),
            ("wire type 6", vec![(9 << 3) | 6, 1]),
            ("an end group never started", vec![(9 << 3) | 4]),
        ];
        for (what, case) in cases {
            assert!(
                cube_api::v1::AuditEntry::decode(case.as_slice()).is_err(),
                "{what}: prost accepts it, so the case is wrong"
            );
            assert!(audit_link_of(&case).is_err(), "{what}: accepted");
        }
    }
}
