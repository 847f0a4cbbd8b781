//! Per-call signing: every call carries `x-cube-*` metadata whose signature covers the method
//! path, tenant, key, timestamp and nonce:
//!
//! ```text
//! x-cube-sig = hex(HMAC-SHA256(secret, "CUBE1-CALL\n" + method_path + "\n" + tenant + "\n" +
//!                                      key_id + "\n" + ts + "\n" + nonce))
//! ```
//!
//! The signature authenticates the caller and the method, not the body (TLS protects that).

use hmac::Mac;

use crate::{Secret, mac_over};

/// The string that is MACed, exactly as docs/protocol.md specifies.
pub fn call_canonical_string(
    method_path: &str,
    tenant: &str,
    key_id: &str,
    ts_ms: i64,
    nonce: &str,
) -> String {
    format!("CUBE1-CALL\n{method_path}\n{tenant}\n{key_id}\n{ts_ms}\n{nonce}")
}

/// A fresh call nonce: 32 lowercase hex characters (16 random bytes).
pub fn new_call_nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// The fields of one signed call as they appear in its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCall {
    pub tenant: String,
    pub key_id: String,
    pub ts_ms: i64,
    pub nonce: String,
    /// 64 lowercase hex characters.
    pub sig: String,
}

/// A key with its HMAC pads hashed once, for signing many calls (clients keep one per key).
#[derive(Clone)]
pub struct PreparedKey(crate::HmacSha256);

impl std::fmt::Debug for PreparedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedKey(..)")
    }
}

impl PreparedKey {
    pub fn new(secret: &Secret) -> PreparedKey {
        PreparedKey(mac_over(secret, &[]))
    }

    /// HMAC-SHA256 of the call canonical string, without allocating it.
    pub fn call_mac(
        &self,
        method_path: &str,
        tenant: &str,
        key_id: &str,
        ts_ms: i64,
        nonce: &str,
    ) -> [u8; 32] {
        let mut ts = itoa::Buffer::new();
        self.call_mac_text(method_path, tenant, key_id, ts.format(ts_ms), nonce)
    }

    /// [`PreparedKey::call_mac`] with the timestamp as the decimal text that was sent (the
    /// signature covers that text; a server that has checked it is canonical need not format
    /// the number again).
    pub fn call_mac_text(
        &self,
        method_path: &str,
        tenant: &str,
        key_id: &str,
        ts: &str,
        nonce: &str,
    ) -> [u8; 32] {
        let parts = [
            b"CUBE1-CALL\n".as_slice(),
            method_path.as_bytes(),
            b"\n",
            tenant.as_bytes(),
            b"\n",
            key_id.as_bytes(),
            b"\n",
            ts.as_bytes(),
            b"\n",
            nonce.as_bytes(),
        ];
        let mut mac = self.0.clone();
        // The string is gathered on the stack and hashed in one update: each update goes
        // through the hash's block buffer, which for ten short parts cost more than the copy
        // (measured with callgrind: docs/benchmarks.md). A longer string goes in parts.
        let mut buf = [0u8; 256];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= buf.len() {
            let mut at = 0;
            for part in parts {
                buf[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            mac.update(&buf[..len]);
        } else {
            for part in parts {
                mac.update(part);
            }
        }
        mac.finalize().into_bytes().into()
    }
}

/// Signs and verifies per-call signatures.
#[derive(Debug)]
pub struct CallSignature;

impl CallSignature {
    /// Sign a call to `method_path` (e.g. `/cube.v1.Cells/Write`) with a fresh nonce.
    pub fn sign(
        secret: &Secret,
        method_path: &str,
        tenant: &str,
        key_id: &str,
        ts_ms: i64,
    ) -> SignedCall {
        Self::sign_with_nonce(secret, method_path, tenant, key_id, ts_ms, new_call_nonce())
    }

    pub fn sign_with_nonce(
        secret: &Secret,
        method_path: &str,
        tenant: &str,
        key_id: &str,
        ts_ms: i64,
        nonce: String,
    ) -> SignedCall {
        let canonical = call_canonical_string(method_path, tenant, key_id, ts_ms, &nonce);
        let sig = hex::encode(
            mac_over(secret, &[canonical.as_bytes()])
                .finalize()
                .into_bytes(),
        );
        SignedCall {
            tenant: tenant.to_string(),
            key_id: key_id.to_string(),
            ts_ms,
            nonce,
            sig,
        }
    }

    /// Constant-time check of `call.sig` for `method_path`. Freshness and replay are the
    /// caller's business.
    pub fn verify(secret: &Secret, method_path: &str, call: &SignedCall) -> bool {
        Self::verify_prepared(
            &PreparedKey::new(secret),
            method_path,
            &call.tenant,
            &call.key_id,
            itoa::Buffer::new().format(call.ts_ms),
            &call.nonce,
            call.sig.as_bytes(),
        )
    }

    /// [`CallSignature::verify`] on borrowed metadata values with the key already prepared (no
    /// allocation, and the key's pads hashed once: the server keeps one per key). `ts` is the
    /// timestamp's decimal text as sent, `sig_hex` the signature's 64 hex characters.
    pub fn verify_prepared(
        key: &PreparedKey,
        method_path: &str,
        tenant: &str,
        key_id: &str,
        ts: &str,
        nonce: &str,
        sig_hex: &[u8],
    ) -> bool {
        use subtle_eq::ct_eq;
        let Some(sig) = decode_hex_32(sig_hex) else {
            return false;
        };
        let expected = key.call_mac_text(method_path, tenant, key_id, ts, nonce);
        ct_eq(&expected, &sig)
    }
}

/// Each byte's value as a hex digit: 0-15, or `NOT_HEX`. `UPPER` marks `A`-`F`, which
/// signatures may use and nonces may not.
const NOT_HEX: u8 = 0xff;
const UPPER: u8 = 0x10;
const HEX: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = UPPER | (10 + i as u8);
        i += 1;
    }
    table
};

/// `2 * N` hex characters as `N` bytes (upper-case digits only if `upper_ok`), or `None` for
/// any other length or character. One table lookup per character: the server decodes a
/// signature and a nonce on every signed call.
fn decode_hex<const N: usize>(hex: &[u8], upper_ok: bool) -> Option<[u8; N]> {
    if hex.len() != 2 * N {
        return None;
    }
    // The high bits a digit may not have: any of NOT_HEX's, and UPPER's unless allowed.
    let refused = if upper_ok {
        NOT_HEX & !(UPPER | 0x0f)
    } else {
        NOT_HEX & !0x0f
    };
    let mut out = [0u8; N];
    let mut bad = 0u8;
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let (hi, lo) = (HEX[pair[0] as usize], HEX[pair[1] as usize]);
        bad |= (hi | lo) & refused;
        *byte = (hi << 4) | (lo & 0x0f);
    }
    (bad == 0).then_some(out)
}

/// Hex characters (either case, an even number of them) as bytes, or `None`: what clients
/// decode a value given in hex with (`cubec load`'s `value_hex`).
pub fn decode_hex_bytes(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let refused = NOT_HEX & !(UPPER | 0x0f);
    let mut out = Vec::with_capacity(hex.len() / 2);
    let mut bad = 0u8;
    for pair in hex.chunks_exact(2) {
        let (hi, lo) = (HEX[pair[0] as usize], HEX[pair[1] as usize]);
        bad |= (hi | lo) & refused;
        out.push(((hi & 0x0f) << 4) | (lo & 0x0f));
    }
    (bad == 0).then_some(out)
}

/// 64 hex characters (either case) as 32 bytes, or `None`.
fn decode_hex_32(hex: &[u8]) -> Option<[u8; 32]> {
    decode_hex(hex, true)
}

/// 32 lowercase hex characters (a call nonce) as a number, or `None`.
pub fn parse_nonce(nonce: &[u8]) -> Option<u128> {
    decode_hex(nonce, false).map(u128::from_be_bytes)
}

/// Constant-time equality, so a signature check leaks no timing about where it differs.
mod subtle_eq {
    pub(super) fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
        let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector_secret() -> Secret {
        let mut b = [0u8; 32];
        for (i, v) in b.iter_mut().enumerate() {
            *v = i as u8;
        }
        Secret::from_bytes(b)
    }

    /// The test vector of ARCHITECTURE.md / docs/protocol.md.
    #[test]
    fn call_signature_matches_the_published_test_vector() {
        let call = CallSignature::sign_with_nonce(
            &vector_secret(),
            "/cube.v1.Cells/Write",
            "acme",
            "k1",
            1_700_000_000_000,
            "000102030405060708090a0b0c0d0e0f".into(),
        );
        assert_eq!(
            call.sig,
            "a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3"
        );
        assert!(CallSignature::verify(
            &vector_secret(),
            "/cube.v1.Cells/Write",
            &call
        ));
    }

    #[test]
    fn signature_does_not_verify_for_another_method_key_or_secret() {
        let s = vector_secret();
        let call = CallSignature::sign(&s, "/cube.v1.Cells/Read", "acme", "k1", 5);
        assert!(CallSignature::verify(&s, "/cube.v1.Cells/Read", &call));
        assert!(!CallSignature::verify(&s, "/cube.v1.Cells/Write", &call));
        assert!(!CallSignature::verify(
            &Secret::generate(),
            "/cube.v1.Cells/Read",
            &call
        ));
        let mut other = call.clone();
        other.key_id = "k2".into();
        assert!(!CallSignature::verify(&s, "/cube.v1.Cells/Read", &other));
        let mut bad_hex = call;
        bad_hex.sig = "zz".repeat(32);
        assert!(!CallSignature::verify(&s, "/cube.v1.Cells/Read", &bad_hex));
    }

    #[test]
    fn prepared_key_matches_the_canonical_string_path() {
        let key = PreparedKey::new(&vector_secret());
        let mac = key.call_mac(
            "/cube.v1.Cells/Write",
            "acme",
            "k1",
            1_700_000_000_000,
            "000102030405060708090a0b0c0d0e0f",
        );
        assert_eq!(
            hex::encode(mac),
            "a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3"
        );
    }

    #[test]
    fn the_prepared_check_accepts_the_test_vector_and_nothing_else() {
        let key = PreparedKey::new(&vector_secret());
        let sig = "a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3";
        let check = |path: &str, sig: &str| {
            CallSignature::verify_prepared(
                &key,
                path,
                "acme",
                "k1",
                "1700000000000",
                "000102030405060708090a0b0c0d0e0f",
                sig.as_bytes(),
            )
        };
        assert!(check("/cube.v1.Cells/Write", sig));
        assert!(!check("/cube.v1.Cells/Read", sig));
        assert!(!check("/cube.v1.Cells/Write", &sig.replace('a', "b")));
        assert!(!check("/cube.v1.Cells/Write", &sig[..62]));
    }

    #[test]
    fn hex_signatures_and_nonces_parse_exactly() {
        let sig = "a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3";
        let bytes = hex::decode(sig).unwrap();
        assert_eq!(decode_hex_32(sig.as_bytes()).unwrap().as_slice(), bytes);
        let upper = sig.to_uppercase();
        assert_eq!(decode_hex_32(upper.as_bytes()).unwrap().as_slice(), bytes);
        for bad in [&sig[..62], &format!("{sig}00"), &sig.replace('a', "g"), ""] {
            assert_eq!(decode_hex_32(bad.as_bytes()), None, "{bad:?}");
        }
        let nonce = "000102030405060708090a0b0c0d0eff";
        assert_eq!(
            parse_nonce(nonce.as_bytes()),
            Some(0x0001_0203_0405_0607_0809_0a0b_0c0d_0eff)
        );
        for bad in [
            &nonce[..31],
            &nonce.to_uppercase(),
            &nonce.replace('f', "g"),
        ] {
            assert_eq!(parse_nonce(bad.as_bytes()), None, "{bad:?}");
        }
        // Any even length, either case: a value in hex.
        assert_eq!(decode_hex_bytes(b"00fFa1").unwrap(), [0x00, 0xff, 0xa1]);
        assert_eq!(decode_hex_bytes(upper.as_bytes()).unwrap(), bytes);
        assert_eq!(decode_hex_bytes(b"").unwrap(), Vec::<u8>::new());
        for bad in ["0", "zz", "0g", "00 1"] {
            assert_eq!(decode_hex_bytes(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn nonces_are_32_lowercase_hex() {
        let n = new_call_nonce();
        assert_eq!(n.len(), 32);
        assert!(
            n.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_ne!(n, new_call_nonce());
    }
}
