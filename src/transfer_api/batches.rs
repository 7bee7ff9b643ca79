//! Asynchronous batches of a [`super::TransferEndpoint`] (upstream's `batch_transfer_async_*`,
//! `transfer_submit_write`, `transfer_check_status` and `get_batch_transfer_status`): each
//! submitted batch runs on one of [`WORKERS`] threads; its id (never 0) names its outcome
//! until a status call frees it.
//!
//! A batch past its deadline (`MC_TRANSFER_TIMEOUT` seconds plus one nanosecond per byte, as
//! upstream) reports a timeout; the transfer itself is still bounded by the engine's I/O
//! timeout and ends on its own.
//!
//! Thread-safety: one mutex and condition variable around the table. Dropping the table
//! stops taking work and joins the workers once the submitted batches ran.

use crate::error::{fail, last_error_message, set_last_error_message, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Threads that run submitted batches.
pub(crate) const WORKERS: usize = 4;

/// A batch's work: runs its transfers, returns their outcome.
pub(crate) type Work = Box<dyn FnOnce() -> Result<()> + Send>;

/// Where a batch stands, as [`AsyncBatches::check`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchState {
    /// Every transfer completed (the id is freed).
    Done,
    /// Still running.
    Pending,
    /// A transfer failed (the id is freed).
    Failed,
    /// Still running past its deadline (the id stays).
    TimedOut,
}

/// A batch's outcome once it ran: its error code and the message its failure recorded.
type Outcome = std::result::Result<(), (ErrorCode, String)>;

struct Entry {
    deadline: Instant,
    outcome: Option<Outcome>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    batches: HashMap<u64, Entry>,
}

/// The endpoint's submitted batches and the threads that run them.
pub(crate) struct AsyncBatches {
    table: std::sync::Arc<(Mutex<Table>, Condvar)>,
    queue: Option<crossbeam_channel::Sender<(u64, Work)>>,
    workers: Vec<JoinHandle<()>>,
    timeout: Duration,
}

impl AsyncBatches {
    /// Starts the workers; `timeout` is a batch's deadline before its per-byte allowance.
    ///
    /// Errors: `INTERNAL_ERROR` when a thread cannot be started.
    pub(crate) fn start(timeout: Duration) -> Result<AsyncBatches> {
        let table = std::sync::Arc::new((Mutex::new(Table::default()), Condvar::new()));
        let (queue, jobs) = crossbeam_channel::unbounded::<(u64, Work)>();
        let mut workers = Vec::with_capacity(WORKERS);
        for index in 0..WORKERS {
            let (table, jobs) = (std::sync::Arc::clone(&table), jobs.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("mc-te-async-{index}"))
                .spawn(move || {
                    for (id, work) in jobs {
                        let outcome = work().map_err(|code| (code, last_error_message()));
                        let (lock, changed) = &*table;
                        if let Some(entry) = lock.lock().batches.get_mut(&id) {
                            entry.outcome = Some(outcome);
                        }
                        changed.notify_all();
                    }
                });
            match spawned {
                Ok(worker) => workers.push(worker),
                Err(e) => {
                    return fail(
                        ErrorCode::InternalError,
                        format!("cannot start the async transfer threads: {e}"),
                    )
                }
            }
        }
        Ok(AsyncBatches {
            table,
            queue: Some(queue),
            workers,
            timeout,
        })
    }

    /// Queues `work`, moving `bytes` in all; its id (≥ 1).
    ///
    /// Errors: `INTERNAL_ERROR` when the workers are gone.
    pub(crate) fn submit(&self, bytes: u64, work: Work) -> Result<u64> {
        let deadline = Instant::now() + self.timeout + Duration::from_nanos(bytes);
        let id = {
            let mut table = self.table.0.lock();
            table.next_id += 1;
            let id = table.next_id;
            let entry = Entry {
                deadline,
                outcome: None,
            };
            table.batches.insert(id, entry);
            id
        };
        let sent = self.queue.as_ref().map(|queue| queue.send((id, work)));
        if !matches!(sent, Some(Ok(()))) {
            self.table.0.lock().batches.remove(&id);
            return fail(
                ErrorCode::InternalError,
                "the async transfer threads are gone",
            );
        }
        Ok(id)
    }

    /// Where batch `id` stands; frees it when it ended (a failed batch's message becomes this
    /// thread's last error message).
    ///
    /// Errors: `INVALID_PARAMS` for an id that is not a live batch (never issued, or freed).
    pub(crate) fn check(&self, id: u64) -> Result<BatchState> {
        let mut table = self.table.0.lock();
        let Some(entry) = table.batches.get(&id) else {
            return fail(ErrorCode::InvalidParams, format!("no batch {id}"));
        };
        let state = match &entry.outcome {
            Some(Ok(())) => BatchState::Done,
            Some(Err((_, message))) => {
                set_last_error_message(format!("batch {id} failed: {message}"));
                BatchState::Failed
            }
            None if Instant::now() >= entry.deadline => return Ok(BatchState::TimedOut),
            None => return Ok(BatchState::Pending),
        };
        table.batches.remove(&id);
        Ok(state)
    }

    /// Waits until every batch of `ids` ended, one failed or one passed its deadline; frees
    /// every id either way (the batches still running finish unobserved).
    ///
    /// Errors: `INVALID_PARAMS` for an id that is not a live batch; the failed batch's error;
    /// `TRANSFER_TIMEOUT` for a batch past its deadline.
    pub(crate) fn wait_all(&self, ids: &[u64]) -> Result<()> {
        let (lock, changed) = &*self.table;
        let mut table = lock.lock();
        let outcome = loop {
            if let Some(id) = ids.iter().find(|id| !table.batches.contains_key(id)) {
                break fail(ErrorCode::InvalidParams, format!("no batch {id}"));
            }
            let entries = ids.iter().map(|id| (id, &table.batches[id]));
            let mut earliest: Option<Instant> = None;
            let mut verdict = None;
            let now = Instant::now();
            for (id, entry) in entries {
                match &entry.outcome {
                    Some(Ok(())) => {}
                    Some(Err((code, message))) => {
                        verdict = Some(fail(*code, format!("batch {id} failed: {message}")));
                        break;
                    }
                    None if now >= entry.deadline => {
                        verdict = Some(fail(
                            ErrorCode::TransferTimeout,
                            format!("batch {id} is past its deadline"),
                        ));
                        break;
                    }
                    None => {
                        earliest = Some(earliest.map_or(entry.deadline, |e| e.min(entry.deadline)))
                    }
                }
            }
            match (verdict, earliest) {
                (Some(verdict), _) => break verdict,
                (None, None) => break Ok(()),
                (None, Some(until)) => {
                    changed.wait_until(&mut table, until);
                }
            }
        };
        for id in ids {
            table.batches.remove(id);
        }
        outcome
    }
}

impl Drop for AsyncBatches {
    fn drop(&mut self) {
        drop(self.queue.take());
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(timeout_ms: u64) -> AsyncBatches {
        AsyncBatches::start(Duration::from_millis(timeout_ms)).unwrap()
    }

    #[test]
    fn a_batch_reports_pending_then_done_once_and_its_id_is_freed() {
        let batches = batches(10_000);
        let (release, gate) = crossbeam_channel::bounded::<()>(1);
        let id = batches
            .submit(
                0,
                Box::new(move || gate.recv().map_err(|_| ErrorCode::InternalError)),
            )
            .unwrap();
        assert!(id >= 1);
        assert_eq!(batches.check(id), Ok(BatchState::Pending));
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut state = batches.check(id);
        while state == Ok(BatchState::Pending) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            state = batches.check(id);
        }
        assert_eq!(state, Ok(BatchState::Done));
        assert_eq!(batches.check(id), Err(ErrorCode::InvalidParams), "freed");
    }

    #[test]
    fn a_failed_batch_fails_the_wait_and_every_id_is_freed() {
        let batches = batches(10_000);
        let ok = batches.submit(10, Box::new(|| Ok(()))).unwrap();
        let bad = batches
            .submit(10, Box::new(|| fail(ErrorCode::TransferFail, "no")))
            .unwrap();
        assert_eq!(batches.wait_all(&[ok, bad]), Err(ErrorCode::TransferFail));
        assert_eq!(batches.check(ok), Err(ErrorCode::InvalidParams));
        assert_eq!(batches.check(bad), Err(ErrorCode::InvalidParams));
        let a = batches.submit(1, Box::new(|| Ok(()))).unwrap();
        let b = batches.submit(1, Box::new(|| Ok(()))).unwrap();
        assert_eq!(batches.wait_all(&[a, b]), Ok(()));
        assert_eq!(batches.wait_all(&[a]), Err(ErrorCode::InvalidParams));
        assert_eq!(batches.check(0), Err(ErrorCode::InvalidParams));
    }

    #[test]
    fn a_batch_past_its_deadline_times_out_and_keeps_its_id_until_waited() {
        let batches = batches(20);
        let (release, gate) = crossbeam_channel::bounded::<()>(1);
        let id = batches
            .submit(
                0,
                Box::new(move || gate.recv().map_err(|_| ErrorCode::InternalError)),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(batches.check(id), Ok(BatchState::TimedOut));
        assert_eq!(batches.check(id), Ok(BatchState::TimedOut), "kept");
        let started = Instant::now();
        assert_eq!(batches.wait_all(&[id]), Err(ErrorCode::TransferTimeout));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(batches.check(id), Err(ErrorCode::InvalidParams));
        release.send(()).unwrap();
    }
}
