//! The per-connection handshake's MACs:
//!
//! ```text
//! mac        = HMAC-SHA256(secret, "CUBE1-HELLO\n" + tenant + "\n" + key_id + "\n" + hex(nonce) + "\n" + hex(client_nonce))
//! server_mac = HMAC-SHA256(secret, "CUBE1-SERVER\n" + hex(nonce) + "\n" + hex(client_nonce))
//! ```

use hmac::Mac;

use crate::{Secret, mac_over};

fn hello_canonical(tenant: &str, key_id: &str, nonce: &[u8], client_nonce: &[u8]) -> String {
    format!(
        "CUBE1-HELLO\n{tenant}\n{key_id}\n{}\n{}",
        hex::encode(nonce),
        hex::encode(client_nonce)
    )
}

/// The client's proof for Auth.Hello.
pub fn hello_mac(
    secret: &Secret,
    tenant: &str,
    key_id: &str,
    nonce: &[u8],
    client_nonce: &[u8],
) -> [u8; 32] {
    let canonical = hello_canonical(tenant, key_id, nonce, client_nonce);
    mac_over(secret, &[canonical.as_bytes()])
        .finalize()
        .into_bytes()
        .into()
}

/// Constant-time check of a Hello mac.
pub fn verify_hello_mac(
    secret: &Secret,
    tenant: &str,
    key_id: &str,
    nonce: &[u8],
    client_nonce: &[u8],
    mac: &[u8],
) -> bool {
    let canonical = hello_canonical(tenant, key_id, nonce, client_nonce);
    mac_over(secret, &[canonical.as_bytes()])
        .verify_slice(mac)
        .is_ok()
}

/// Constant-time check of the server's proof (`server_mac`), as a client does in step 5.
pub fn verify_server_mac(
    secret: &Secret,
    nonce: &[u8],
    client_nonce: &[u8],
    server_mac: &[u8],
) -> bool {
    mac_over(secret, &[server_canonical(nonce, client_nonce).as_bytes()])
        .verify_slice(server_mac)
        .is_ok()
}

fn server_canonical(nonce: &[u8], client_nonce: &[u8]) -> String {
    format!(
        "CUBE1-SERVER\n{}\n{}",
        hex::encode(nonce),
        hex::encode(client_nonce)
    )
}

/// The server's proof that it knows the key too.
pub fn server_mac(secret: &Secret, nonce: &[u8], client_nonce: &[u8]) -> [u8; 32] {
    mac_over(secret, &[server_canonical(nonce, client_nonce).as_bytes()])
        .finalize()
        .into_bytes()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(from: u8, to_inclusive: u8) -> Vec<u8> {
        (from..=to_inclusive).collect()
    }

    /// The handshake test vector of ARCHITECTURE.md / docs/protocol.md.
    #[test]
    fn hello_macs_match_the_published_test_vector() {
        let secret = Secret::from_bytes(bytes(0x00, 0x1f).try_into().unwrap());
        let nonce = bytes(0x64, 0x83);
        let client_nonce = bytes(0xc8, 0xd7);
        let mac = hello_mac(&secret, "acme", "k1", &nonce, &client_nonce);
        assert_eq!(
            hex::encode(mac),
            "4e59e4f5651ca616f5fadb65366b4417ed8befee0abbc9aa9dbcac7a1f39919f"
        );
        assert_eq!(
            hex::encode(server_mac(&secret, &nonce, &client_nonce)),
            "9bdd978c20c9c34e1f430029653caa565806164a01e6446b0e679e2c4e1153be"
        );
        assert!(verify_hello_mac(
            &secret,
            "acme",
            "k1",
            &nonce,
            &client_nonce,
            &mac
        ));
        assert!(!verify_hello_mac(
            &secret,
            "acme",
            "k2",
            &nonce,
            &client_nonce,
            &mac
        ));
        let proof = server_mac(&secret, &nonce, &client_nonce);
        assert!(verify_server_mac(&secret, &nonce, &client_nonce, &proof));
        let mut forged = proof;
        forged[31] ^= 1;
        assert!(!verify_server_mac(&secret, &nonce, &client_nonce, &forged));
        assert!(!verify_server_mac(
            &secret,
            &nonce,
            &client_nonce,
            &proof[..31]
        ));
    }
}
