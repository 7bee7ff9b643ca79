//! Host streams, host events and tickets (`mc_host_stream_*`, `mc_host_event_*`,
//! `mc_ticket_*`): the C objects of the on-stream API (see `mc_store_*_on_stream`).

use super::check;
use super::panic::ffi_boundary;
use crate::error::{fail, ErrorCode, Result};
use crate::stream::{HostEvent, HostStream, Ticket};
use std::ffi::{c_int, c_void};
use std::time::Duration;

/// Returned by `mc_ticket_status`, `mc_ticket_wait`, `mc_host_event_query`,
/// `mc_host_event_wait` and `mc_host_stream_synchronize` while the work is not done yet.
pub const MC_PENDING: i32 = 1;

/// `stream_kind` of the on-stream calls: `stream` is an `mc_host_stream_t *`.
pub const MC_STREAM_HOST: i32 = 0;
/// `stream_kind`: `stream` is a CUDA `cudaStream_t` / `CUstream`.
pub const MC_STREAM_CUDA: i32 = 1;
/// `stream_kind`: `stream` is an Ascend `aclrtStream`.
pub const MC_STREAM_ASCEND: i32 = 2;

/// A host stream: functions and on-stream transfers run in enqueue order on one dedicated
/// thread. Opaque.
///
/// Created by `mc_host_stream_new`, released by `mc_host_stream_free` (which first runs
/// everything already enqueued). Thread-safety: every function may be called from any
/// thread; `mc_host_stream_free` must be the last call on the handle.
///
/// Methods: `mc_host_stream_launch`, `mc_host_stream_wait_event`,
/// `mc_host_stream_synchronize`; pass it as `stream` with `MC_STREAM_HOST`.
pub struct mc_host_stream {
    pub(crate) stream: HostStream,
}
/// See `struct mc_host_stream`.
pub type mc_host_stream_t = mc_host_stream;

/// A host event: a point in a host stream that other streams or threads can wait for.
/// Opaque; created by `mc_host_event_new`, released by `mc_host_event_free`. Thread-safe.
pub struct mc_host_event {
    event: HostEvent,
}
/// See `struct mc_host_event`.
pub type mc_host_event_t = mc_host_event;

/// The outcome of one on-stream call. Opaque; produced by the `mc_store_*_on_stream` calls
/// and owned by the caller until `mc_ticket_free`.
///
/// Freeing it before the stream has passed the call is safe: the library keeps what it
/// needs until the stream reaches the call's release point. Thread-safety: the query
/// functions may be called from any thread at once; `mc_ticket_free` must be the last call.
pub struct mc_ticket {
    pub(crate) ticket: Ticket,
}
/// See `struct mc_ticket`.
pub type mc_ticket_t = mc_ticket;

/// A C timeout in milliseconds: negative means no limit.
fn timeout(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

fn stream_ref<'a>(stream: *const mc_host_stream_t) -> Result<&'a HostStream> {
    // SAFETY: NULL is checked; otherwise a live stream from `mc_host_stream_new`.
    match unsafe { stream.as_ref() } {
        Some(s) => Ok(&s.stream),
        None => fail(ErrorCode::InvalidParams, "stream is NULL"),
    }
}

fn event_ref<'a>(event: *const mc_host_event_t) -> Result<&'a HostEvent> {
    // SAFETY: NULL is checked; otherwise a live event from `mc_host_event_new`.
    match unsafe { event.as_ref() } {
        Some(e) => Ok(&e.event),
        None => fail(ErrorCode::InvalidParams, "event is NULL"),
    }
}

fn ticket_ref<'a>(ticket: *const mc_ticket_t) -> Result<&'a Ticket> {
    // SAFETY: NULL is checked; otherwise a live ticket from an `_on_stream` call.
    match unsafe { ticket.as_ref() } {
        Some(t) => Ok(&t.ticket),
        None => fail(ErrorCode::InvalidParams, "ticket is NULL"),
    }
}

/// A new host stream and its thread; NULL when the thread cannot start (see
/// `mc_last_error_message`). Release it with `mc_host_stream_free`.
#[no_mangle]
pub extern "C" fn mc_host_stream_new() -> *mut mc_host_stream_t {
    ffi_boundary!({
        match HostStream::new() {
            Ok(stream) => Ok(Box::into_raw(Box::new(mc_host_stream { stream }))),
            Err(e) => fail(ErrorCode::InternalError, e),
        }
    })
}

/// Runs everything already enqueued on `stream`, then stops its thread and releases it.
/// NULL is fine. Blocks while enqueued work runs (an on-stream transfer waiting for its data
/// at most until its deadline, `MC_STREAM_TIMEOUT_MS`).
#[no_mangle]
pub extern "C" fn mc_host_stream_free(stream: *mut mc_host_stream_t) {
    ffi_boundary!({
        if !stream.is_null() {
            // SAFETY: a stream from `mc_host_stream_new`, freed once (the caller's contract).
            drop(unsafe { Box::from_raw(stream) });
        }
        Ok(())
    })
}

/// Enqueues `fn(arg)` on `stream`: it runs on the stream's thread after everything enqueued
/// before, and everything enqueued later waits for it (a host "kernel"). `arg` must stay
/// valid until `fn` ran. Returns 0; -600 for a NULL stream or function.
#[no_mangle]
pub extern "C" fn mc_host_stream_launch(
    stream: *mut mc_host_stream_t,
    func: Option<unsafe extern "C" fn(arg: *mut c_void)>,
    arg: *mut c_void,
) -> c_int {
    ffi_boundary!({
        let stream = stream_ref(stream)?;
        let Some(func) = func else {
            return fail(ErrorCode::InvalidParams, "func is NULL");
        };
        let arg = arg as usize;
        // SAFETY: the caller promises `func(arg)` is safe to call on another thread once.
        stream.launch(move || unsafe { func(arg as *mut c_void) });
        Ok(0)
    })
}

/// Makes work enqueued on `stream` after this call wait until `event`'s most recent record
/// (as of this call) completed. Returns 0; -600 for NULL arguments.
#[no_mangle]
pub extern "C" fn mc_host_stream_wait_event(
    stream: *mut mc_host_stream_t,
    event: *const mc_host_event_t,
) -> c_int {
    ffi_boundary!({
        stream_ref(stream)?.wait_event(event_ref(event)?);
        Ok(0)
    })
}

/// Waits until everything enqueued on `stream` before this call has run. Returns 0, or
/// `MC_PENDING` when `timeout_ms` (negative: no limit) passed first; -600 for NULL.
#[no_mangle]
pub extern "C" fn mc_host_stream_synchronize(
    stream: *mut mc_host_stream_t,
    timeout_ms: i64,
) -> c_int {
    ffi_boundary!({
        let done = stream_ref(stream)?.synchronize(timeout(timeout_ms));
        Ok(if done { 0 } else { MC_PENDING })
    })
}

/// A new host event (never recorded: it counts as complete). Release it with
/// `mc_host_event_free`. NULL only after an internal failure.
#[no_mangle]
pub extern "C" fn mc_host_event_new() -> *mut mc_host_event_t {
    ffi_boundary!({
        Ok(Box::into_raw(Box::new(mc_host_event {
            event: HostEvent::new(),
        })))
    })
}

/// Records `event` on `stream`: it completes when the stream has run everything enqueued
/// before this call. Returns 0; -600 for NULL arguments.
#[no_mangle]
pub extern "C" fn mc_host_event_record(
    event: *mut mc_host_event_t,
    stream: *mut mc_host_stream_t,
) -> c_int {
    ffi_boundary!({
        event_ref(event)?.record(stream_ref(stream)?);
        Ok(0)
    })
}

/// 0 when `event`'s most recent record completed (or it was never recorded), `MC_PENDING`
/// otherwise; -600 for NULL.
#[no_mangle]
pub extern "C" fn mc_host_event_query(event: *const mc_host_event_t) -> c_int {
    ffi_boundary!({
        Ok(if event_ref(event)?.query() {
            0
        } else {
            MC_PENDING
        })
    })
}

/// Waits for `event`'s most recent record to complete: 0, or `MC_PENDING` when `timeout_ms`
/// (negative: no limit) passed first; -600 for NULL.
#[no_mangle]
pub extern "C" fn mc_host_event_wait(event: *const mc_host_event_t, timeout_ms: i64) -> c_int {
    ffi_boundary!({
        let done = event_ref(event)?.wait(timeout(timeout_ms));
        Ok(if done { 0 } else { MC_PENDING })
    })
}

/// Releases an event. NULL is fine. Records still on a stream complete normally.
#[no_mangle]
pub extern "C" fn mc_host_event_free(event: *mut mc_host_event_t) {
    ffi_boundary!({
        if !event.is_null() {
            // SAFETY: an event from `mc_host_event_new`, freed once.
            drop(unsafe { Box::from_raw(event) });
        }
        Ok(())
    })
}

/// `MC_PENDING` until the stream has passed the call (its data is then in place), then 0 or
/// the first error: the transfer's (-800, -9003 `MC_ERR_TRANSFER_TIMEOUT`, -9004
/// `MC_ERR_CANCELLED` after teardown) or the first failed key's. -600 for NULL.
#[no_mangle]
pub extern "C" fn mc_ticket_status(ticket: *const mc_ticket_t) -> c_int {
    ffi_boundary!({ Ok(ticket_ref(ticket)?.status()) })
}

/// Waits until the ticket is final; returns its status, or `MC_PENDING` when `timeout_ms`
/// (negative: no limit) passed first. For host code outside graphs. -600 for NULL.
#[no_mangle]
pub extern "C" fn mc_ticket_wait(ticket: *const mc_ticket_t, timeout_ms: i64) -> c_int {
    ffi_boundary!({ Ok(ticket_ref(ticket)?.wait(timeout(timeout_ms))) })
}

/// Number of keys of the call (the length `mc_ticket_results` expects); 0 for NULL.
#[no_mangle]
pub extern "C" fn mc_ticket_key_count(ticket: *const mc_ticket_t) -> usize {
    ffi_boundary!({ Ok(ticket_ref(ticket)?.results().len()) })
}

/// Writes per key, in call order, the bytes read or the key's negative error into
/// `results[count]`; final once `mc_ticket_status` is not `MC_PENDING`. Returns 0; -600 for
/// NULL arguments or a `count` other than `mc_ticket_key_count`.
#[no_mangle]
pub extern "C" fn mc_ticket_results(
    ticket: *const mc_ticket_t,
    results: *mut i64,
    count: usize,
) -> c_int {
    ffi_boundary!({
        let answers = ticket_ref(ticket)?.results();
        if answers.len() != count {
            return fail(
                ErrorCode::InvalidParams,
                format!("the ticket has {} keys, not {count}", answers.len()),
            );
        }
        let slots = check::array_mut(results, count, "results")?;
        for (slot, answer) in slots.iter_mut().zip(answers) {
            *slot = match answer {
                Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
                Err(e) => i64::from(e.code()),
            };
        }
        Ok(0)
    })
}

/// The device-readable address of the ticket's status word (a 32-bit integer): `MC_PENDING`
/// until the call's data is known, then 0 or a negative code — written before the stream's
/// gate opens, so a kernel enqueued after the call reads the final value. For CUDA it is a
/// device pointer to mapped pinned memory; for host streams a host address. Valid until
/// `mc_ticket_free`. NULL for NULL.
#[no_mangle]
pub extern "C" fn mc_ticket_status_word(ticket: *const mc_ticket_t) -> *const i32 {
    ffi_boundary!({ Ok(ticket_ref(ticket)?.status_word() as *const i32) })
}

/// Releases the caller's handle. NULL is fine. Safe before the ticket is final.
#[no_mangle]
pub extern "C" fn mc_ticket_free(ticket: *mut mc_ticket_t) {
    ffi_boundary!({
        if !ticket.is_null() {
            // SAFETY: a ticket from an `_on_stream` call, freed once.
            drop(unsafe { Box::from_raw(ticket) });
        }
        Ok(())
    })
}
