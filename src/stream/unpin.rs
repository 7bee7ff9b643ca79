//! The unpinner: one thread that gives the master back the pins of released tickets, so
//! that no release, deadline or stream ever waits for a master call.
//!
//! Pin ids are queued ([`Unpinner::unpin_later`]) and sent in batches: one `unpin` call
//! carries everything queued so far (at most [`BATCH`] ids). While the master cannot be
//! reached (`RPC_FAIL` / `RPC_TIMEOUT`) the batch is retried with a back-off from 50 ms
//! doubling to 2 s; other errors drop the batch (logged). At teardown the queue is flushed
//! until the teardown deadline; pins still queued then are abandoned (counted) and the master
//! reclaims them with the client.
//!
//! Thread-safety: `&self` methods from any thread. One engine (one client) uses one master
//! and one client id, given with the first pins.

use crate::error::ErrorCode;
use crate::master::MasterApi;
use crate::types::ClientId;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most pin ids in one `unpin` call.
pub(super) const BATCH: usize = 1024;
/// First retry delay while the master is unreachable.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest retry delay.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Where pins go back to.
#[derive(Clone)]
struct Target {
    master: Arc<dyn MasterApi>,
    client: ClientId,
}

struct Request {
    target: Target,
    pins: Vec<u64>,
}

/// Counters of the unpinner.
#[derive(Default)]
pub(super) struct UnpinCounters {
    /// Pin ids queued and not yet acknowledged by the master.
    pub pending: AtomicU64,
    /// `unpin` calls made (retries included).
    pub calls: AtomicU64,
    /// Pin ids given up at teardown.
    pub abandoned: AtomicU64,
}

/// The unpinner thread and its queue.
pub(super) struct Unpinner {
    queue: Mutex<Option<Sender<Request>>>,
    /// Set at shutdown: the last moment the thread keeps trying.
    flush_until: Arc<Mutex<Option<Instant>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<UnpinCounters>,
}

impl Unpinner {
    /// Starts the thread. `Err` with the spawn error's text.
    pub(super) fn start() -> std::result::Result<Unpinner, String> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let counters = Arc::new(UnpinCounters::default());
        let flush_until = Arc::new(Mutex::new(None));
        let (c, f) = (counters.clone(), flush_until.clone());
        let thread = std::thread::Builder::new()
            .name("mc-stream-unpin".into())
            .spawn(move || run(&rx, &c, &f))
            .map_err(|e| format!("cannot start the stream unpinner: {e}"))?;
        Ok(Unpinner {
            queue: Mutex::new(Some(tx)),
            flush_until,
            thread: Mutex::new(Some(thread)),
            counters,
        })
    }

    /// Queues `pins` of `client` for `master`; never blocks. After shutdown the pins are
    /// abandoned (counted).
    pub(super) fn unpin_later(
        &self,
        master: &Arc<dyn MasterApi>,
        client: ClientId,
        pins: Vec<u64>,
    ) {
        if pins.is_empty() {
            return;
        }
        let n = pins.len() as u64;
        self.counters.pending.fetch_add(n, Ordering::Relaxed);
        let request = Request {
            target: Target {
                master: master.clone(),
                client,
            },
            pins,
        };
        let sent = match self.queue.lock().as_ref() {
            Some(queue) => queue.send(request).is_ok(),
            None => false,
        };
        if !sent {
            self.counters.pending.fetch_sub(n, Ordering::Relaxed);
            self.counters.abandoned.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn counters(&self) -> &UnpinCounters {
        &self.counters
    }

    /// Closes the queue and lets the thread flush it until `deadline`; joins it if it
    /// finished by then, else leaves it to end on its own (after at most one more call).
    pub(super) fn shutdown(&self, deadline: Instant) {
        *self.flush_until.lock() = Some(deadline);
        drop(self.queue.lock().take());
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            tracing::warn!(
                pending = self.counters.pending.load(Ordering::Relaxed),
                "the master did not take the last unpins before the teardown deadline"
            );
        }
    }
}

/// Adds a request's pins to the batch being built.
fn absorb(request: Request, pending: &mut Vec<u64>, target: &mut Option<Target>) {
    pending.extend(request.pins);
    *target = Some(request.target);
}

/// The thread: waits for pins, sends batches, backs off while the master is unreachable.
fn run(queue: &Receiver<Request>, counters: &UnpinCounters, flush_until: &Mutex<Option<Instant>>) {
    let mut pending: Vec<u64> = Vec::new();
    let mut target: Option<Target> = None;
    let mut backoff = FIRST_BACKOFF;
    let mut open = true;
    loop {
        if pending.is_empty() {
            match queue.recv() {
                Ok(r) => absorb(r, &mut pending, &mut target),
                Err(_) => return,
            }
        }
        while let Ok(r) = queue.try_recv() {
            absorb(r, &mut pending, &mut target);
        }
        let Some(to) = &target else { return };
        let n = pending.len().min(BATCH);
        counters.calls.fetch_add(1, Ordering::Relaxed);
        match to.master.unpin(to.client, pending[..n].to_vec()) {
            Err(e @ (ErrorCode::RpcFail | ErrorCode::RpcTimeout)) => {
                tracing::debug!(error = %e, pins = pending.len(), "unpin failed; will retry");
            }
            outcome => {
                if let Err(e) = outcome {
                    tracing::warn!(error = %e, pins = n, "the master refused an unpin; dropped");
                }
                pending.drain(..n);
                counters.pending.fetch_sub(n as u64, Ordering::Relaxed);
                backoff = FIRST_BACKOFF;
                continue;
            }
        }
        let past_flush = flush_until.lock().is_some_and(|d| Instant::now() >= d);
        if past_flush {
            let n = pending.len() as u64;
            counters.pending.fetch_sub(n, Ordering::Relaxed);
            counters.abandoned.fetch_add(n, Ordering::Relaxed);
            return;
        }
        if open {
            match queue.recv_timeout(backoff) {
                Ok(r) => absorb(r, &mut pending, &mut target),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => open = false,
            }
        } else {
            std::thread::sleep(backoff.min(Duration::from_millis(50)));
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
