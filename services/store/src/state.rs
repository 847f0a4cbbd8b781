//! The tenant state machine: plain data and rules, no actors, no I/O.
//!
//! Two views of the same cells:
//! - *applied*: what is durable in the WAL. Reads are served from here only, so a read never
//!   observes a write that could still be lost.
//! - *logical*: applied plus the changes whose WAL records are not durable yet (the overlay).
//!   Writes are checked against it, so two compare-and-set writes in one batch see each other.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::StoreError;
use crate::audit::{AuditEntry, AuditLog};
use crate::walop::{self, Op, WalAudit, WalCoord, WalOp};

/// A cell's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coord {
    pub x: i32,
    pub y: i32,
    pub z: i32,
}

impl From<Coord> for WalCoord {
    fn from(c: Coord) -> WalCoord {
        WalCoord {
            x: c.x,
            y: c.y,
            z: c.z,
        }
    }
}

impl From<&WalCoord> for Coord {
    fn from(c: &WalCoord) -> Coord {
        Coord {
            x: c.x,
            y: c.y,
            z: c.z,
        }
    }
}

/// What a caller asks of a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Write {
        coord: Coord,
        value: Vec<u8>,
        expected_version: Option<u64>,
    },
    Read {
        coord: Coord,
    },
    Delete {
        coord: Coord,
        expected_version: Option<u64>,
    },
    /// Record a security event (grant, revoke, failed authentication...) in the audit trail.
    Event {
        op: String,
        detail: String,
    },
}

/// Who asks, and when: what the audit entry of a change records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `tenant/key_id`, or `operator` for the local admin socket.
    pub principal: String,
    pub ts_ms: i64,
}

impl Command {
    /// Whether the command changes state (and so goes through the WAL).
    pub fn is_mutation(&self) -> bool {
        !matches!(self, Command::Read { .. })
    }
}

/// A cell as a read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    pub value: Vec<u8>,
    pub version: u64,
    pub sealed: bool,
}

/// The answer to a [`Command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Written {
        version: u64,
        seq: u64,
    },
    Read(Option<CellView>),
    Deleted {
        existed: bool,
        seq: u64,
    },
    /// A security event was recorded durably at this WAL seq.
    Recorded {
        seq: u64,
    },
}

impl Reply {
    fn with_seq(self, new_seq: u64) -> Reply {
        match self {
            Reply::Written { version, .. } => Reply::Written {
                version,
                seq: new_seq,
            },
            Reply::Deleted { existed, .. } => Reply::Deleted {
                existed,
                seq: new_seq,
            },
            Reply::Recorded { .. } => Reply::Recorded { seq: new_seq },
            other => other,
        }
    }
}

/// The outcome of checking a command against the logical state.
#[derive(Debug)]
pub enum Prepared {
    /// Answer at once; nothing to log.
    Immediate(Reply),
    /// Log `op`; once it is durable, answer `reply` (its `seq` is filled in by [`Prepared::seal`]).
    Log { op: WalOp, reply: Reply },
}

impl Prepared {
    pub(crate) fn seal(reply: Reply, seq: u64) -> Reply {
        reply.with_seq(seq)
    }
}

#[derive(Debug, Clone)]
struct Cell {
    value: Vec<u8>,
    version: u64,
    sealed: bool,
}

/// A change that is logged but not yet durable.
#[derive(Debug, Clone, Copy)]
struct PendingCell {
    /// Version after the change; 0 = deleted.
    version: u64,
    sealed: bool,
    seq: u64,
}

/// The applied (durable) cells, shared: the actor changes them as batches become durable, and
/// readers on any thread read them directly, without a round trip through the actor (two thread
/// hops per read, measured at ~10% of read throughput on 2 cores, docs/benchmarks.md).
///
/// INVARIANT: only `TenantState::apply` writes here, and the actor answers a write only after
/// applying it, so a read that starts after a write's acknowledgement sees that write.
#[derive(Debug, Clone, Default)]
pub struct AppliedCells(Arc<RwLock<HashMap<Coord, Cell>>>);

impl AppliedCells {
    /// The durable cell at `coord`.
    pub fn read(&self, coord: &Coord) -> Option<CellView> {
        let cells = self.0.read().unwrap_or_else(|p| p.into_inner());
        cells.get(coord).map(|c| CellView {
            value: c.value.clone(),
            version: c.version,
            sealed: c.sealed,
        })
    }

    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn meta(&self, coord: &Coord) -> Option<(u64, bool)> {
        let cells = self.0.read().unwrap_or_else(|p| p.into_inner());
        cells.get(coord).map(|c| (c.version, c.sealed))
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<Coord, Cell>> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// One tenant's cells.
#[derive(Debug)]
pub struct TenantState {
    cells: AppliedCells,
    overlay: HashMap<Coord, PendingCell>,
    applied_seq: u64,
    max_value: usize,
    /// Durable audit entries (shared with readers).
    audit: AuditLog,
    /// Logical head of the audit chain: (next audit seq, hash of the last entry), including
    /// entries not durable yet, so consecutive changes in one batch chain correctly.
    audit_head: (u64, Vec<u8>),
}

impl TenantState {
    pub fn new(max_value: usize, audit_retention: usize) -> TenantState {
        let audit = AuditLog::new(audit_retention);
        let audit_head = audit.head();
        TenantState {
            cells: AppliedCells::default(),
            overlay: HashMap::new(),
            applied_seq: 0,
            max_value,
            audit,
            audit_head,
        }
    }

    /// A handle for reading the durable audit trail from other threads.
    pub fn audit(&self) -> AuditLog {
        self.audit.clone()
    }

    /// Highest WAL sequence number applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    pub fn cell_count(&self) -> usize {
        self.cells.len()
    }

    /// A handle for reading the applied cells from other threads.
    pub fn reader(&self) -> AppliedCells {
        self.cells.clone()
    }

    /// (version, sealed) in the logical view; version 0 = no cell.
    fn logical(&self, coord: &Coord) -> (u64, bool) {
        if let Some(p) = self.overlay.get(coord) {
            return (p.version, p.sealed);
        }
        self.cells.meta(coord).unwrap_or((0, false))
    }

    /// Check `cmd` against the logical state and decide what to log. Every logged change carries
    /// its audit entry, chained to the logical head of the trail.
    pub fn prepare(&self, cmd: Command, caller: &Caller) -> Result<Prepared, StoreError> {
        let (op, audit_op, detail, reply) = match cmd {
            Command::Read { coord } => {
                return Ok(Prepared::Immediate(Reply::Read(self.read(&coord))));
            }
            Command::Write {
                coord,
                value,
                expected_version,
            } => {
                if value.len() > self.max_value {
                    return Err(StoreError::InvalidArgument(format!(
                        "value is {} bytes; the limit is {} bytes",
                        value.len(),
                        self.max_value
                    )));
                }
                let (version, sealed) = self.logical(&coord);
                check_writable(&coord, sealed)?;
                check_version(expected_version, version)?;
                let version = version + 1;
                let detail = format!(
                    "coord=({}, {}, {}) version={version} bytes={}",
                    coord.x,
                    coord.y,
                    coord.z,
                    value.len()
                );
                let op = Op::Put(walop::Put {
                    coord: Some(coord.into()),
                    value,
                    version,
                });
                (
                    op,
                    "write".to_string(),
                    detail,
                    Reply::Written { version, seq: 0 },
                )
            }
            Command::Delete {
                coord,
                expected_version,
            } => {
                let (version, sealed) = self.logical(&coord);
                check_version(expected_version, version)?;
                if version == 0 {
                    return Ok(Prepared::Immediate(Reply::Deleted {
                        existed: false,
                        seq: 0,
                    }));
                }
                check_writable(&coord, sealed)?;
                let detail = format!(
                    "coord=({}, {}, {}) version={version}",
                    coord.x, coord.y, coord.z
                );
                let op = Op::Del(walop::Del {
                    coord: Some(coord.into()),
                });
                (
                    op,
                    "delete".to_string(),
                    detail,
                    Reply::Deleted {
                        existed: true,
                        seq: 0,
                    },
                )
            }
            Command::Event { op, detail } => (
                Op::Event(walop::Event {}),
                op,
                detail,
                Reply::Recorded { seq: 0 },
            ),
        };
        let (audit_seq, prev_hash) = &self.audit_head;
        let hash = cube_auth::audit_hash(
            prev_hash,
            *audit_seq,
            caller.ts_ms,
            &caller.principal,
            &audit_op,
            &detail,
        );
        let audit = WalAudit {
            seq: *audit_seq,
            ts_ms: caller.ts_ms,
            principal: caller.principal.clone(),
            op: audit_op,
            detail,
            prev_hash: prev_hash.clone(),
            hash: hash.to_vec(),
        };
        Ok(Prepared::Log {
            op: WalOp {
                op: Some(op),
                audit: Some(audit),
            },
            reply,
        })
    }

    /// Record that `op` was appended to the WAL as `seq` (not yet durable).
    pub fn note_pending(&mut self, seq: u64, op: &WalOp) {
        if let Some(a) = &op.audit {
            self.audit_head = (a.seq + 1, a.hash.clone());
        }
        let Some((coord, version)) = target(op) else {
            return;
        };
        let sealed = self.logical(&coord).1;
        self.overlay.insert(
            coord,
            PendingCell {
                version,
                sealed,
                seq,
            },
        );
    }

    /// Apply a durable record. Records at or below the applied seq are ignored (idempotent).
    pub fn apply(&mut self, seq: u64, op: WalOp) -> Result<(), String> {
        if seq <= self.applied_seq {
            return Ok(());
        }
        match op.op {
            Some(Op::Put(put)) => {
                let coord = coord_of(put.coord.as_ref())?;
                self.cells.write().insert(
                    coord,
                    Cell {
                        value: put.value,
                        version: put.version,
                        sealed: false,
                    },
                );
                self.clear_overlay(coord, seq);
            }
            Some(Op::Del(del)) => {
                let coord = coord_of(del.coord.as_ref())?;
                self.cells.write().remove(&coord);
                self.clear_overlay(coord, seq);
            }
            Some(Op::Event(_)) => {}
            None => return Err("record holds no known operation".into()),
        }
        if let Some(a) = op.audit {
            // During replay nothing is pending, so the logical head follows the applied one.
            if a.seq >= self.audit_head.0 {
                self.audit_head = (a.seq + 1, a.hash.clone());
            }
            self.audit.push(AuditEntry::from(a));
        }
        self.applied_seq = seq;
        Ok(())
    }

    /// Drop every overlay entry: its records will never become durable (poisoned shard).
    pub fn discard_pending(&mut self) {
        self.overlay.clear();
        self.audit_head = self.audit.head();
    }

    fn clear_overlay(&mut self, coord: Coord, seq: u64) {
        if self.overlay.get(&coord).is_some_and(|p| p.seq <= seq) {
            self.overlay.remove(&coord);
        }
    }

    /// The durable cell at `coord`.
    pub fn read(&self, coord: &Coord) -> Option<CellView> {
        self.cells.read(coord)
    }
}

fn target(op: &WalOp) -> Option<(Coord, u64)> {
    match &op.op {
        Some(Op::Put(p)) => Some((Coord::from(p.coord.as_ref()?), p.version)),
        Some(Op::Del(d)) => Some((Coord::from(d.coord.as_ref()?), 0)),
        Some(Op::Event(_)) | None => None,
    }
}

fn coord_of(c: Option<&WalCoord>) -> Result<Coord, String> {
    c.map(Coord::from)
        .ok_or_else(|| "record has no coordinate".to_string())
}

fn check_writable(coord: &Coord, sealed: bool) -> Result<(), StoreError> {
    if sealed {
        return Err(StoreError::FailedPrecondition(format!(
            "cell ({}, {}, {}) is sealed and cannot change",
            coord.x, coord.y, coord.z
        )));
    }
    Ok(())
}

fn check_version(expected: Option<u64>, actual: u64) -> Result<(), StoreError> {
    match expected {
        Some(e) if e != actual => Err(StoreError::FailedPrecondition(format!(
            "version mismatch: expected {e}, the cell is at version {actual}{}",
            if actual == 0 { " (no cell)" } else { "" }
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Caller {
        Caller {
            principal: "t/k".into(),
            ts_ms: 7,
        }
    }

    const C: Coord = Coord {
        x: -1,
        y: 0,
        z: i32::MAX,
    };

    /// Prepare, "log" at `seq`, and apply as if the batch became durable.
    fn run(s: &mut TenantState, seq: &mut u64, cmd: Command) -> Result<Reply, StoreError> {
        match s.prepare(cmd, &who())? {
            Prepared::Immediate(r) => Ok(r),
            Prepared::Log { op, reply } => {
                *seq += 1;
                s.note_pending(*seq, &op);
                s.apply(*seq, op).unwrap();
                Ok(Prepared::seal(reply, *seq))
            }
        }
    }

    #[test]
    fn write_read_delete_with_versions() {
        let mut s = TenantState::new(16, 100);
        let mut seq = 0;
        assert_eq!(
            run(&mut s, &mut seq, Command::Read { coord: C }),
            Ok(Reply::Read(None))
        );
        let w = Command::Write {
            coord: C,
            value: b"a".to_vec(),
            expected_version: None,
        };
        assert_eq!(
            run(&mut s, &mut seq, w.clone()),
            Ok(Reply::Written { version: 1, seq: 1 })
        );
        assert_eq!(
            run(&mut s, &mut seq, w),
            Ok(Reply::Written { version: 2, seq: 2 })
        );
        assert_eq!(
            run(&mut s, &mut seq, Command::Read { coord: C }),
            Ok(Reply::Read(Some(CellView {
                value: b"a".to_vec(),
                version: 2,
                sealed: false
            })))
        );
        assert_eq!(
            run(
                &mut s,
                &mut seq,
                Command::Delete {
                    coord: C,
                    expected_version: None
                }
            ),
            Ok(Reply::Deleted {
                existed: true,
                seq: 3
            })
        );
        assert_eq!(
            run(
                &mut s,
                &mut seq,
                Command::Delete {
                    coord: C,
                    expected_version: None
                }
            ),
            Ok(Reply::Deleted {
                existed: false,
                seq: 0
            })
        );
    }

    #[test]
    fn compare_and_set_checks_the_logical_version() {
        let mut s = TenantState::new(16, 100);
        let mut seq = 0;
        let cas = |v| Command::Write {
            coord: C,
            value: vec![],
            expected_version: Some(v),
        };
        assert!(
            matches!(run(&mut s, &mut seq, cas(1)), Err(StoreError::FailedPrecondition(m)) if m.contains("expected 1"))
        );
        assert_eq!(
            run(&mut s, &mut seq, cas(0)),
            Ok(Reply::Written { version: 1, seq: 1 })
        );
        // A second CAS prepared while the first is only pending must see version 1, not 0.
        let Prepared::Log { op, .. } = s.prepare(cas(1), &who()).unwrap() else {
            panic!()
        };
        s.note_pending(2, &op);
        assert!(matches!(
            s.prepare(cas(1), &who()),
            Err(StoreError::FailedPrecondition(_))
        ));
        assert!(s.prepare(cas(2), &who()).is_ok());
        // ...while reads still see only the durable version.
        assert_eq!(s.read(&C).unwrap().version, 1);
        s.apply(2, op).unwrap();
        assert_eq!(s.read(&C).unwrap().version, 2);
        assert!(matches!(
            s.prepare(
                Command::Delete {
                    coord: C,
                    expected_version: Some(9)
                },
                &who()
            ),
            Err(StoreError::FailedPrecondition(_))
        ));
    }

    #[test]
    fn changes_in_one_batch_chain_their_audit_entries() {
        let mut s = TenantState::new(16, 100);
        let w = |v: &[u8]| Command::Write {
            coord: C,
            value: v.to_vec(),
            expected_version: None,
        };
        // Two changes prepared before either is durable, then an event.
        let Prepared::Log { op: a, .. } = s.prepare(w(b"a"), &who()).unwrap() else {
            panic!()
        };
        s.note_pending(1, &a);
        let Prepared::Log { op: b, .. } = s.prepare(w(b"b"), &who()).unwrap() else {
            panic!()
        };
        s.note_pending(2, &b);
        let ev = Command::Event {
            op: "grant".into(),
            detail: "key=k2".into(),
        };
        let Prepared::Log { op: e, .. } = s.prepare(ev, &who()).unwrap() else {
            panic!()
        };
        s.note_pending(3, &e);
        for (seq, op) in [(1, a), (2, b), (3, e)] {
            s.apply(seq, op).unwrap();
        }
        let trail = s.audit().page(0, 10);
        assert_eq!(
            trail.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(trail[0].prev_hash, cube_auth::AUDIT_GENESIS.to_vec());
        for pair in trail.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash);
        }
        for e in &trail {
            assert_eq!(
                e.hash,
                cube_auth::audit_hash(&e.prev_hash, e.seq, e.ts_ms, &e.principal, &e.op, &e.detail)
                    .to_vec()
            );
        }
        assert_eq!(
            (trail[2].op.as_str(), trail[2].detail.as_str()),
            ("grant", "key=k2")
        );
        assert_eq!(s.audit().page(2, 1)[0].seq, 2);
    }

    #[test]
    fn oversized_value_is_invalid_argument() {
        let s = TenantState::new(4, 100);
        let r = s.prepare(
            Command::Write {
                coord: C,
                value: vec![0; 5],
                expected_version: None,
            },
            &who(),
        );
        assert!(matches!(r, Err(StoreError::InvalidArgument(m)) if m.contains("limit is 4 bytes")));
    }

    #[test]
    fn apply_is_idempotent_for_old_records() {
        let mut s = TenantState::new(16, 100);
        let op = |v: &[u8]| WalOp {
            op: Some(Op::Put(walop::Put {
                coord: Some(C.into()),
                value: v.to_vec(),
                version: 1,
            })),
            audit: None,
        };
        s.apply(5, op(b"new")).unwrap();
        s.apply(4, op(b"old")).unwrap();
        assert_eq!(s.read(&C).unwrap().value, b"new");
        assert!(
            s.apply(
                6,
                WalOp {
                    op: None,
                    audit: None
                }
            )
            .is_err()
        );
    }
}
