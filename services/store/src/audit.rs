//! A tenant's audit trail as applied (durable) entries, shared like the applied cells: the actor
//! appends as records become durable, and `Tenant.Audit` readers page through it on their own
//! thread, so reading the trail never blocks writers.
//!
//! Retention keeps the newest `retention` entries; the oldest retained entry's `prev_hash` is the
//! anchor a verifier starts from.

use std::collections::VecDeque;
use std::sync::{Arc, RwLock};

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

#[derive(Debug)]
struct Inner {
    entries: VecDeque<AuditEntry>,
    retention: usize,
}

/// The applied audit entries of one tenant.
#[derive(Debug, Clone)]
pub struct AuditLog(Arc<RwLock<Inner>>);

impl AuditLog {
    pub fn new(retention: usize) -> AuditLog {
        AuditLog(Arc::new(RwLock::new(Inner {
            entries: VecDeque::new(),
            retention: retention.max(1),
        })))
    }

    /// Up to `limit` entries with `seq >= from_seq`, in order.
    pub fn page(&self, from_seq: u64, limit: usize) -> Vec<AuditEntry> {
        let inner = self.0.read().unwrap_or_else(|p| p.into_inner());
        let first = inner.entries.front().map_or(0, |e| e.seq);
        let skip = from_seq.saturating_sub(first) as usize;
        inner
            .entries
            .iter()
            .skip(skip)
            .take(limit)
            .cloned()
            .collect()
    }

    /// (next seq, hash of the last entry) of the applied trail.
    pub(crate) fn head(&self) -> (u64, Vec<u8>) {
        let inner = self.0.read().unwrap_or_else(|p| p.into_inner());
        inner
            .entries
            .back()
            .map_or((1, cube_auth::AUDIT_GENESIS.to_vec()), |e| {
                (e.seq + 1, e.hash.clone())
            })
    }

    pub(crate) fn push(&self, entry: AuditEntry) {
        let mut inner = self.0.write().unwrap_or_else(|p| p.into_inner());
        inner.entries.push_back(entry);
        while inner.entries.len() > inner.retention {
            inner.entries.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
