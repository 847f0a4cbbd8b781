//! cube-auth: the HMAC wire format of both authentication models, shared by server and clients.
//!
//! Owns canonical strings, signing and verification, and the credentials type. It does no I/O and
//! keeps no state: the replay cache and key catalog live in the server.

mod call;
mod credentials;
mod hello;

pub use call::{
    CallSignature, PreparedKey, SignedCall, call_canonical_string, decode_hex_bytes,
    new_call_nonce, parse_nonce,
};
pub use credentials::{Credentials, Secret, SecretError};
pub use hello::{hello_mac, server_mac, verify_hello_mac, verify_server_mac};

/// Metadata keys of a per-call signature.
pub mod headers {
    pub const TENANT: &str = "x-cube-tenant";
    pub const KEY: &str = "x-cube-key";
    pub const TS: &str = "x-cube-ts";
    pub const NONCE: &str = "x-cube-nonce";
    pub const SIG: &str = "x-cube-sig";
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac_over(secret: &Secret, parts: &[&[u8]]) -> HmacSha256 {
    use hmac::Mac;
    // NOTE: HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match HmacSha256::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => unreachable!("hmac takes any key length"),
    };
    for p in parts {
        mac.update(p);
    }
    mac
}

#[cfg(feature = "client")]
pub mod client;

mod audit;
pub use audit::{AUDIT_GENESIS, AuditLink, audit_hash, verify_audit_chain};
