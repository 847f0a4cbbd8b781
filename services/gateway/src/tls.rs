//! TLS for the network listener: rustls with the ring provider, HTTP/2 via ALPN, and optional
//! client certificates (mTLS) issued by the data directory's CA.
//!
//! A client certificate whose subject common name is `tenant/key_id` authenticates its
//! connection as that key (a second per-connection authenticator beside the HMAC handshake, for
//! tools like ghz that cannot run the handshake). The key is still looked up on every call, so a
//! revoked key's certificate stops working at once.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;

/// PEM material for the listener.
#[derive(Clone)]
pub struct TlsSettings {
    /// Server certificate chain, leaf first.
    pub cert_chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// CA whose client certificates are accepted; `None` = no client certificates.
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the certificate file")]
    NoCertificate,
    /// A block of the certificate file that does not read as a certificate (a chain cut short
    /// when copied, say): refused rather than served without it.
    #[error("cannot read the certificate file: {0}")]
    Cert(String),
    #[error("cannot read the private key: {0}")]
    Key(String),
    #[error("cannot read the client CA: {0}")]
    ClientCa(String),
    #[error(
        "the private key does not belong to the certificate (the first one of the certificate \
         file): check that the two files are a pair, and not swapped"
    )]
    KeyMismatch,
    /// Its text is in the message; not a `source`, so that a chain of causes shows it once.
    #[error("TLS configuration rejected: {0}")]
    Config(rustls::Error),
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        match e {
            rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch,
            e => TlsError::Config(e),
        }
    }
}

/// Build the rustls server configuration.
pub fn server_config(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(&settings.cert_chain_pem)
        .collect::<Result<Vec<CertificateDer<'static>>, _>>()
        .map_err(|e| TlsError::Cert(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(&settings.key_pem)
        .map_err(|e| TlsError::Key(e.to_string()))?;
    // TLS 1.3 only: under TLS 1.2 a client certificate is sent in clear, and with it the
    // tenant and key id its subject names (every client this project ships or documents, and
    // ghz, speak 1.3).
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match &settings.client_ca_pem {
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(ca_pem) {
                let ca = ca.map_err(|e| TlsError::ClientCa(e.to_string()))?;
                roots
                    .add(ca)
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            }
            // Client certificates are optional: HMAC clients connect without one.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// `(tenant, key_id)` from the subject common name `tenant/key_id` of a (verified) client
/// certificate.
pub fn client_identity(cert: &CertificateDer<'_>) -> Option<(String, String)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    let (tenant, key_id) = cn.split_once('/')?;
    Some((tenant.to_string(), key_id.to_string()))
}
