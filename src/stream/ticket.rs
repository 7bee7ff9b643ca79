//! Tickets: the state of one on-stream call, shared by the caller's handle, the stream's
//! release marker, the transfer that fills staging and the engine's housekeeper.
//!
//! Life of a ticket:
//! 1. *Issued*: its copies and release marker are on the stream; it holds the replicas'
//!    pins and its staging ranges ([`Hold`]).
//! 2. *Gate open* (tickets with a staged part only): the transfer finished, failed, timed out
//!    or the store was torn down; the status word holds the outcome. Exactly once.
//! 3. *Released*: the stream ran the release marker; the housekeeper unpinned the replicas,
//!    returned staging (quarantined while a late transfer still holds it) and published the
//!    final status. Waiters wake up.
//!
//! Thread-safety: everything is behind atomics or short mutexes; no lock is held while
//! calling out.

use super::slab::{GateSlot, TICKET_PENDING};
use crate::error::{ErrorCode, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a ticket keeps alive until the stream passes its release point, and the work done
/// then: it runs once on the housekeeper (or a worker, for tickets that commit), may make
/// master calls and transfers, may fail keys (`TicketState::fail_key`), and everything it
/// captured is dropped afterwards. The ticket's status is final only after it returns.
pub(crate) type Hold = Box<dyn FnOnce(&TicketState) + Send>;

#[derive(Default)]
struct Phase {
    /// The staged part's outcome, once the gate is open.
    gate: Option<Result<()>>,
    /// The final status, once the release marker ran.
    released: Option<i32>,
}

/// One on-stream call's shared state.
pub(crate) struct TicketState {
    pub(crate) id: u64,
    slot: GateSlot,
    /// Whether the stream waits on the gate (the call has a staged part).
    pub(crate) gated: bool,
    /// Whether the release commits (runs on a worker; the status word is written then).
    pub(crate) commits: bool,
    /// Whether the status word is written only once the call's copies ran
    /// ([`TicketState::publish_data_status`]; host streams, whose copies can fail), never
    /// when the gate opens: a reader of the word never sees 0 before the data is there.
    pub(crate) status_after_copies: bool,
    /// When the housekeeper opens the gate with `TRANSFER_TIMEOUT` if nothing else did.
    pub(crate) deadline: Instant,
    results: Mutex<Vec<Result<u64>>>,
    phase: Mutex<Phase>,
    changed: Condvar,
    gate_opened: AtomicBool,
    /// Who owns the ticket's fetch: `FETCH_*`.
    fetch: AtomicU8,
    hold: Mutex<Option<Hold>>,
}

/// The fetch has not started (or there is none).
const FETCH_IDLE: u8 = 0;
/// A pool worker runs the fetch.
const FETCH_RUNNING: u8 = 1;
/// The fetch returned to its worker.
const FETCH_DONE: u8 = 2;
/// The fetch overran its deadline: its thread left the pool (a replacement took its place)
/// and exits once the transfer returns.
const FETCH_HANDED_OFF: u8 = 3;

impl TicketState {
    pub(crate) fn new(
        id: u64,
        slot: GateSlot,
        gated: bool,
        commits: bool,
        deadline: Instant,
        results: Vec<Result<u64>>,
        hold: Hold,
    ) -> TicketState {
        TicketState {
            id,
            slot,
            gated,
            commits,
            status_after_copies: false,
            deadline,
            results: Mutex::new(results),
            phase: Mutex::new(Phase::default()),
            changed: Condvar::new(),
            gate_opened: AtomicBool::new(false),
            fetch: AtomicU8::new(FETCH_IDLE),
            hold: Mutex::new(Some(hold)),
        }
    }

    pub(crate) fn slot(&self) -> &GateSlot {
        &self.slot
    }

    /// Records a key's failure (a copy, the transfer of its staged part, the commit). The
    /// first error wins: a key that already failed keeps its error.
    pub(crate) fn fail_key(&self, index: usize, error: ErrorCode) {
        if let Some(r) = self.results.lock().get_mut(index) {
            if r.is_ok() {
                *r = Err(error);
            }
        }
    }

    /// Whether key `index` failed.
    pub(crate) fn key_failed(&self, index: usize) -> bool {
        self.results.lock().get(index).is_some_and(|r| r.is_err())
    }

    /// The first failed key's error, if any.
    fn first_key_error(&self) -> Option<ErrorCode> {
        self.results.lock().iter().find_map(|r| r.err())
    }

    /// Opens the gate with `outcome`: the status word gets the call's status (unless it is
    /// written after the copies, see [`TicketState::status_after_copies`]), then the gate
    /// word opens, then host waiters wake. Only the first call has any effect; returns
    /// whether it was this one.
    pub(crate) fn open_gate(&self, outcome: Result<()>) -> bool {
        self.open_gate_then(outcome, || {})
    }

    /// As [`TicketState::open_gate`]; `first` runs when this call is the one that opens the
    /// gate, before any waiter can see it open (so a counter it bumps is current for them).
    pub(crate) fn open_gate_then(&self, outcome: Result<()>, first: impl FnOnce()) -> bool {
        if self.gate_opened.swap(true, Ordering::AcqRel) {
            return false;
        }
        first();
        let status = outcome
            .err()
            .or_else(|| self.first_key_error())
            .map_or(0, |e| e.code());
        self.phase.lock().gate = Some(outcome);
        if self.status_after_copies {
            self.slot.open_gate_only();
        } else {
            self.slot.open(status);
        }
        self.changed.notify_all();
        true
    }

    /// Writes the status word with what is known of the data now: the gate's failure, else
    /// the first failed key, else 0. Device streams without a staged part call it at issue
    /// time; host streams once the call's copies ran (a copy there can fail).
    pub(crate) fn publish_data_status(&self) {
        self.slot.set_status(self.data_status());
    }

    /// The gate's failure, else the first failed key's error, as a status (0: none).
    fn data_status(&self) -> i32 {
        let gate_error = match &self.phase.lock().gate {
            Some(Err(e)) => Some(*e),
            _ => None,
        };
        gate_error
            .or_else(|| self.first_key_error())
            .map_or(0, |e| e.code())
    }

    /// Whether the gate opened with a failure (host streams then skip the staged copies).
    pub(crate) fn gate_failed(&self) -> bool {
        matches!(self.phase.lock().gate, Some(Err(_)))
    }

    /// Whether the gate is open (or there is none).
    pub(crate) fn gate_is_open(&self) -> bool {
        !self.gated || self.gate_opened.load(Ordering::Acquire)
    }

    /// A worker takes the fetch. False when the gate is already open (cancelled or timed out
    /// before it started: nothing to do) or the fetch was taken before.
    pub(crate) fn start_fetch(&self) -> bool {
        !self.gate_is_open()
            && self
                .fetch
                .compare_exchange(
                    FETCH_IDLE,
                    FETCH_RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// The worker's fetch returned. True when the worker still belongs to the pool; false
    /// when the fetch was handed off meanwhile (the thread must leave the pool).
    pub(crate) fn finish_fetch(&self) -> bool {
        self.fetch
            .compare_exchange(
                FETCH_RUNNING,
                FETCH_DONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Detaches a running fetch from its worker's pool slot. True when it was running and
    /// is now handed off (exactly once).
    pub(crate) fn hand_off_fetch(&self) -> bool {
        self.fetch
            .compare_exchange(
                FETCH_RUNNING,
                FETCH_HANDED_OFF,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Host streams: blocks until the gate opens (bounded: the housekeeper opens it at the
    /// deadline at the latest).
    pub(crate) fn wait_gate(&self) {
        let mut phase = self.phase.lock();
        while self.gated && phase.gate.is_none() {
            self.changed.wait(&mut phase);
        }
    }

    /// Housekeeper, after the release marker ran: releases the hold, hands the final status
    /// to `account` (before anyone can observe it, so a waiter that wakes up finds it
    /// counted), then publishes it.
    pub(crate) fn release(&self, account: impl FnOnce(i32)) {
        if !self.gate_is_open() {
            // The marker can only run after the gate (it is later on the stream); a stream
            // that skipped the wait is a runtime bug — never leave the gate closed.
            self.open_gate(Err(ErrorCode::InternalError));
        }
        let hold = self.hold.lock().take();
        if let Some(hold) = hold {
            hold(self);
        }
        let status = self.data_status();
        account(status);
        self.slot.set_status(status);
        self.phase.lock().released = Some(status);
        self.changed.notify_all();
    }

    /// `TICKET_PENDING` until released, then 0 or the first error code.
    pub(crate) fn status(&self) -> i32 {
        self.phase.lock().released.unwrap_or(TICKET_PENDING)
    }

    /// Waits up to `timeout` (None: no limit) for the release; returns [`TicketState::status`].
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> i32 {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut phase = self.phase.lock();
        while phase.released.is_none() {
            match deadline {
                None => self.changed.wait(&mut phase),
                Some(d) => {
                    if self.changed.wait_until(&mut phase, d).timed_out() {
                        break;
                    }
                }
            }
        }
        phase.released.unwrap_or(TICKET_PENDING)
    }

    /// Per-key results: bytes read or the key's error (final once released).
    pub(crate) fn results(&self) -> Vec<Result<u64>> {
        self.results.lock().clone()
    }
}

/// The caller's handle to an on-stream call. Cheap to clone; dropping every handle before
/// the stream reaches the release point is safe (the stream's marker keeps the state alive
/// and releases it).
#[derive(Clone)]
pub struct Ticket {
    pub(crate) state: Arc<TicketState>,
}

impl Ticket {
    /// `TICKET_PENDING` (1) until the stream passed the call's release point, then 0 or the
    /// first error (the gate's outcome, else the first failed key).
    pub fn status(&self) -> i32 {
        self.state.status()
    }

    /// Waits until the ticket is final or `timeout` (None: no limit) passes; returns the
    /// status (`TICKET_PENDING` on timeout).
    pub fn wait(&self, timeout: Option<Duration>) -> i32 {
        self.state.wait(timeout)
    }

    /// Per key, in call order: the bytes read, or the key's error.
    pub fn results(&self) -> Vec<Result<u64>> {
        self.state.results()
    }

    /// The device-readable address of the status word: `TICKET_PENDING` until the call's
    /// data is known, then 0 or a negative code. Known means: on a device stream, the gate
    /// open (issue time without a staged part); on a host stream, the call's copies done
    /// (work enqueued after the call reads the final word); for puts, the commit done. For
    /// host streams it is the host address. Valid while this handle lives.
    pub fn status_word(&self) -> usize {
        self.state.slot().status_device()
    }
}
