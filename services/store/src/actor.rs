//! The actix shell around a [`TenantCore`]: a bounded mailbox in, oneshot answers out.
//!
//! Everything interesting happens in the core; the actor only serializes access to it (one
//! tenant, one order: the WAL order) and moves the final fsync at shutdown off its own thread.

use actix::prelude::*;
use cube_wal::DurableEvent;
use tokio::sync::oneshot;

use crate::StoreError;
use crate::core::TenantCore;
use crate::state::{Command, Reply};

/// Where a caller waits for its answer.
pub(crate) type Responder = oneshot::Sender<Result<Reply, StoreError>>;

/// One tenant's actor.
pub struct TenantActor {
    core: TenantCore<Responder>,
    mailbox_capacity: usize,
}

impl TenantActor {
    pub(crate) fn new(core: TenantCore<Responder>, mailbox_capacity: usize) -> TenantActor {
        TenantActor { core, mailbox_capacity }
    }

    fn answer(answers: Vec<(Responder, Result<Reply, StoreError>)>) {
        for (tx, result) in answers {
            // The caller may have given up (deadline, disconnect); its write still stands.
            let _ = tx.send(result);
        }
    }
}

impl Actor for TenantActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

/// A caller's command.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Call {
    pub cmd: Command,
    pub reply: Responder,
}

/// The WAL syncer's report (sent with `do_send`, so it never waits on a full mailbox).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Durable(pub DurableEvent);

/// Sync, answer everything pending, and stop.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Shutdown {
    pub done: oneshot::Sender<()>,
}

impl Handler<Call> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Call, _ctx: &mut Self::Context) {
        if let Some((tx, result)) = self.core.handle(msg.cmd, msg.reply) {
            let _ = tx.send(result);
        }
    }
}

impl Handler<Durable> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Durable, _ctx: &mut Self::Context) {
        Self::answer(self.core.on_durable(msg.0));
    }
}

impl Handler<Shutdown> for TenantActor {
    type Result = ();

    fn handle(&mut self, msg: Shutdown, ctx: &mut Self::Context) {
        let Some(wal) = self.core.take_wal() else {
            let _ = msg.done.send(());
            ctx.stop();
            return;
        };
        // The final fdatasync runs on the blocking pool, not on this actor's thread.
        let close = async move { tokio::task::spawn_blocking(move || wal.close()).await };
        ctx.wait(close.into_actor(self).map(move |closed, act, ctx| {
            let event = match closed {
                Ok(Ok(durable)) => DurableEvent::Durable(durable),
                _ => DurableEvent::Poisoned,
            };
            Self::answer(act.core.on_durable(event));
            tracing::debug!(tenant = act.core.tenant(), "tenant closed");
            let _ = msg.done.send(());
            ctx.stop();
        }));
    }
}
