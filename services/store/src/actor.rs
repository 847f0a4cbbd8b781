//! The actix shell around a [`TenantCore`]: a bounded mailbox in, oneshot answers out.
//!
//! Everything interesting happens in the core; the actor only serializes access to it (one
//! tenant, one order: the WAL order) and moves the final fsync at shutdown off its own thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use cube_wal::DurableEvent;
use tokio::sync::oneshot;

use crate::StoreError;
use crate::backend::{BackendError, FLUSH_POLL};
use crate::core::TenantCore;
use crate::state::{Caller, Command, Reply};

/// Where a caller waits for its answer. Carries the caller's admission permit, so the tenant's
/// in-flight count drops exactly when the caller is answered (or its request is discarded).
pub(crate) struct Responder {
    pub tx: oneshot::Sender<Result<Reply, StoreError>>,
    pub permit: InFlightPermit,
}

impl Responder {
    pub(crate) fn send(self, result: Result<Reply, StoreError>) {
        let Responder { tx, permit } = self;
        // Released before the answer goes out, so a caller acting on the answer (closing the
        // now idle tenant, as a durability change does) never finds its own request in flight.
        drop(permit);
        // The caller may have given up (deadline, disconnect); its write still stands.
        let _ = tx.send(result);
    }
}

/// One admitted request of a tenant; releases its slot and its bytes when dropped.
pub(crate) struct InFlightPermit {
    pub requests: Arc<AtomicUsize>,
    pub bytes: Arc<AtomicUsize>,
    /// What the request carries ([`crate::Command::payload_bytes`]).
    pub size: usize,
}

impl Drop for InFlightPermit {
    fn drop(&mut self) {
        self.requests.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(self.size, Ordering::AcqRel);
        cube_metrics::MAILBOX_DEPTH.dec();
    }
}

/// One tenant's actor.
pub struct TenantActor {
    core: TenantCore<Responder>,
    /// The periodic checkpoint running on the blocking pool, if one is.
    checkpoint: Option<RunningCheckpoint>,
    /// Messages handled since this actor last let the others of its thread run
    /// ([`MESSAGES_PER_TURN`]).
    handled: u32,
}

/// Messages a tenant's actor handles before it lets the other actors of its thread run. actix's
/// mailbox drains an actor's queue in one go, to empty, unless the actor waits: a tenant with
/// thousands of calls queued (its in-flight cap is 4,096) held its thread, and every tenant on
/// it, for all of them. One turn is a few milliseconds at most; a tenant rarely has this many
/// queued, and then yields once per this many (a wake-up of its own task, nothing more).
const MESSAGES_PER_TURN: u32 = 32;

/// A periodic checkpoint's job on the blocking pool. Its result is taken by whichever comes
/// first: the job's own completion on the actor, or a [`Shutdown`], which waits for it (the
/// completion, a spawned item of the actor, does not run while a handler's future holds the
/// actor, and is dropped when the actor stops).
struct RunningCheckpoint {
    seq: u64,
    /// The job's result, sent as it ends (the sender dropped unsent: the job panicked), once
    /// it has let go of the state store.
    result: oneshot::Receiver<Result<Duration, BackendError>>,
}

/// What a checkpoint whose job panicked reports.
fn panicked() -> Result<Duration, BackendError> {
    Err(BackendError("checkpoint task panicked".into()))
}

/// How often an actor checks whether a time-based checkpoint is due.
const CHECKPOINT_TICK: Duration = Duration::from_secs(1);

impl TenantActor {
    pub(crate) fn new(core: TenantCore<Responder>) -> TenantActor {
        TenantActor {
            core,
            checkpoint: None,
            handled: 0,
        }
    }

    /// Count one handled message; after [`MESSAGES_PER_TURN`], stop taking this actor's messages
    /// until its task has been scheduled again, behind the other actors of the thread.
    fn take_turn(&mut self, ctx: &mut Context<Self>) {
        self.handled += 1;
        if self.handled >= MESSAGES_PER_TURN && !ctx.waiting() {
            self.handled = 0;
            ctx.wait(tokio::task::yield_now().into_actor(self));
        }
    }

    fn answer(answers: Vec<(Responder, Result<Reply, StoreError>)>) {
        for (responder, result) in answers {
            responder.send(result);
        }
    }

    /// Start a checkpoint if one is due: the state store's flush runs on the blocking pool, so
    /// this tenant keeps accepting and applying changes meanwhile.
    fn maybe_checkpoint(&mut self, ctx: &mut Context<Self>) {
        if !self.core.checkpoint_due() {
            return;
        }
        let Some(job) = self.core.begin_checkpoint() else {
            return;
        };
        let seq = job.seq;
        let (tx, result) = oneshot::channel();
        self.checkpoint = Some(RunningCheckpoint { seq, result });
        // Also told to the shared stats: an actor that crashes meanwhile drops the result, and
        // its close must still learn of a failure (see `SharedStats::checkpoint_running`).
        let stats = self.core.stats();
        stats.checkpoint_running.store(true, Ordering::Release);
        // The job's end (or its panic) wakes this; a Shutdown may have taken the result first.
        let ended = tokio::task::spawn_blocking(move || {
            /// Marks the job ended even if it panics, a panic as a failure (as the actor
            /// takes it).
            struct Ended(Arc<crate::core::SharedStats>);
            impl Drop for Ended {
                fn drop(&mut self) {
                    if std::thread::panicking() {
                        self.0.checkpoint_failed.store(true, Ordering::Release);
                    }
                    self.0.checkpoint_running.store(false, Ordering::Release);
                }
            }
            let ended = Ended(stats);
            let result = job.run();
            if result.is_err() {
                ended.0.checkpoint_failed.store(true, Ordering::Release);
            }
            let _ = tx.send(result);
            drop(ended);
        });
        ctx.spawn(ended.into_actor(self).map(move |_, act, _| {
            if let Some(mut running) = act.checkpoint.take_if(|r| r.seq == seq) {
                let result = running.result.try_recv().unwrap_or_else(|_| panicked());
                act.core.finish_checkpoint(seq, result);
            }
        }));
    }
}

// NOTE: admission is bounded by the directory's per-tenant in-flight counter, not by actix's
// mailbox capacity: actix's `try_send` parks per sender and still enqueues, so it cannot bound a
// mailbox shared by many callers.
impl Actor for TenantActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(CHECKPOINT_TICK, |act, ctx| act.maybe_checkpoint(ctx));
    }
}

/// A caller's command.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Call {
    /// When the gateway sent it (for `cube_change_stage_seconds{stage="mailbox"}`).
    pub sent: Instant,
    pub cmd: Command,
    pub caller: Caller,
    pub reply: Responder,
}

/// The WAL syncer's report (sent with `do_send`, so it never waits on a full mailbox).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Durable(pub DurableEvent);

/// Sync, answer everything pending, and stop. `done` hears whether the close went well: false
/// when it poisoned the tenant (its final fdatasync or checkpoint failed).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Shutdown {
    pub done: oneshot::Sender<bool>,
}

/// Makes the actor panic, as a bug in a handler would (tests of what the directory does then).
#[cfg(test)]
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Crash;

#[cfg(test)]
impl Handler<Crash> for TenantActor {
    type Result = ();

    #[allow(clippy::panic)]
    fn handle(&mut self, _: Crash, _: &mut Self::Context) {
        panic!("a tenant actor crashed on purpose (test)");
    }
}

impl Handler<Call> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Call, ctx: &mut Self::Context) {
        cube_metrics::CHANGE_MAILBOX.observe(msg.sent.elapsed().as_secs_f64());
        if msg.reply.tx.is_closed() {
            // The caller gave up (its gRPC deadline passed or it disconnected) while the call
            // was queued: it was told nothing was confirmed, so do nothing.
            return;
        }
        if let Some((responder, result)) = self.core.handle(msg.cmd, &msg.caller, msg.reply) {
            responder.send(result);
        }
        if self.core.apply_held() {
            // A relaxed change found no room to be applied at once: it waits for the next try.
            self.hold_or_checkpoint(ctx);
        }
        self.take_turn(ctx);
    }
}

impl Handler<Durable> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Durable, ctx: &mut Self::Context) {
        Self::answer(self.core.on_durable(msg.0));
        self.hold_or_checkpoint(ctx);
        self.take_turn(ctx);
    }
}

impl TenantActor {
    /// After applies: if they are held ([`TenantCore::apply_held`]), stop taking this actor's
    /// messages for [`FLUSH_POLL`], or until the state store says it may have room sooner (a
    /// memtable seal ended: [`TenantCore::room_notify`]) (`ctx.wait`: the thread runs other
    /// tenants' actors meanwhile, and this tenant's calls wait in its mailbox, within its
    /// in-flight caps), then try again; else see whether a checkpoint is due.
    fn hold_or_checkpoint(&mut self, ctx: &mut Context<Self>) {
        if !self.core.apply_held() {
            self.maybe_checkpoint(ctx);
            return;
        }
        let notify = self.core.room_notify();
        let poll = async move {
            let poll = tokio::time::sleep(FLUSH_POLL);
            match notify {
                Some(notify) => tokio::select! {
                    _ = notify.notified() => {}
                    _ = poll => {}
                },
                None => poll.await,
            }
        };
        ctx.wait(poll.into_actor(self).map(|_, act, ctx| {
            Self::answer(act.core.retry_apply());
            act.hold_or_checkpoint(ctx);
        }));
    }
}

impl Handler<Shutdown> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) {
        self.core.stats().stopping.store(true, Ordering::SeqCst);
        let poisoned_before = self.core.is_poisoned();
        // A periodic checkpoint still running holds the state store (and its lock) until its job
        // ends, and its outcome counts: a failed one poisons the tenant (which must then not be
        // reopened before a restart), a finished one lets the close's own checkpoint start. So
        // the close waits for it, and takes its result, first.
        match self.checkpoint.take() {
            Some(RunningCheckpoint { seq, result }) => {
                ctx.wait(result.into_actor(self).map(move |result, act, ctx| {
                    act.core
                        .finish_checkpoint(seq, result.unwrap_or_else(|_| panicked()));
                    act.close(msg.done, poisoned_before, ctx);
                }));
            }
            None => self.close(msg.done, poisoned_before, ctx),
        }
    }
}

impl TenantActor {
    /// Whether the close left the tenant as it found it: not poisoned by the close itself, and
    /// not poisoned for good at all (a failed checkpoint or an unappliable record while it was
    /// open, or a failed fsync at this close after a failed write): such a tenant needs the
    /// restart, which a shutdown must report rather than call the stop clean.
    fn closed_well(&self, poisoned_before: bool) -> bool {
        let poisoned = self.core.is_poisoned();
        let for_good = poisoned && !self.core.stats().reopenable.load(Ordering::Relaxed);
        !for_good && (poisoned_before || !poisoned)
    }

    /// The close proper, once no periodic checkpoint runs: the log's final fdatasync, the
    /// answers it releases, a last checkpoint; then `done` is told whether the close poisoned
    /// the tenant (it was not before: `poisoned_before`) and the actor stops.
    fn close(
        &mut self,
        done: oneshot::Sender<bool>,
        poisoned_before: bool,
        ctx: &mut Context<Self>,
    ) {
        let Some(wal) = self.core.take_wal() else {
            let _ = done.send(self.closed_well(poisoned_before));
            ctx.stop();
            return;
        };
        // The final fdatasync and checkpoint run on the blocking pool, not on this actor's
        // thread. The checkpoint makes the next open (after a restart or passivation) replay
        // nothing; when it covers the whole log, the log's files are removed there too, so that
        // the next open does not even read them.
        let wal_dir = wal.dir().to_path_buf();
        // Room in the state store first: the applies the final fdatasync releases are not held
        // (see `TenantCore::room_to_apply`), and must not wait on this thread.
        let room = self.core.state_room_waiter();
        let close = async move {
            tokio::task::spawn_blocking(move || {
                let closed = wal.close_or_failure();
                room();
                closed
            })
            .await
        };
        ctx.wait(close.into_actor(self).map(move |closed, act, ctx| {
            // A shard stopped by a failed write stays reopenable: reported as such, not as a
            // failed fdatasync, so the close does not refuse the tenant until the restart.
            let (answers, final_seq) = match closed {
                Ok(closed) => act.core.on_log_closed(closed),
                Err(_) => (act.core.on_durable(DurableEvent::Poisoned), None),
            };
            Self::answer(answers);
            let job = act.core.begin_checkpoint();
            // Decided here, done on the blocking pool with the checkpoint: removing the covered
            // log costs fsyncs, which must not stall the other tenants of this actor's thread.
            let (poisoned, prior) = (act.core.is_poisoned(), act.core.checkpoint_seq());
            let tenant = act.core.tenant().to_string();
            let flush = async move {
                tokio::task::spawn_blocking(move || {
                    let flushed = job.map(|job| {
                        let seq = job.seq;
                        (seq, job.run())
                    });
                    let checkpoint = flushed.as_ref().map(|(seq, r)| (*seq, r.is_ok()));
                    let removed = crate::core::remove_checkpointed_log(
                        &tenant, &wal_dir, final_seq, prior, checkpoint, poisoned,
                    );
                    (flushed, removed)
                })
                .await
            };
            ctx.wait(flush.into_actor(act).map(move |flushed, act, ctx| {
                let flushed = flushed.map(|(flushed, removed)| {
                    if let Err(e) = removed {
                        // The tenant stays refused until the restart (`sync_failed`).
                        act.core.poison_after_failed_sync(&e);
                    }
                    flushed
                });
                match flushed {
                    Ok(Some((seq, r))) => act.core.finish_checkpoint(seq, r),
                    Ok(None) => {}
                    Err(_) => act.core.finish_checkpoint(0, panicked()),
                }
                tracing::debug!(tenant = act.core.tenant(), "tenant closed");
                let _ = done.send(act.closed_well(poisoned_before));
                ctx.stop();
            }));
        }));
    }
}
