//! The audit trail's hash chain, shared by the server (which writes it) and clients (which
//! verify it):
//!
//! ```text
//! hash = SHA-256(prev_hash || "CUBE1-AUDIT\n" + seq + "\n" + ts_ms + "\n" + principal + "\n" + op + "\n" + detail)
//! ```
//!
//! The first entry of a tenant chains from 32 zero bytes ([`AUDIT_GENESIS`]).

use sha2::{Digest, Sha256};

/// `prev_hash` of a tenant's first audit entry.
pub const AUDIT_GENESIS: [u8; 32] = [0; 32];

/// The hash of one audit entry given its predecessor's hash.
pub fn audit_hash(
    prev_hash: &[u8],
    seq: u64,
    ts_ms: i64,
    principal: &str,
    op: &str,
    detail: &str,
) -> [u8; 32] {
    // Fed in parts, without formatting a string per change: the same bytes as
    // `format!("CUBE1-AUDIT\n{seq}\n{ts_ms}\n{principal}\n{op}\n{detail}")` (the test below
    // holds them equal).
    let (mut seq_text, mut ts_text) = (itoa::Buffer::new(), itoa::Buffer::new());
    let mut h = Sha256::new();
    for part in [
        prev_hash,
        b"CUBE1-AUDIT\n",
        seq_text.format(seq).as_bytes(),
        b"\n",
        ts_text.format(ts_ms).as_bytes(),
        b"\n",
        principal.as_bytes(),
        b"\n",
        op.as_bytes(),
        b"\n",
        detail.as_bytes(),
    ] {
        h.update(part);
    }
    h.finalize().into()
}

/// One entry as a verifier sees it.
#[derive(Debug, Clone, Copy)]
pub struct AuditLink<'a> {
    pub seq: u64,
    pub ts_ms: i64,
    pub principal: &'a str,
    pub op: &'a str,
    pub detail: &'a str,
    pub prev_hash: &'a [u8],
    pub hash: &'a [u8],
}

/// Recompute a run of consecutive entries (oldest first). `Ok(count)`, or the first broken link
/// as `Err((seq, reason))`. A run starting at seq 1 must start from [`AUDIT_GENESIS`]; a later
/// start (older entries dropped by retention) is anchored at its own `prev_hash`.
pub fn verify_audit_chain<'a>(
    links: impl IntoIterator<Item = AuditLink<'a>>,
) -> Result<usize, (u64, String)> {
    let mut prev: Option<AuditLink<'a>> = None;
    let mut count = 0;
    for e in links {
        match prev {
            None if e.seq == 1 && e.prev_hash != AUDIT_GENESIS => {
                return Err((
                    e.seq,
                    "the first entry does not start from the genesis hash".into(),
                ));
            }
            Some(p) if p.seq.checked_add(1) != Some(e.seq) => {
                return Err((e.seq, format!("follows seq {} (entries missing)", p.seq)));
            }
            Some(p) if e.prev_hash != p.hash => {
                return Err((e.seq, "prev_hash is not the previous entry's hash".into()));
            }
            _ => {}
        }
        // Both are SHA-256 digests: `prev_hash` enters the hash without a length, so a longer
        // one (in a run's first entry, taken on the server's word) could absorb the start of
        // the canonical string.
        if e.prev_hash.len() != 32 || e.hash.len() != 32 {
            return Err((e.seq, "a hash that is not 32 bytes (malformed)".into()));
        }
        // The canonical string separates fields by line breaks: only the last, `detail`, may
        // hold one (the server writes none into the others), else an entry's fields could be
        // re-split without changing its hash.
        if e.principal.contains('\n') || e.op.contains('\n') {
            return Err((
                e.seq,
                "a line break in its principal or op (altered: the fields cannot be told apart)"
                    .into(),
            ));
        }
        if e.hash != audit_hash(e.prev_hash, e.seq, e.ts_ms, e.principal, e.op, e.detail) {
            return Err((e.seq, "the entry does not match its hash (altered)".into()));
        }
        prev = Some(e);
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/protocol.md's published test vectors, byte for byte.
    #[test]
    fn the_documented_test_vectors_hold() {
        let h1 = audit_hash(
            &AUDIT_GENESIS,
            1,
            1_700_000_000_000,
            "acme/k1",
            "write",
            "coord=(1, -2, 3) version=1 bytes=5",
        );
        assert_eq!(
            hex::encode(h1),
            "b10982550e8b0430d27a8ec6b4cf5ae0735c3e8a1d4a801d44177511c6f54da6"
        );
        let h2 = audit_hash(
            &h1,
            2,
            1_700_000_000_001,
            "operator",
            "key.create",
            "key=k2",
        );
        assert_eq!(
            hex::encode(h2),
            "21ffbde86c14b71bad3404f36086bc541b410dea9e08f5f0f7b1a6e03c5a3b31"
        );
    }

    /// A link past `u64::MAX` does not wrap around to seq 0 (a panic in a debug build, a chain
    /// accepted in a release one), and hashes are 32 bytes: a first entry's `prev_hash` of
    /// another length, with a hash made over it, was accepted.
    #[test]
    fn seqs_do_not_wrap_and_hashes_are_32_bytes() {
        let link = |seq: u64, prev: &[u8]| {
            let hash = audit_hash(prev, seq, 1, "t/k", "write", "x");
            (seq, prev.to_vec(), hash.to_vec())
        };
        let (s1, p1, h1) = link(u64::MAX, &[7u8; 32]);
        let (s2, p2, h2) = link(0, &h1);
        fn as_link((seq, prev, hash): &(u64, Vec<u8>, Vec<u8>)) -> AuditLink<'_> {
            AuditLink {
                seq: *seq,
                ts_ms: 1,
                principal: "t/k",
                op: "write",
                detail: "x",
                prev_hash: prev,
                hash,
            }
        }
        let (a, b) = ((s1, p1, h1.clone()), (s2, p2, h2));
        assert_eq!(
            verify_audit_chain([as_link(&a), as_link(&b)]).map_err(|e| e.0),
            Err(0)
        );
        let short = link(2, &[7u8; 31]);
        let err = verify_audit_chain([as_link(&short)]).unwrap_err();
        assert!(err.1.contains("not 32 bytes"), "{err:?}");
        assert_eq!(verify_audit_chain([as_link(&link(2, &[7u8; 32]))]), Ok(1));
    }

    #[test]
    fn the_hash_covers_the_previous_hash_and_the_documented_string() {
        // docs/protocol.md: hash = SHA-256(prev_hash ‖ "CUBE1-AUDIT\n" seq "\n" ts_ms "\n"
        // principal "\n" op "\n" detail).
        for (prev, seq, ts_ms, principal, op, detail) in [
            (
                AUDIT_GENESIS.to_vec(),
                1,
                1_700_000_000_000,
                "acme/k1",
                "write",
                "coord=(1, 2, 3)",
            ),
            (vec![7u8; 32], u64::MAX, -5, "", "", ""),
            (
                vec![],
                42,
                0,
                "t/k",
                "grant",
                "key=k2 capabilities=[\"READ\"]",
            ),
        ] {
            let text = format!("CUBE1-AUDIT\n{seq}\n{ts_ms}\n{principal}\n{op}\n{detail}");
            let expected: [u8; 32] = Sha256::new()
                .chain_update(&prev)
                .chain_update(text.as_bytes())
                .finalize()
                .into();
            assert_eq!(
                audit_hash(&prev, seq, ts_ms, principal, op, detail),
                expected,
                "{text:?}"
            );
        }
    }

    #[test]
    fn verification_names_the_first_broken_link() {
        let mut entries = Vec::new();
        let mut prev = AUDIT_GENESIS.to_vec();
        for seq in 1..=5u64 {
            let detail = format!("n={seq}");
            let hash = audit_hash(&prev, seq, 10, "t/k", "write", &detail).to_vec();
            entries.push((seq, detail, prev.clone(), hash.clone()));
            prev = hash;
        }
        let links =
            |v: &[(u64, String, Vec<u8>, Vec<u8>)]| -> Vec<(u64, String, Vec<u8>, Vec<u8>)> {
                v.to_vec()
            };
        let check = |v: &[(u64, String, Vec<u8>, Vec<u8>)]| {
            verify_audit_chain(v.iter().map(|(seq, d, p, h)| AuditLink {
                seq: *seq,
                ts_ms: 10,
                principal: "t/k",
                op: "write",
                detail: d,
                prev_hash: p,
                hash: h,
            }))
        };
        assert_eq!(check(&entries), Ok(5));
        assert_eq!(
            check(&entries[2..]),
            Ok(3),
            "a retained suffix verifies from its own anchor"
        );
        let mut altered = links(&entries);
        altered[2].1 = "n=99".into();
        assert_eq!(check(&altered).unwrap_err().0, 3);
        let mut gap = links(&entries);
        gap.remove(3);
        assert_eq!(check(&gap).unwrap_err().0, 5);
    }

    /// The fields are joined by line breaks, so an entry re-split across `op` and `detail` keeps
    /// its hash: verification refuses a line break in any field but the last.
    #[test]
    fn an_entry_re_split_at_a_line_break_is_refused() {
        let (principal, op, detail) = ("unauthenticated", "auth.failed\na", "b");
        let hash = audit_hash(&AUDIT_GENESIS, 1, 5, principal, op, detail);
        assert_eq!(
            hash,
            audit_hash(&AUDIT_GENESIS, 1, 5, principal, "auth.failed", "a\nb"),
            "the canonical string cannot tell them apart"
        );
        let link = |op, detail| AuditLink {
            seq: 1,
            ts_ms: 5,
            principal,
            op,
            detail,
            prev_hash: &AUDIT_GENESIS,
            hash: &hash,
        };
        assert_eq!(verify_audit_chain([link("auth.failed", "a\nb")]), Ok(1));
        let (seq, why) = verify_audit_chain([link(op, detail)]).unwrap_err();
        assert_eq!(seq, 1);
        assert!(why.contains("line break"), "{why}");
    }

    #[test]
    fn the_chain_depends_on_every_field_and_the_predecessor() {
        let a = audit_hash(&AUDIT_GENESIS, 1, 5, "t/k", "write", "coord=(1, 2, 3)");
        assert_eq!(
            a,
            audit_hash(&AUDIT_GENESIS, 1, 5, "t/k", "write", "coord=(1, 2, 3)")
        );
        assert_ne!(
            a,
            audit_hash(&AUDIT_GENESIS, 2, 5, "t/k", "write", "coord=(1, 2, 3)")
        );
        assert_ne!(
            a,
            audit_hash(&AUDIT_GENESIS, 1, 5, "t/k", "write", "coord=(1, 2, 4)")
        );
        assert_ne!(
            a,
            audit_hash(&[1; 32], 1, 5, "t/k", "write", "coord=(1, 2, 3)")
        );
    }
}
