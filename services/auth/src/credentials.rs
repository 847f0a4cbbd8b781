//! Key material: a 32-byte secret that never prints, and the credentials JSON shape
//! (`{"tenant","key_id","secret"[,"endpoint"]}`) used by `cubed tenant create` and
//! `dev-credentials.json`.

use serde::{Deserialize, Serialize};

/// A key's 32-byte HMAC secret. `Debug` shows nothing of it, and `==` takes the same time
/// wherever two secrets differ.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        let diff = self
            .0
            .iter()
            .zip(&other.0)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0
    }
}

impl Eq for Secret {}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("a secret is 64 hex characters (32 bytes); got {0} characters")]
    Length(usize),
    #[error("a secret must be hexadecimal")]
    NotHex,
}

impl Secret {
    pub fn from_bytes(bytes: [u8; 32]) -> Secret {
        Secret(bytes)
    }

    /// A fresh secret from the operating system's CSPRNG.
    pub fn generate() -> Secret {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Secret(bytes)
    }

    pub fn from_hex(s: &str) -> Result<Secret, SecretError> {
        if s.len() != 64 {
            return Err(SecretError::Length(s.len()));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s, &mut bytes).map_err(|_| SecretError::NotHex)?;
        Ok(Secret(bytes))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// What a client needs to authenticate, in the JSON shape the CLI prints. `Debug` leaves the
/// secret out (it used to print it, and structs holding credentials derive `Debug`).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Credentials {
    pub tenant: String,
    pub key_id: String,
    /// 64 lowercase hex characters.
    pub secret: String,
    /// Where the server listens (present in dev-credentials.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tenant", &self.tenant)
            .field("key_id", &self.key_id)
            .field("secret", &format_args!(".."))
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Credentials {
    pub fn secret(&self) -> Result<Secret, SecretError> {
        Secret::from_hex(&self.secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Neither a secret nor the credentials holding it print it.
    #[test]
    fn debug_never_shows_the_secret() {
        let secret = Secret::generate();
        let creds = Credentials {
            tenant: "acme".into(),
            key_id: "k-1".into(),
            secret: secret.to_hex(),
            endpoint: None,
        };
        for shown in [
            format!("{secret:?}"),
            format!("{creds:?}"),
            format!("{creds:#?}"),
        ] {
            assert!(!shown.contains(&secret.to_hex()), "{shown}");
        }
        assert!(format!("{creds:?}").contains("acme"));
    }

    #[test]
    fn secret_hex_round_trip_and_errors() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(Secret::from_hex("abc"), Err(SecretError::Length(3)));
        assert_eq!(Secret::from_hex(&"zz".repeat(32)), Err(SecretError::NotHex));
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
