//! The threads tenant actors run on: one actix System hosting a few Arbiters (each a thread with
//! a single-threaded tokio runtime). Tenants are spread over them round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use actix::{Arbiter, ArbiterHandle, System};

use crate::StoreError;

pub(crate) struct ActorRuntime {
    arbiters: Vec<ArbiterHandle>,
    next: AtomicUsize,
    system: System,
    thread: Option<JoinHandle<()>>,
}

impl ActorRuntime {
    pub(crate) fn start(threads: usize) -> Result<ActorRuntime, StoreError> {
        let threads = threads.max(1);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("actix-system".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(async move {
                    // Up to the first thread the system refuses.
                    let arbiters: Vec<_> = (0..threads)
                        .map_while(|_| actor_arbiter().ok())
                        .map(|a| a.handle())
                        .collect();
                    let _ = tx.send((System::current(), arbiters));
                });
                let _ = system.run();
            })
            .map_err(|_| StoreError::Unavailable("could not start actor threads".into()))?;
        let (system, arbiters) = rx
            .recv()
            .map_err(|_| StoreError::Unavailable("actor threads failed to start".into()))?;
        if arbiters.len() < threads {
            system.stop();
            return Err(StoreError::Unavailable(format!(
                "could start only {} of {threads} actor threads (the system refused more \
                 threads: lower --actor-threads, or raise the process's thread limit)",
                arbiters.len()
            )));
        }
        Ok(ActorRuntime {
            arbiters,
            next: AtomicUsize::new(0),
            system,
            thread: Some(thread),
        })
    }

    pub(crate) fn pick(&self) -> &ArbiterHandle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        &self.arbiters[i]
    }
}

/// An Arbiter whose runtime has no I/O driver: tenant actors do no socket I/O, and without the
/// driver an idle arbiter parks on a futex instead of epoll, so waking it for the next message
/// costs one futex wake instead of an eventfd write plus an epoll round trip.
fn actor_arbiter() -> std::io::Result<Arbiter> {
    Arbiter::try_with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
    })
}

impl Drop for ActorRuntime {
    fn drop(&mut self) {
        for a in &self.arbiters {
            a.stop();
        }
        self.system.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
