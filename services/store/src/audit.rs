//! An entry of a tenant's audit trail. Entries are written in the same WAL record as the change
//! they record and applied to the tenant's state store in the same batch as it; `Tenant.Audit`
//! pages through them with [`crate::StateReader::audit_page_encoded`] on the caller's thread, so
//! reading the trail never blocks writers.
//!
//! Retention keeps the newest entries; the oldest retained entry's `prev_hash` is the anchor a
//! verifier starts from.

use prost::Message;
use prost::bytes::Bytes;

use crate::walop::WalAudit;

/// One entry of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub seq: u64,
    pub ts_ms: i64,
    pub principal: String,
    pub op: String,
    pub detail: String,
    pub prev_hash: Vec<u8>,
    pub hash: Vec<u8>,
}

impl From<WalAudit> for AuditEntry {
    fn from(a: WalAudit) -> AuditEntry {
        AuditEntry {
            seq: a.seq,
            ts_ms: a.ts_ms,
            principal: a.principal,
            op: a.op,
            detail: a.detail,
            prev_hash: a.prev_hash,
            hash: a.hash,
        }
    }
}

/// One entry of the audit trail as stored: its protobuf encoding, which is also the encoding of
/// `cube.v1.AuditEntry` (`WalAudit` has the same fields under the same tags), so `Tenant.Audit`
/// sends a page without decoding and encoding every entry again (docs/benchmarks.md, "Audit
/// pages sent as stored"). Only the seq is checked when a page is read: an entry damaged on disk
/// in a way the state store's block checksums miss reaches the client, whose decoder refuses it,
/// instead of failing the page on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedAuditEntry {
    pub seq: u64,
    pub bytes: Bytes,
}

impl EncodedAuditEntry {
    /// The entry's fields.
    pub fn decode(&self) -> Result<AuditEntry, prost::DecodeError> {
        WalAudit::decode(self.bytes.as_ref()).map(AuditEntry::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_api::v1;

    #[test]
    fn a_stored_entry_is_the_encoding_of_a_cube_v1_audit_entry() {
        let stored = WalAudit {
            seq: 300,
            ts_ms: -5,
            principal: "key-1".into(),
            op: "write".into(),
            detail: "(1,2,3) v7".into(),
            prev_hash: vec![1; 32],
            hash: vec![2; 32],
        };
        let bytes = Bytes::from(stored.encode_to_vec());
        let entry = EncodedAuditEntry {
            seq: 300,
            bytes: bytes.clone(),
        };
        assert_eq!(entry.decode().unwrap(), AuditEntry::from(stored.clone()));
        let sent = v1::AuditEntry::decode(bytes.as_ref()).unwrap();
        // Byte for byte: what a client is sent is what it would be sent after a decode.
        assert_eq!(sent.encode_to_vec(), stored.encode_to_vec());
        // Every field of each, named without `..`: a field added to either message does not
        // compile here until it is added to the other (and to this test).
        let v1::AuditEntry {
            seq,
            ts_ms,
            principal,
            op,
            detail,
            prev_hash,
            hash,
        } = sent;
        let WalAudit {
            seq: s_seq,
            ts_ms: s_ts_ms,
            principal: s_principal,
            op: s_op,
            detail: s_detail,
            prev_hash: s_prev_hash,
            hash: s_hash,
        } = stored;
        assert_eq!(
            (seq, ts_ms, principal, op, detail, prev_hash, hash),
            (
                s_seq,
                s_ts_ms,
                s_principal,
                s_op,
                s_detail,
                s_prev_hash,
                s_hash
            )
        );
    }
}
