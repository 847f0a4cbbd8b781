//! A tenant's state machine joined to its WAL shard, and the writes waiting for durability.
//!
//! Plain Rust with no actor or runtime types, so it is unit-tested directly. `T` is whatever the
//! shell uses to answer a caller later (a oneshot sender in the actor); the core only hands it
//! back with the result once the caller's record is durable.

use std::collections::VecDeque;
use std::path::Path;

use cube_wal::{DurableEvent, DurableNotify, RecoveryReport, WalError, WalOptions, WalShard};
use prost::Message;

use crate::StoreError;
use crate::state::{Caller, Command, Prepared, Reply, TenantState};
use crate::walop::WalOp;

/// An answer for a caller: its token and the result.
pub type Answer<T> = (T, Result<Reply, StoreError>);

struct Waiting<T> {
    seq: u64,
    op: WalOp,
    reply: Reply,
    token: T,
}

/// One tenant: state, WAL shard, and the callers whose writes are not durable yet.
pub struct TenantCore<T> {
    tenant: String,
    state: TenantState,
    /// `None` once closed for shutdown.
    wal: Option<WalShard>,
    // INVARIANT: ordered by seq, all above `state.applied_seq()`.
    waiting: VecDeque<Waiting<T>>,
    poisoned: bool,
    /// Reused encoding buffer (one allocation per core, not per write).
    scratch: Vec<u8>,
}

impl<T> std::fmt::Debug for TenantCore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCore")
            .field("tenant", &self.tenant)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl<T> TenantCore<T> {
    /// Recover the tenant's WAL in `dir` into a fresh state and start its syncer.
    pub fn open(
        tenant: &str,
        dir: &Path,
        wal_options: WalOptions,
        max_value: usize,
        audit_retention: usize,
        notify: Option<DurableNotify>,
    ) -> Result<(TenantCore<T>, RecoveryReport), StoreError> {
        let started = std::time::Instant::now();
        let mut state = TenantState::new(max_value, audit_retention);
        let opened = WalShard::open(
            dir,
            wal_options,
            0,
            &mut |seq, payload| {
                let op = WalOp::decode(payload).map_err(|e| format!("undecodable record: {e}"))?;
                state.apply(seq, op)
            },
            notify,
        );
        let (wal, report) = opened.map_err(|e| open_error(tenant, &e))?;
        cube_metrics::RECOVERY_SECONDS.observe(started.elapsed().as_secs_f64());
        cube_metrics::RECOVERY_TRUNCATED_BYTES.inc_by(report.truncated_bytes);
        tracing::info!(
            tenant,
            records = report.records_replayed,
            last_seq = report.last_seq,
            truncated_bytes = report.truncated_bytes,
            "tenant recovered"
        );
        let core = TenantCore {
            tenant: tenant.to_string(),
            state,
            wal: Some(wal),
            waiting: VecDeque::new(),
            poisoned: false,
            scratch: Vec::with_capacity(256),
        };
        Ok((core, report))
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    pub fn state(&self) -> &TenantState {
        &self.state
    }

    /// Callers waiting for their write to become durable.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Handle a command. Returns an answer now, or `None` when the answer waits for durability
    /// (it then comes out of [`TenantCore::on_durable`]).
    pub fn handle(&mut self, cmd: Command, caller: &Caller, token: T) -> Option<Answer<T>> {
        if cmd.is_mutation()
            && let Err(e) = self.writable()
        {
            return Some((token, Err(e)));
        }
        let (op, reply) = match self.state.prepare(cmd, caller) {
            Err(e) => return Some((token, Err(e))),
            Ok(Prepared::Immediate(reply)) => return Some((token, Ok(reply))),
            Ok(Prepared::Log { op, reply }) => (op, reply),
        };
        self.scratch.clear();
        // NOTE: encoding into a Vec cannot fail (prost only fails on a too-small fixed buffer).
        let _ = op.encode(&mut self.scratch);
        let Some(wal) = &self.wal else {
            return Some((token, Err(shutting_down())));
        };
        match wal.append(&self.scratch) {
            Ok(seq) => {
                self.state.note_pending(seq, &op);
                self.waiting.push_back(Waiting {
                    seq,
                    op,
                    reply,
                    token,
                });
                None
            }
            Err(e) => Some((token, Err(self.append_error(&e)))),
        }
    }

    /// Apply what became durable and answer its callers, or fail every waiting caller if the
    /// shard was poisoned.
    pub fn on_durable(&mut self, event: DurableEvent) -> Vec<Answer<T>> {
        match event {
            DurableEvent::Durable(upto) => {
                let mut answers = Vec::new();
                while self.waiting.front().is_some_and(|w| w.seq <= upto) {
                    let Some(w) = self.waiting.pop_front() else {
                        break;
                    };
                    if let Err(detail) = self.state.apply(w.seq, w.op) {
                        // Cannot happen for ops built by `prepare`; refuse rather than guess.
                        tracing::error!(tenant = %self.tenant, seq = w.seq, %detail, "apply failed");
                        answers.push((
                            w.token,
                            Err(StoreError::Unavailable(
                                "internal error applying a write".into(),
                            )),
                        ));
                        continue;
                    }
                    answers.push((w.token, Ok(Prepared::seal(w.reply, w.seq))));
                }
                answers
            }
            DurableEvent::Poisoned => {
                if !self.poisoned {
                    cube_metrics::TENANTS_UNAVAILABLE.inc();
                }
                self.poisoned = true;
                self.state.discard_pending();
                let msg = self.poisoned_message();
                self.waiting
                    .drain(..)
                    .map(|w| (w.token, Err(StoreError::Unavailable(msg.clone()))))
                    .collect()
            }
        }
    }

    /// Take the WAL shard out for a final sync on another thread; later writes are refused.
    pub fn take_wal(&mut self) -> Option<WalShard> {
        self.wal.take()
    }

    fn writable(&self) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Unavailable(self.poisoned_message()));
        }
        if self.wal.is_none() {
            return Err(shutting_down());
        }
        Ok(())
    }

    fn poisoned_message(&self) -> String {
        format!(
            "tenant '{}' is unavailable: a write to its log failed, so it accepts no writes until \
             the server restarts; acknowledged data is safe",
            self.tenant
        )
    }

    fn append_error(&mut self, e: &WalError) -> StoreError {
        match e {
            WalError::RecordTooLarge { max, .. } => StoreError::InvalidArgument(format!(
                "the encoded change exceeds the {max}-byte record limit"
            )),
            WalError::Closed => shutting_down(),
            _ => {
                self.poisoned = true;
                StoreError::Unavailable(self.poisoned_message())
            }
        }
    }
}

fn shutting_down() -> StoreError {
    StoreError::Unavailable(
        "the server is shutting down; retry against the restarted server".into(),
    )
}

/// Map a failure to open a tenant's WAL to a message an operator can act on. Paths stay in the
/// server log.
fn open_error(tenant: &str, e: &WalError) -> StoreError {
    tracing::error!(tenant, error = %e, "tenant failed to open");
    match e {
        WalError::Corrupt {
            segment,
            offset,
            detail,
        } => StoreError::Unavailable(format!(
            "tenant '{tenant}' is unavailable: its write-ahead log is corrupt (segment {segment}, \
             offset {offset}: {detail}); an operator must repair it before it can serve"
        )),
        WalError::Replay { seq, .. } => StoreError::Unavailable(format!(
            "tenant '{tenant}' is unavailable: write-ahead-log record {seq} cannot be applied; an \
             operator must repair it before it can serve"
        )),
        _ => StoreError::Unavailable(format!(
            "tenant '{tenant}' is unavailable: its storage could not be opened (see the server log)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Coord;

    fn open(dir: &Path) -> TenantCore<u32> {
        TenantCore::open("t", dir, WalOptions::default(), 1024, 100, None)
            .unwrap()
            .0
    }

    fn who() -> Caller {
        Caller {
            principal: "t/k".into(),
            ts_ms: 1,
        }
    }

    fn write(v: &[u8]) -> Command {
        Command::Write {
            coord: Coord { x: 1, y: 2, z: 3 },
            value: v.to_vec(),
            expected_version: None,
        }
    }

    #[test]
    fn writes_answer_only_after_durable_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path());
        assert!(core.handle(write(b"a"), &who(), 1).is_none());
        assert!(core.handle(write(b"b"), &who(), 2).is_none());
        // Not durable yet: a read still sees nothing, through the actor or the shared reader.
        let reader = core.state().reader();
        assert_eq!(reader.read(&Coord { x: 1, y: 2, z: 3 }), None);
        let read = Command::Read {
            coord: Coord { x: 1, y: 2, z: 3 },
        };
        assert_eq!(
            core.handle(read.clone(), &who(), 3).unwrap().1,
            Ok(Reply::Read(None))
        );
        let wal = core.wal.as_ref().unwrap();
        wal.wait_durable(2).unwrap();
        let answers = core.on_durable(DurableEvent::Durable(wal.durable_seq()));
        let tokens: Vec<_> = answers.iter().map(|(t, r)| (*t, r.clone())).collect();
        assert_eq!(
            tokens,
            vec![
                (1, Ok(Reply::Written { version: 1, seq: 1 })),
                (2, Ok(Reply::Written { version: 2, seq: 2 }))
            ]
        );
        assert_eq!(reader.read(&Coord { x: 1, y: 2, z: 3 }).unwrap().version, 2);
        core.take_wal().unwrap().close().unwrap();
        let mut core = open(dir.path());
        let Some((_, Ok(Reply::Read(Some(cell))))) = core.handle(read, &who(), 4) else {
            panic!()
        };
        assert_eq!((cell.value.as_slice(), cell.version), (&b"b"[..], 2));
    }

    #[test]
    fn poisoned_shard_fails_waiting_writers_and_refuses_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = open(dir.path());
        assert!(core.handle(write(b"a"), &who(), 1).is_none());
        let answers = core.on_durable(DurableEvent::Poisoned);
        assert!(matches!(
            &answers[..],
            [(1, Err(StoreError::Unavailable(_)))]
        ));
        assert!(matches!(
            core.handle(write(b"b"), &who(), 2),
            Some((2, Err(StoreError::Unavailable(_))))
        ));
    }
}
