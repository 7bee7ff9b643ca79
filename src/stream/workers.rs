//! The fetch worker pool: `MC_STREAM_WORKERS` threads (default 2) run fetches for gated
//! tickets and the releases of tickets that commit.
//!
//! A fetch never holds a pool slot past its ticket's deadline: the deadline timer
//! ([`FetchPool::hand_off_overdue`]) detaches a fetch still running then — its thread
//! leaves the pool and exits as soon as the transfer returns, and a fresh worker takes its
//! slot. At most `MC_STREAM_STUCK_FETCHES` (default 16) detached threads exist at once;
//! beyond that an overdue fetch keeps its slot until a detached one ends (its ticket's gate
//! still opens on time, by the deadline timer). A detached fetch keeps its staging until its
//! transfer really ends (the fetch owns it), so no other call can reuse memory the transfer
//! may still write.
//!
//! Thread-safety: every method takes `&self`; state is behind one short mutex.

use super::ticket::TicketState;
use crate::error::{fail, ErrorCode, Result};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Work for the pool: returns whether its thread must leave the pool afterwards (its fetch
/// was handed off).
pub(super) type Job = Box<dyn FnOnce() -> bool + Send>;

thread_local! {
    /// Whether this thread is one of the pool's workers (shutdown does not wait for itself).
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

#[derive(Default)]
struct PoolState {
    /// Threads serving the queue.
    live: usize,
    /// Threads that left the pool with a handed-off fetch and have not ended yet.
    detached: usize,
    /// Fetches running now, by ticket id.
    running: HashMap<u64, Arc<TicketState>>,
    threads: Vec<JoinHandle<()>>,
    next_name: usize,
    closed: bool,
}

/// The pool. Owned by the engine's shared state.
pub(super) struct FetchPool {
    jobs: Mutex<Option<Sender<Job>>>,
    queue: Receiver<Job>,
    state: Mutex<PoolState>,
    max_detached: usize,
}

impl FetchPool {
    /// Starts `workers` threads. `INTERNAL_ERROR` when a thread cannot start.
    pub(super) fn start(workers: usize, max_detached: usize) -> Result<Arc<FetchPool>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let pool = Arc::new(FetchPool {
            jobs: Mutex::new(Some(tx)),
            queue: rx,
            state: Mutex::new(PoolState::default()),
            max_detached,
        });
        for _ in 0..workers {
            let mut state = pool.state.lock();
            pool.spawn(&mut state)?;
        }
        Ok(pool)
    }

    /// Queues `job`; false once the pool is shut down.
    pub(super) fn submit(&self, job: Job) -> bool {
        match self.jobs.lock().as_ref() {
            Some(jobs) => jobs.send(job).is_ok(),
            None => false,
        }
    }

    /// Wraps `fetch` for `ticket` as a job: it runs only if the gate is still closed, is
    /// visible to [`FetchPool::hand_off_overdue`] while it runs, and tells its worker whether
    /// it was handed off.
    pub(super) fn fetch_job(
        self: &Arc<Self>,
        ticket: Arc<TicketState>,
        fetch: impl FnOnce(&TicketState) + Send + 'static,
    ) -> Job {
        let pool = self.clone();
        Box::new(move || {
            if !ticket.start_fetch() {
                return false; // cancelled or timed out before it started
            }
            pool.state.lock().running.insert(ticket.id, ticket.clone());
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fetch(&ticket)));
            if run.is_err() {
                ticket.open_gate(Err(ErrorCode::InternalError));
            }
            pool.state.lock().running.remove(&ticket.id);
            !ticket.finish_fetch()
        })
    }

    /// Detaches every running fetch whose ticket's deadline is at or before `now`, each
    /// replaced by a fresh worker, while fewer than `MC_STREAM_STUCK_FETCHES` are detached.
    /// Returns how many were handed off.
    pub(super) fn hand_off_overdue(self: &Arc<Self>, now: Instant) -> usize {
        let mut state = self.state.lock();
        let overdue: Vec<Arc<TicketState>> = state
            .running
            .values()
            .filter(|t| t.deadline <= now)
            .cloned()
            .collect();
        let mut handed = 0;
        for ticket in overdue {
            if state.closed || state.detached >= self.max_detached || !ticket.hand_off_fetch() {
                continue;
            }
            state.running.remove(&ticket.id);
            state.detached += 1;
            state.live -= 1;
            handed += 1;
            tracing::warn!(
                ticket = ticket.id,
                detached = state.detached,
                "stream fetch overran its deadline; its worker was replaced"
            );
            if let Err(e) = self.spawn(&mut state) {
                tracing::error!(error = %e, "no replacement stream worker; the pool shrinks");
            }
        }
        handed
    }

    /// Threads detached with a stuck fetch, not ended yet.
    pub(super) fn detached(&self) -> usize {
        self.state.lock().detached
    }

    /// Closes the queue (queued jobs still run), detaches every running fetch (its gate is
    /// open by now: the engine cancelled it) and waits until `deadline` at most for the other
    /// workers to finish; joins those that did, leaves the rest to end on their own.
    pub(super) fn shutdown(&self, deadline: Instant) {
        drop(self.jobs.lock().take());
        {
            let mut state = self.state.lock();
            state.closed = true;
            let running: Vec<Arc<TicketState>> = state.running.drain().map(|(_, t)| t).collect();
            for ticket in running {
                if ticket.hand_off_fetch() {
                    state.detached += 1;
                    state.live -= 1;
                }
            }
        }
        let own = usize::from(IN_POOL.with(Cell::get));
        while self.state.lock().live > own && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        let threads = std::mem::take(&mut self.state.lock().threads);
        let me = std::thread::current().id();
        for thread in threads {
            if thread.is_finished() && thread.thread().id() != me {
                let _ = thread.join();
            }
        }
        let live = self.state.lock().live;
        if live > own {
            tracing::warn!(
                live,
                "stream workers still busy at teardown; they finish on their own"
            );
        }
    }

    /// Starts one worker (counted live). Called with the state locked.
    fn spawn(self: &Arc<Self>, state: &mut PoolState) -> Result<()> {
        let pool = self.clone();
        let name = format!("mc-stream-fetch-{}", state.next_name);
        state.next_name += 1;
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || pool.serve())
            .or_else(|e| fail(ErrorCode::InternalError, format!("thread spawn: {e}")))?;
        state.live += 1;
        state.threads.retain(|t| !t.is_finished());
        state.threads.push(thread);
        Ok(())
    }

    /// A worker's loop: runs jobs until the queue closes or a job says the thread was
    /// handed off.
    fn serve(&self) {
        IN_POOL.with(|f| f.set(true));
        if let Some(ops) = crate::device::runtime()
            .backend()
            .and_then(|b| crate::device::runtime().stream_ops(b.name()))
        {
            ops.prepare_thread();
        }
        for job in self.queue.iter() {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
                Ok(false) => {}
                Ok(true) => {
                    self.state.lock().detached -= 1;
                    return;
                }
                Err(_) => tracing::error!("a stream worker job panicked; the worker continues"),
            }
        }
        self.state.lock().live -= 1;
    }
}
