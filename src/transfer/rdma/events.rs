//! Completion events and asynchronous device events: one thread per open device.
//!
//! Two ways to wait for completions (`MC_RDMA_COMPLETION`, [`CompletionMode`]): `poll`, the
//! thread running work on a QP polls its CQ and yields between polls; `event`, its CQ is
//! attached to the device's completion channel, and between polls the thread arms the CQ
//! (`ibv_req_notify_cq`) and sleeps on the CQ's [`CqSignal`] until the device's event thread
//! reads a completion event for it (`ibv_get_cq_event`, acked at once).
//!
//! In both modes the event thread also reads the device's asynchronous events
//! (`ibv_get_async_event`): a CQ error (a CQ overrun: the NIC had more completions than the
//! CQ holds, and drops them) or a fatal QP error is raised on the [`CqSignal`] of that CQ or
//! QP, so the QP's runner fails at once instead of waiting for completions that will never
//! come.
//!
//! Ownership: every CQ and QP of this crate has a [`CqSignal`] as its `cq_context` /
//! `qp_context`, owned by the queue pair and freed only after the CQ and QP are destroyed.
//! libibverbs' destroy calls wait until every event of the CQ/QP handed out has been acked,
//! and the event thread acks an event only after it is done with the signal, so the thread
//! never touches a freed signal. [`DeviceEvents`] belongs to the [`super::RdmaDevice`] and is
//! stopped (thread joined, channel destroyed) before the device's context is closed, when no
//! CQ is left.

use super::verbs::{self, AsyncEvent, CompChannel, Context, Cq, Qp, Verbs};
use crate::error::{fail, ErrorCode, Result};
use parking_lot::{Condvar, Mutex};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// How long the event thread waits in `poll(2)` before it looks at its stop flag.
const STOP_CHECK_MS: c_int = 50;

/// How a QP's runner waits for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompletionMode {
    /// Poll the CQ, yielding the CPU between empty polls.
    Poll,
    /// Sleep until the device's completion channel reports a completion on the CQ.
    Event,
}

impl CompletionMode {
    /// `MC_RDMA_COMPLETION` (`poll` or `event`, any case); unset or anything else: the
    /// default, [`CompletionMode::Poll`].
    pub(crate) fn from_env() -> CompletionMode {
        match crate::env::RDMA_COMPLETION.get() {
            Some(text) if text.trim().eq_ignore_ascii_case("event") => CompletionMode::Event,
            _ => CompletionMode::Poll,
        }
    }
}

/// What a QP's runner and the device's event thread share about one CQ (and its QP): a
/// completion-event flag the runner sleeps on, and the asynchronous error that broke them.
/// Thread-safe.
#[derive(Default)]
pub(crate) struct CqSignal {
    fired: Mutex<bool>,
    wake: Condvar,
    /// 0: none; otherwise the `ibv_event_type` + 1 of the first error event.
    fault: AtomicU32,
}

impl CqSignal {
    /// A completion event arrived for the CQ.
    fn notify(&self) {
        *self.fired.lock() = true;
        self.wake.notify_all();
    }

    /// An asynchronous error event broke the CQ or QP; wakes a sleeping runner.
    fn raise(&self, event_type: u32) {
        let _ = self
            .fault
            .compare_exchange(0, event_type + 1, Ordering::AcqRel, Ordering::Acquire);
        self.notify();
    }

    /// The error event that broke the CQ or QP, described; `None` while healthy.
    pub(crate) fn fault(&self) -> Option<String> {
        let what = match self.fault.load(Ordering::Acquire).checked_sub(1)? {
            verbs::EVENT_CQ_ERR => {
                "completion queue overrun (IBV_EVENT_CQ_ERR: more completions than the CQ holds; \
                 raise MC_CQ_DEPTH to at least MC_MAX_WR)"
            }
            verbs::EVENT_QP_FATAL => "queue pair fatal error (IBV_EVENT_QP_FATAL)",
            verbs::EVENT_QP_REQ_ERR => "queue pair request error (IBV_EVENT_QP_REQ_ERR)",
            verbs::EVENT_QP_ACCESS_ERR => "queue pair access error (IBV_EVENT_QP_ACCESS_ERR)",
            _ => "asynchronous device error",
        };
        Some(what.to_string())
    }

    /// Sleeps until a completion event (or an error) is signalled or `until`; `true` when
    /// one was (and consumes it).
    pub(crate) fn wait(&self, until: Instant) -> bool {
        let mut fired = self.fired.lock();
        if !*fired {
            let _ = self.wake.wait_until(&mut fired, until);
        }
        std::mem::replace(&mut *fired, false)
    }
}

/// The device's completion channel and the thread reading it and the device's asynchronous
/// events. Not shared by `Arc`: owned by the device, which drops it before closing its
/// context.
pub(crate) struct DeviceEvents {
    verbs: &'static Verbs,
    channel: *mut CompChannel,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

// SAFETY: the channel is a handle any thread may use; it is destroyed only in `Drop`, after
// the thread is joined.
unsafe impl Send for DeviceEvents {}
// SAFETY: as above; `&self` only reads the channel pointer.
unsafe impl Sync for DeviceEvents {}

/// Raw handles moved into the event thread.
struct Handles {
    verbs: &'static Verbs,
    context: *mut Context,
    channel: *mut CompChannel,
}

// SAFETY: live until the thread is joined (see `DeviceEvents`).
unsafe impl Send for Handles {}

fn set_nonblocking(fd: c_int, what: &str) -> Result<()> {
    // SAFETY: fcntl on a descriptor the library owns; only O_NONBLOCK is added.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if !ok {
        return fail(
            ErrorCode::TransferFail,
            format_args!(
                "cannot make the {what} non-blocking: {}",
                std::io::Error::last_os_error()
            ),
        );
    }
    Ok(())
}

impl DeviceEvents {
    /// Creates the completion channel of `context` and starts the event thread.
    ///
    /// Errors: `TRANSFER_FAIL` when the channel or the thread cannot be created.
    ///
    /// # Safety
    /// `context` is open and stays open until the returned value is dropped.
    pub(crate) unsafe fn start(verbs: &'static Verbs, context: *mut Context) -> Result<Self> {
        // SAFETY: an open context (caller).
        let channel = unsafe { (verbs.create_comp_channel)(context) };
        if channel.is_null() {
            return fail(
                ErrorCode::TransferFail,
                format_args!(
                    "ibv_create_comp_channel failed: {}",
                    std::io::Error::last_os_error()
                ),
            );
        }
        let mut events = DeviceEvents {
            verbs,
            channel,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        };
        // SAFETY: both are live: the channel just created, the context (caller).
        let (channel_fd, async_fd) = unsafe { ((*channel).fd, (*context).async_fd) };
        set_nonblocking(channel_fd, "completion channel")?;
        set_nonblocking(async_fd, "asynchronous event descriptor")?;
        let handles = Handles {
            verbs,
            context,
            channel,
        };
        let stop = Arc::clone(&events.stop);
        let thread = std::thread::Builder::new()
            .name("mc-rdma-events".into())
            .spawn(move || {
                let handles = handles;
                // SAFETY: the handles stay live until this thread is joined.
                unsafe { run(&handles, &stop) }
            })
            .or_else(|e| {
                fail(
                    ErrorCode::TransferFail,
                    format_args!("cannot start the RDMA event thread: {e}"),
                )
            })?;
        events.thread = Some(thread);
        Ok(events)
    }

    /// The channel a CQ in event mode is attached to.
    pub(crate) fn channel(&self) -> *mut CompChannel {
        self.channel
    }
}

impl Drop for DeviceEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // SAFETY: created in `start`; no CQ is attached any more (the device is being
        // dropped, and every CQ's queue pair held a reference to it).
        let rc = unsafe { (self.verbs.destroy_comp_channel)(self.channel) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_comp_channel returned {rc}");
        }
    }
}

/// The event thread: waits on the channel and the async descriptor until `stop`.
///
/// # Safety
/// The handles are live for the whole call.
unsafe fn run(handles: &Handles, stop: &AtomicBool) {
    // SAFETY: live (caller).
    let (channel_fd, async_fd) = unsafe { ((*handles.channel).fd, (*handles.context).async_fd) };
    let mut fds = [
        libc::pollfd {
            fd: channel_fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: async_fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !stop.load(Ordering::Acquire) {
        // SAFETY: two initialised pollfd entries.
        let ready =
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, STOP_CHECK_MS) };
        if ready <= 0 {
            continue;
        }
        if fds.iter().any(|fd| fd.revents & libc::POLLNVAL != 0) {
            tracing::warn!("RDMA event thread: a descriptor is no longer valid; stopping");
            return;
        }
        if fds[0].revents != 0 {
            // SAFETY: live handles (caller).
            unsafe { completion_events(handles) };
        }
        if fds[1].revents != 0 {
            // SAFETY: live handles (caller).
            unsafe { async_events(handles) };
        }
    }
}

/// Reads every pending completion event, wakes the CQ's runner, acks the event.
///
/// # Safety
/// As [`run`].
unsafe fn completion_events(handles: &Handles) {
    loop {
        let mut cq: *mut Cq = std::ptr::null_mut();
        let mut context: *mut c_void = std::ptr::null_mut();
        // SAFETY: a live non-blocking channel; both out-pointers are valid.
        if unsafe { (handles.verbs.get_cq_event)(handles.channel, &mut cq, &mut context) } != 0 {
            return; // EAGAIN: nothing more.
        }
        // SAFETY: every CQ of this crate has a live CqSignal as its context until it is
        // destroyed, which waits for this event's ack below.
        if let Some(signal) = unsafe { context.cast::<CqSignal>().as_ref() } {
            signal.notify();
        }
        // SAFETY: the CQ the event named; acked once.
        unsafe { (handles.verbs.ack_cq_events)(cq, 1) };
    }
}

/// Reads every pending asynchronous event, raises CQ and QP errors on their signals, acks.
///
/// # Safety
/// As [`run`].
unsafe fn async_events(handles: &Handles) {
    loop {
        let mut event = AsyncEvent {
            element: std::ptr::null_mut(),
            event_type: 0,
        };
        // SAFETY: a live context with a non-blocking async descriptor.
        if unsafe { (handles.verbs.get_async_event)(handles.context, &mut event) } != 0 {
            return; // EAGAIN: nothing more.
        }
        // SAFETY: the element is the CQ or QP the event names, live until the event is
        // acked (their destroy calls wait for it); their contexts are CqSignals or null.
        let signal = unsafe {
            match event.event_type {
                verbs::EVENT_CQ_ERR => event
                    .element
                    .cast::<Cq>()
                    .as_ref()
                    .and_then(|cq| cq.cq_context.cast::<CqSignal>().as_ref()),
                verbs::EVENT_QP_FATAL | verbs::EVENT_QP_REQ_ERR | verbs::EVENT_QP_ACCESS_ERR => {
                    event
                        .element
                        .cast::<Qp>()
                        .as_ref()
                        .and_then(|qp| qp.qp_context.cast::<CqSignal>().as_ref())
                }
                _ => None,
            }
        };
        if let Some(signal) = signal {
            tracing::warn!("RDMA asynchronous event {}", event.event_type);
            signal.raise(event.event_type);
        }
        // SAFETY: the event just read, acked once.
        unsafe { (handles.verbs.ack_async_event)(&mut event) };
    }
}
