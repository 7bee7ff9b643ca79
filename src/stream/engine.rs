//! The per-client stream engine: the gate slab and staging pool (allocated at setup), the
//! fetch workers that fill staging, and the housekeeper thread that releases tickets after
//! their release marker ran and opens the gates of tickets past their deadline.
//!
//! Threads: the fetch pool (`workers`: `MC_STREAM_WORKERS`, default 2, plus replacements for
//! fetches that overran their deadline), one housekeeper (releases), one deadline timer and
//! one unpinner (`unpin`). Release markers run on the stream's thread (host streams) or a
//! runtime thread (device streams) and only hand the ticket to the housekeeper: no blocking,
//! no runtime call, no unpin there. The housekeeper makes no master call either (pins go to
//! the unpinner), and the deadline timer depends on nothing but the clock: every gate opens
//! by its ticket's deadline (`MC_STREAM_TIMEOUT_MS`) plus one 10 ms tick, whatever the
//! master or the peers do.
//!
//! Shutdown ([`StreamEngine::shutdown`], at client teardown) returns within
//! `MC_STREAM_TEARDOWN_MS` (default 5000) plus a few milliseconds: every open ticket's gate
//! opens with `CANCELLED`, running fetches are detached, idle workers finish; the
//! housekeeper keeps running until every issued ticket has been released by its stream, so
//! memory a stream may still read (segment, staging) stays alive until then, and the
//! unpinner flushes its queue until the deadline. Threads still busy at the deadline are
//! left to finish on their own (they own what they touch).

use super::host::HostStream;
use super::slab::GateSlab;
use super::staging::{StagingBuf, StagingPool};
use super::ticket::{Hold, Ticket, TicketState};
use super::unpin::Unpinner;
use super::workers::{FetchPool, Job};
use crate::device::{self, StreamOps};
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterApi;
use crate::transfer::TransferEngine;
use crate::types::ClientId;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which stream a call is enqueued on.
#[derive(Clone, Copy)]
pub enum StreamRef<'a> {
    /// No stream: the blocking call runs, and the returned ticket is already final.
    Blocking,
    /// One of our host streams.
    Host(&'a HostStream),
    /// A raw `CUstream` (`cudaStream_t`); never the NULL stream (that is the blocking call).
    Cuda(usize),
    /// A raw `aclrtStream`.
    Ascend(usize),
}

/// A resolved stream: where enqueued work goes.
pub(crate) enum Target {
    Host(HostStream),
    Device {
        ops: &'static dyn StreamOps,
        stream: usize,
    },
}

impl Target {
    /// Whether copies on this stream need a pinned source and a device destination.
    pub(crate) fn is_device(&self) -> bool {
        matches!(self, Target::Device { .. })
    }
}

/// One stream copy of `len` bytes from `src` to `dst`, for the call's key number `key`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy {
    pub key: usize,
    pub dst: usize,
    pub src: usize,
    pub len: usize,
}

/// What to enqueue for one call: `direct` copies (sources already in place: resident
/// replicas, or the caller's memory for puts), then — if `gated` — the gate, then `staged`
/// copies, then the release marker.
///
/// `commits`: the release does real work (a put's transfers and commit), so it runs on a
/// worker rather than the housekeeper, and the status word is written only then.
#[derive(Default)]
pub(crate) struct Plan {
    pub direct: Vec<Copy>,
    pub gated: bool,
    pub staged: Vec<Copy>,
    pub commits: bool,
}

/// A fetch run by a worker for a gated ticket; it must open the gate (or leave it to the
/// deadline) and may record per-key failures.
pub(crate) type Fetch = Box<dyn FnOnce(&TicketState) + Send>;

/// Engine sizes, from the environment at setup.
#[derive(Clone, Debug)]
pub(crate) struct StreamConfig {
    /// Gate/status slots (`MC_STREAM_TICKETS`, default 1024): tickets alive at once.
    pub tickets: u32,
    /// Pinned staging bytes (`MC_STREAM_STAGING_BYTES`, default 64 MiB).
    pub staging_bytes: u64,
    /// Fetch worker threads (`MC_STREAM_WORKERS`, default 2).
    pub workers: usize,
    /// How long a gate may stay closed (`MC_STREAM_TIMEOUT_MS`, default 30000).
    pub timeout: Duration,
    /// Most fetch threads detached past their deadline at once (`MC_STREAM_STUCK_FETCHES`,
    /// default 16, at most 1024; 0: an overdue fetch keeps its worker).
    pub stuck_fetches: usize,
    /// How long teardown waits for streams, workers and the last unpins
    /// (`MC_STREAM_TEARDOWN_MS`, default 5000).
    pub teardown: Duration,
}

impl StreamConfig {
    pub(crate) fn from_env() -> StreamConfig {
        StreamConfig {
            tickets: env::STREAM_TICKETS.get() as u32,
            staging_bytes: env::STREAM_STAGING_BYTES.get(),
            workers: env::STREAM_WORKERS.get() as usize,
            timeout: Duration::from_millis(env::STREAM_TIMEOUT_MS.get()),
            stuck_fetches: env::STREAM_STUCK_FETCHES.get() as usize,
            teardown: Duration::from_millis(env::STREAM_TEARDOWN_MS.get()),
        }
    }
}

/// Counters of the on-stream paths (a snapshot is [`StreamMetrics`]).
#[derive(Default)]
pub(crate) struct StreamCounters {
    pub issued: AtomicU64,
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub try_again: AtomicU64,
    pub timed_out: AtomicU64,
    pub cancelled: AtomicU64,
    pub direct_copies: AtomicU64,
    pub staged_copies: AtomicU64,
    pub pins_held: AtomicU64,
    pub lease_overruns: AtomicU64,
    pub leaked_on_enqueue_failure: AtomicU64,
}

/// A snapshot of the on-stream counters and gauges.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StreamMetrics {
    /// Tickets issued.
    pub tickets_issued: u64,
    /// Tickets released with status 0.
    pub tickets_ok: u64,
    /// Tickets released with an error.
    pub tickets_failed: u64,
    /// Tickets issued and not yet released by their stream.
    pub tickets_outstanding: u64,
    /// Calls refused with `TRY_AGAIN` (no ticket slot or no staging room).
    pub try_again: u64,
    /// Gates opened by the deadline (`TRANSFER_TIMEOUT`).
    pub timed_out: u64,
    /// Gates opened by teardown (`CANCELLED`).
    pub cancelled: u64,
    /// Copies enqueued straight from resident replicas (or caller memory).
    pub direct_copies: u64,
    /// Copies enqueued from staging.
    pub staged_copies: u64,
    /// Pinned objects held by tickets not yet released.
    pub pins_held: u64,
    /// Tickets released after their read lease ran out (the pins kept the bytes; counted
    /// as a leak detector only).
    pub lease_overruns: u64,
    /// Staging bytes in use (including ranges quarantined behind a late transfer).
    pub staging_bytes_in_use: u64,
    /// Fetch threads detached after overrunning their deadline and still in their transfer.
    pub stuck_fetches: u64,
    /// Pins of released tickets not yet given back to the master (queued or retrying).
    pub unpins_pending: u64,
    /// `unpin` master calls made by the unpinner (one per batch, retries included).
    pub unpin_calls: u64,
    /// Pins the unpinner gave up at teardown (the master reclaims them with the client).
    pub unpins_abandoned: u64,
    /// Tickets whose resources were deliberately never freed because enqueueing failed
    /// halfway (the stream may still read them).
    pub leaked_on_enqueue_failure: u64,
}

struct Shared {
    config: StreamConfig,
    pool: Arc<FetchPool>,
    unpinner: Unpinner,
    slab: Arc<GateSlab>,
    staging: Arc<StagingPool>,
    /// Tickets issued and not yet released, for deadlines and teardown.
    outstanding: Mutex<HashMap<u64, Weak<TicketState>>>,
    released: Sender<Arc<TicketState>>,
    closed: AtomicBool,
    next_id: AtomicU64,
    counters: StreamCounters,
}

/// The engine. Thread-safe; owned by the client core.
pub(crate) struct StreamEngine {
    shared: Arc<Shared>,
    housekeeper: Mutex<Option<JoinHandle<()>>>,
    /// Dropping it stops the deadline timer.
    timer_stop: Mutex<Option<Sender<()>>>,
    timer: Mutex<Option<JoinHandle<()>>>,
}

impl StreamEngine {
    /// Allocates the slab and staging (registered with `engine` when it moves bytes by RDMA)
    /// and starts the threads. `INTERNAL_ERROR` when memory or threads are refused.
    pub(crate) fn start(
        config: StreamConfig,
        engine: &Arc<TransferEngine>,
    ) -> Result<StreamEngine> {
        let rt = device::runtime();
        let ops = rt
            .backend()
            .and_then(|b| rt.stream_ops(b.name()))
            .filter(|_| rt.info().host_register);
        let slab = GateSlab::new(config.tickets, |addr| match ops {
            Some(ops) => ops.device_address(addr),
            None => Ok(addr),
        })
        .or_else(|_| GateSlab::new(config.tickets, Ok))?;
        let staging = StagingPool::new(config.staging_bytes, engine)?;
        let (released_tx, released_rx) = crossbeam_channel::unbounded();
        let unpinner = Unpinner::start().or_else(|e| fail(ErrorCode::InternalError, e))?;
        let shared = Arc::new(Shared {
            config: config.clone(),
            pool: FetchPool::start(config.workers, config.stuck_fetches)?,
            unpinner,
            slab,
            staging,
            outstanding: Mutex::new(HashMap::new()),
            released: released_tx,
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            counters: StreamCounters::default(),
        });
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .or_else(|e| fail(ErrorCode::InternalError, format!("thread spawn: {e}")))
        };
        let keeper = shared.clone();
        let housekeeper = spawn(
            "mc-stream-keeper".into(),
            Box::new(move || housekeeper(&keeper, &released_rx)),
        )?;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let timed = shared.clone();
        let timer = spawn(
            "mc-stream-deadline".into(),
            Box::new(move || deadline_timer(&timed, &stop_rx)),
        )?;
        Ok(StreamEngine {
            shared,
            housekeeper: Mutex::new(Some(housekeeper)),
            timer_stop: Mutex::new(Some(stop_tx)),
            timer: Mutex::new(Some(timer)),
        })
    }

    /// Resolves a stream: checks the runtime supports it and that it is not being captured.
    /// `NOT_SUPPORTED` (runtime absent or without stream operations), `INVALID_PARAMS` (NULL
    /// stream), `STREAM_CAPTURE_UNSUPPORTED`.
    pub(crate) fn target(&self, stream: StreamRef<'_>) -> Result<Target> {
        let (name, handle) = match stream {
            StreamRef::Blocking => {
                return fail(ErrorCode::InternalError, "a blocking call has no stream")
            }
            StreamRef::Host(s) => return Ok(Target::Host(s.clone())),
            StreamRef::Cuda(h) => ("cuda", h),
            StreamRef::Ascend(h) => ("ascend", h),
        };
        if handle == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "the NULL stream means the blocking call",
            );
        }
        let Some(ops) = device::runtime().stream_ops(name) else {
            return fail(
                ErrorCode::NotSupported,
                format!("no {name} runtime with stream operations is loaded"),
            );
        };
        if !self.shared.staging.is_pinned() && self.shared.config.staging_bytes > 0 {
            return fail(
                ErrorCode::NotSupported,
                "the stream staging pool could not be pinned with the device runtime",
            );
        }
        match ops.is_capturing(handle) {
            Ok(false) => {}
            Ok(true) => {
                return fail(
                    ErrorCode::StreamCaptureUnsupported,
                    "the stream is being captured: issue the call on an uncaptured side stream \
                     and make the graph wait on an event recorded after it",
                )
            }
            Err(e) => {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("cannot query the stream's capture status: {e}"),
                )
            }
        }
        Ok(Target::Device {
            ops,
            stream: handle,
        })
    }

    /// A pinned staging range of `len` bytes, or `TRY_AGAIN`.
    pub(crate) fn staging(&self, len: u64) -> Result<Arc<StagingBuf>> {
        self.shared.staging.take(len).inspect_err(|_| {
            self.shared
                .counters
                .try_again
                .fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Checks that the engine is open and a slot is free (`CANCELLED` after teardown,
    /// `TRY_AGAIN` when every slot is taken); the slot is returned to the caller to issue.
    pub(crate) fn reserve(&self) -> Result<super::slab::GateSlot> {
        if self.shared.closed.load(Ordering::Acquire) {
            return fail(ErrorCode::Cancelled, "the store is torn down");
        }
        self.shared.slab.take().inspect_err(|_| {
            self.shared
                .counters
                .try_again
                .fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Counts `pins` objects as held until the ticket that holds them is released.
    pub(crate) fn note_pins(&self, pins: u64) {
        self.shared
            .counters
            .pins_held
            .fetch_add(pins, Ordering::Relaxed);
    }

    /// Counts released pins.
    pub(crate) fn note_unpinned(&self, pins: u64) {
        self.shared
            .counters
            .pins_held
            .fetch_sub(pins, Ordering::Relaxed);
    }

    /// Queues `pins` of `client` to be given back to `master` by the unpinner thread (batched,
    /// retried while the master is unreachable); never blocks. `pins_held` is not touched.
    pub(crate) fn unpin_later(
        &self,
        master: &Arc<dyn MasterApi>,
        client: ClientId,
        pins: Vec<u64>,
    ) {
        self.shared.unpinner.unpin_later(master, client, pins);
    }

    /// Counts a release after the read lease ended.
    pub(crate) fn note_lease_overrun(&self) {
        self.shared
            .counters
            .lease_overruns
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Issues a call: enqueues `plan` on `target`, hands `fetch` (required when the plan is
    /// gated) to a worker and returns the ticket. `results` are the per-key results known
    /// now; `hold` runs when the stream passes the release marker.
    ///
    /// On an enqueue failure the call fails with `INTERNAL_ERROR`: an already enqueued gate
    /// is opened with the error, and when the release marker could not be enqueued the hold
    /// is never released (the stream may still read the memory it keeps alive; counted).
    ///
    /// # Safety
    /// Every copy's ranges are valid for the stream to access until the release marker ran:
    /// destinations are the caller's (its contract), sources are kept alive by `hold`.
    pub(crate) unsafe fn issue(
        &self,
        target: &Target,
        slot: super::slab::GateSlot,
        plan: Plan,
        fetch: Option<Fetch>,
        results: Vec<Result<u64>>,
        hold: Hold,
    ) -> Result<Ticket> {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + shared.config.timeout;
        let mut ticket =
            TicketState::new(id, slot, plan.gated, plan.commits, deadline, results, hold);
        ticket.status_after_copies = !target.is_device();
        let state = Arc::new(ticket);
        if !plan.gated && !plan.commits && target.is_device() {
            state.publish_data_status();
        }
        let counters = &shared.counters;
        counters
            .direct_copies
            .fetch_add(plan.direct.len() as u64, Ordering::Relaxed);
        counters
            .staged_copies
            .fetch_add(plan.staged.len() as u64, Ordering::Relaxed);
        shared.outstanding.lock().insert(id, Arc::downgrade(&state));
        counters.issued.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { enqueue(target, &state, &plan, shared) } {
            state.open_gate(Err(ErrorCode::InternalError));
            // Deliberately leaked: copies already on the stream may read what the ticket
            // keeps alive, and no release marker will ever say when they are done.
            std::mem::forget(state.clone());
            shared.outstanding.lock().remove(&id);
            counters
                .leaked_on_enqueue_failure
                .fetch_add(1, Ordering::Relaxed);
            return fail(
                ErrorCode::InternalError,
                format!("enqueueing on the stream failed: {e}"),
            );
        }
        if plan.gated {
            let sent = match fetch {
                Some(fetch) => shared
                    .pool
                    .submit(shared.pool.fetch_job(state.clone(), fetch)),
                None => false,
            };
            if !sent {
                state.open_gate(Err(ErrorCode::Cancelled));
            }
        }
        Ok(Ticket { state })
    }

    /// The blocking form of an on-stream call: reserves a slot (its status word needs one),
    /// then runs `call` and returns a ticket that is already final with its results.
    /// `TRY_AGAIN` when no slot is free and `CANCELLED` after teardown — in both cases
    /// `call` has not run.
    pub(crate) fn completed(&self, call: impl FnOnce() -> Vec<Result<u64>>) -> Result<Ticket> {
        let slot = self.reserve()?;
        let results = call();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(TicketState::new(
            id,
            slot,
            false,
            false,
            Instant::now(),
            results,
            Box::new(|_| {}),
        ));
        state.publish_data_status();
        state.release(|_| {});
        Ok(Ticket { state })
    }

    /// A snapshot of the counters.
    pub(crate) fn metrics(&self) -> StreamMetrics {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamMetrics {
            tickets_issued: get(&c.issued),
            tickets_ok: get(&c.ok),
            tickets_failed: get(&c.failed),
            tickets_outstanding: self.shared.outstanding.lock().len() as u64,
            try_again: get(&c.try_again),
            timed_out: get(&c.timed_out),
            cancelled: get(&c.cancelled),
            direct_copies: get(&c.direct_copies),
            staged_copies: get(&c.staged_copies),
            pins_held: get(&c.pins_held),
            lease_overruns: get(&c.lease_overruns),
            staging_bytes_in_use: self.shared.staging.used(),
            stuck_fetches: self.shared.pool.detached() as u64,
            unpins_pending: get(&self.shared.unpinner.counters().pending),
            unpin_calls: get(&self.shared.unpinner.counters().calls),
            unpins_abandoned: get(&self.shared.unpinner.counters().abandoned),
            leaked_on_enqueue_failure: get(&c.leaked_on_enqueue_failure),
        }
    }

    /// Tears the engine down (idempotent) within `MC_STREAM_TEARDOWN_MS`: cancels every
    /// open gate, closes the fetch pool (running fetches are detached), waits for the
    /// streams to release their tickets and for the unpinner to flush, each until the one
    /// teardown deadline; whatever is still busy then finishes on its own.
    pub(crate) fn shutdown(&self) {
        let shared = &self.shared;
        if shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let deadline = Instant::now() + shared.config.teardown;
        let open: Vec<Arc<TicketState>> = shared
            .outstanding
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for ticket in open {
            if ticket.gated {
                ticket.open_gate_then(Err(ErrorCode::Cancelled), || {
                    shared.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                });
            }
        }
        drop(self.timer_stop.lock().take());
        let me = std::thread::current().id();
        if let Some(timer) = self.timer.lock().take() {
            if timer.thread().id() != me {
                let _ = timer.join();
            }
        }
        shared.pool.shutdown(deadline);
        self.wait_for_streams(deadline);
        shared.unpinner.shutdown(deadline);
    }

    /// Waits until `deadline` at most for every issued ticket to be released, then joins the
    /// housekeeper (if it finished).
    fn wait_for_streams(&self, deadline: Instant) {
        let shared = &self.shared;
        let Some(keeper) = self.housekeeper.lock().take() else {
            return;
        };
        if keeper.thread().id() == std::thread::current().id() {
            return; // the last client handle went away inside a release: nothing to wait for
        }
        while !shared.outstanding.lock().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if shared.outstanding.lock().is_empty() {
            let _ = keeper.join();
        } else {
            tracing::warn!(
                outstanding = shared.outstanding.lock().len(),
                "stream tickets still wait for their streams at teardown; their memory is \
                 released when the streams reach them"
            );
        }
    }
}

impl Drop for StreamEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Enqueues the plan's work and the release marker.
///
/// # Safety
/// As [`StreamEngine::issue`].
unsafe fn enqueue(
    target: &Target,
    state: &Arc<TicketState>,
    plan: &Plan,
    shared: &Arc<Shared>,
) -> std::result::Result<(), String> {
    match target {
        Target::Host(stream) => {
            let ticket = state.clone();
            let (direct, staged, gated) = (plan.direct.clone(), plan.staged.clone(), plan.gated);
            stream.enqueue(Box::new(move || {
                run_copies(&ticket, &direct);
                if gated {
                    ticket.wait_gate();
                    if !ticket.gate_failed() {
                        run_copies(&ticket, &staged);
                    }
                }
                if !ticket.commits {
                    ticket.publish_data_status();
                }
            }));
            let marker = Marker::new(state, shared);
            stream.enqueue(Box::new(move || marker.fire()));
            Ok(())
        }
        Target::Device { ops, stream } => {
            for c in &plan.direct {
                // SAFETY: forwarded from the caller.
                unsafe { ops.enqueue_copy(*stream, c.dst, c.src, c.len)? };
            }
            if plan.gated {
                let slot = state.slot();
                // SAFETY: the slot lives as long as the ticket, which the marker keeps.
                unsafe {
                    ops.enqueue_wait(
                        *stream,
                        slot.gate_host(),
                        slot.gate_device(),
                        slot.generation(),
                        shared.config.timeout + Duration::from_secs(1),
                    )?
                };
                for c in &plan.staged {
                    // SAFETY: forwarded from the caller.
                    unsafe { ops.enqueue_copy(*stream, c.dst, c.src, c.len)? };
                }
            }
            let raw = Arc::into_raw(Marker::new(state, shared).0);
            // SAFETY: `raw` is reclaimed by `release_marker`; if enqueueing fails it is
            // leaked (see `issue`).
            unsafe { ops.enqueue_host_fn(*stream, release_marker, raw as *mut c_void) }
        }
    }
}

/// Host-stream copies (any memory kind: `memcpy_safe` routes device memory to the driver).
/// A failed copy fails its key (`TRANSFER_FAIL`) in `ticket`; the key's remaining copies are
/// skipped, as are those of keys that failed before, so a failed key's destination gets no
/// more bytes and a put never commits it.
fn run_copies(ticket: &TicketState, copies: &[Copy]) {
    for c in copies.iter().filter(|c| !ticket.key_failed(c.key)) {
        // SAFETY: the ranges are valid until the marker (the issue contract).
        if let Err(e) = unsafe { device::memcpy_safe(c.dst as *mut u8, c.src as *const u8, c.len) }
        {
            tracing::warn!(ticket = ticket.id, key = c.key, error = %e, "host-stream copy failed");
            ticket.fail_key(c.key, ErrorCode::TransferFail);
        }
    }
}

/// What the release marker carries: the ticket, to hand to the housekeeper.
struct Marker(Arc<MarkerData>);

struct MarkerData {
    ticket: Arc<TicketState>,
    released: Sender<Arc<TicketState>>,
}

impl Marker {
    fn new(state: &Arc<TicketState>, shared: &Shared) -> Marker {
        Marker(Arc::new(MarkerData {
            ticket: state.clone(),
            released: shared.released.clone(),
        }))
    }

    /// Hands the ticket to the housekeeper: no blocking, no runtime call.
    fn fire(self) {
        let _ = self.0.released.send(self.0.ticket.clone());
    }
}

/// The device streams' release marker (a runtime host function).
unsafe extern "C" fn release_marker(arg: *mut c_void) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` came from `Arc::into_raw` in `enqueue`, reclaimed only here.
    let data = unsafe { Arc::from_raw(arg as *const MarkerData) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Marker(data).fire()));
}

fn housekeeper(shared: &Arc<Shared>, released: &Receiver<Arc<TicketState>>) {
    let dispatch = |ticket: Arc<TicketState>| {
        if ticket.commits {
            let on_worker = shared.clone();
            let queued = ticket.clone();
            let job: Job = Box::new(move || {
                release(&on_worker, &queued);
                false
            });
            if shared.pool.submit(job) {
                return;
            }
        }
        release(shared, &ticket);
    };
    loop {
        match released.recv_timeout(Duration::from_millis(10)) {
            Ok(ticket) => dispatch(ticket),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(ticket) = released.try_recv() {
            dispatch(ticket);
        }
        if shared.closed.load(Ordering::Acquire) && shared.outstanding.lock().is_empty() {
            return;
        }
    }
}

/// The deadline timer: every 10 ms, opens the gates of tickets past their deadline with
/// `TRANSFER_TIMEOUT` and detaches fetches still running past it (see `workers`). Makes no
/// call that can block; ends when `stop` is dropped.
fn deadline_timer(shared: &Shared, stop: &Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(Duration::from_millis(10)) {
        let now = Instant::now();
        let late: Vec<Arc<TicketState>> = shared
            .outstanding
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|t| t.gated && !t.gate_is_open() && now >= t.deadline)
            .collect();
        for ticket in late {
            let opened = ticket.open_gate_then(Err(ErrorCode::TransferTimeout), || {
                shared.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            });
            if opened {
                tracing::warn!(
                    ticket = ticket.id,
                    "stream ticket timed out; gate opened with TRANSFER_TIMEOUT"
                );
            }
        }
        shared.pool.hand_off_overdue(now);
    }
}

fn release(shared: &Shared, ticket: &TicketState) {
    shared.outstanding.lock().remove(&ticket.id);
    ticket.release(|status| {
        let counter = if status == 0 {
            &shared.counters.ok
        } else {
            &shared.counters.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    });
}
