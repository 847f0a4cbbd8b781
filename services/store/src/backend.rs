//! Where a tenant's applied state lives: a small ordered key-value interface and its sled
//! implementation.
//!
//! sled is beta and unmaintained upstream, so the rest of the store sees only
//! [`StateBackend`]: ordered keys, atomic batches, range scans and an explicit flush (the
//! checkpoint). Replacing sled means implementing these five methods. [`MemBackend`] is the
//! second implementation, used by the state machine's tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::RwLock;

/// A storage failure. The text is for the server log only; clients see a generic message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// One change in an atomic batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

/// Pairs in ascending key order.
pub type RangeIter<'a> = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), BackendError>> + 'a>;

/// An ordered key-value store with atomic batches and an explicit durability point.
///
/// Contract the recovery design relies on: after a crash the store comes back as of some prefix
/// of the applied batches (each batch all or nothing), and everything applied before a
/// successful [`StateBackend::flush`] started is in that prefix.
pub trait StateBackend: Send + Sync + std::fmt::Debug {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError>;
    /// Pairs with `start <= key < end`, ascending.
    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_>;
    /// The pair with the greatest key below `key`.
    #[allow(clippy::type_complexity)]
    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError>;
    /// Apply every op or none.
    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError>;
    /// Make everything applied so far durable.
    fn flush(&self) -> Result<(), BackendError>;
    /// Bytes on disk (approximate; for stats).
    fn size_on_disk(&self) -> u64;
}

/// sled's segment (and write-buffer) size. NOTE: fixed when a database is created; sled refuses
/// to open a database with a different one, so changing it needs a migration.
const SEGMENT_BYTES: usize = 1 << 16;

/// A tenant's state in its own sled database.
#[derive(Debug)]
pub struct SledBackend {
    db: sled::Db,
}

impl SledBackend {
    /// Open (or create) the database in `dir` with a page cache of `cache_bytes`. sled's own
    /// periodic flush is off: data is made durable by the WAL first and by checkpoints later, so
    /// background flushes would only add I/O.
    pub fn open(dir: &Path, cache_bytes: u64) -> Result<SledBackend, BackendError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None)
            // sled's write buffer, allocated per open database: its 512 KiB default dominated
            // the memory of many small open tenants (docs/benchmarks.md).
            .segment_size(SEGMENT_BYTES)
            .open()
            .map_err(|e| BackendError(format!("opening state database: {e}")))?;
        Ok(SledBackend { db })
    }

    /// Whether an open failed because another handle still holds the database's lock (a
    /// passivated tenant whose last reader has not finished yet).
    pub fn is_locked(e: &BackendError) -> bool {
        e.0.contains("WouldBlock") || e.0.contains("lock") || e.0.contains("temporarily")
    }
}

fn sled_err(e: sled::Error) -> BackendError {
    BackendError(e.to_string())
}

impl StateBackend for SledBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.db.get(key).map_err(sled_err)?.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        Box::new(
            self.db
                .range(start.to_vec()..end.to_vec())
                .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(sled_err)),
        )
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        Ok(self
            .db
            .get_lt(key)
            .map_err(sled_err)?
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
        let mut b = sled::Batch::default();
        for op in batch {
            match op {
                BatchOp::Put(k, v) => b.insert(k, v),
                BatchOp::Remove(k) => b.remove(k),
            }
        }
        self.db.apply_batch(b).map_err(sled_err)
    }

    fn flush(&self) -> Result<(), BackendError> {
        self.db.flush().map(|_| ()).map_err(sled_err)
    }

    fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// An in-memory backend: the same contract with nothing on disk (flush is a no-op). For tests
/// of the state machine, which would otherwise spend their time in sled.
#[derive(Debug, Default)]
pub struct MemBackend {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl StateBackend for MemBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        Ok(map.get(key).cloned())
    }

    fn range(&self, start: &[u8], end: &[u8]) -> RangeIter<'_> {
        // Copied out so no lock is held while the caller iterates.
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let items: Vec<_> = map
            .range(start.to_vec()..end.to_vec())
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        Box::new(items.into_iter())
    }

    fn get_lt(&self, key: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, BackendError> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        Ok(map
            .range(..key.to_vec())
            .next_back()
            .map(|(k, v)| (k.clone(), v.clone())))
    }

    fn apply(&self, batch: Vec<BatchOp>) -> Result<(), BackendError> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        for op in batch {
            match op {
                BatchOp::Put(k, v) => {
                    map.insert(k, v);
                }
                BatchOp::Remove(k) => {
                    map.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn size_on_disk(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(b: &dyn StateBackend) {
        b.apply(vec![
            BatchOp::Put(b"a1".to_vec(), b"x".to_vec()),
            BatchOp::Put(b"a2".to_vec(), b"y".to_vec()),
            BatchOp::Put(b"b1".to_vec(), b"z".to_vec()),
        ])
        .unwrap();
        b.apply(vec![BatchOp::Remove(b"a1".to_vec())]).unwrap();
        assert_eq!(b.get(b"a1").unwrap(), None);
        assert_eq!(b.get(b"a2").unwrap(), Some(b"y".to_vec()));
        let keys: Vec<_> = b.range(b"a", b"b").map(|r| r.unwrap().0).collect();
        assert_eq!(keys, vec![b"a2".to_vec()]);
        let all: Vec<_> = b.range(b"", b"\xff").map(|r| r.unwrap().0).collect();
        assert_eq!(all, vec![b"a2".to_vec(), b"b1".to_vec()]);
        assert_eq!(b.get_lt(b"b1").unwrap().unwrap().0, b"a2".to_vec());
        assert_eq!(b.get_lt(b"a2").unwrap(), None);
        b.flush().unwrap();
    }

    #[test]
    fn sled_and_memory_backends_agree() {
        exercise(&MemBackend::default());
        let dir = tempfile::tempdir().unwrap();
        exercise(&SledBackend::open(dir.path(), 1 << 20).unwrap());
    }

    #[test]
    fn sled_state_survives_reopen_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        {
            let b = SledBackend::open(dir.path(), 1 << 20).unwrap();
            b.apply(vec![BatchOp::Put(b"k".to_vec(), b"v".to_vec())])
                .unwrap();
            b.flush().unwrap();
        }
        let b = SledBackend::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(b.get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
