//! An entry of a tenant's audit trail. Entries are written in the same WAL record as the change
//! they record and applied to the tenant's state store in the same batch as it; `Tenant.Audit`
//! pages through them with [`crate::StateReader::audit_page`] on the caller's thread, so reading
//! the trail never blocks writers.
//!
//! Retention keeps the newest entries; the oldest retained entry's `prev_hash` is the anchor a
//! verifier starts from.

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
