//! Gets and puts on a caller's stream (`mc_store_*_on_stream`): enqueue, return a ticket,
//! never wait for the transfer. See `crate::stream` for the design and `mc_ticket_t` for
//! outcomes.

use super::batch;
use super::check;
use super::config::{self, mc_replicate_config_t};
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use super::store_session::offsets;
use super::stream::{
    mc_host_stream_t, mc_ticket, mc_ticket_t, MC_STREAM_ASCEND, MC_STREAM_CUDA, MC_STREAM_HOST,
};
use crate::client::{Buf, Client};
use crate::error::{fail, ErrorCode, Result};
use crate::stream::{StreamRef, Ticket};
use std::ffi::{c_char, c_int, c_void};

/// The stream named by `(kind, stream)`; NULL `stream` is the blocking call.
fn stream_of<'a>(kind: i32, stream: *mut c_void) -> Result<StreamRef<'a>> {
    if stream.is_null() {
        return match kind {
            MC_STREAM_HOST | MC_STREAM_CUDA | MC_STREAM_ASCEND => Ok(StreamRef::Blocking),
            other => fail(
                ErrorCode::InvalidParams,
                format!("unknown stream_kind {other}"),
            ),
        };
    }
    match kind {
        MC_STREAM_HOST => {
            // SAFETY: non-NULL; the caller passes a live `mc_host_stream_t *` with this kind.
            let host = unsafe { &*(stream as *const mc_host_stream_t) };
            Ok(StreamRef::Host(&host.stream))
        }
        MC_STREAM_CUDA => Ok(StreamRef::Cuda(stream as usize)),
        MC_STREAM_ASCEND => Ok(StreamRef::Ascend(stream as usize)),
        other => fail(
            ErrorCode::InvalidParams,
            format!("unknown stream_kind {other}"),
        ),
    }
}

/// Common tail of the on-stream calls: checks `ticket_out`, runs `issue` with the store's
/// client and the stream, hands out the ticket.
fn issue(
    store: *mut mc_store_t,
    stream_kind: i32,
    stream: *mut c_void,
    ticket_out: *mut *mut mc_ticket_t,
    issue: impl FnOnce(&Client, StreamRef<'_>) -> Result<Ticket>,
) -> Result<c_int> {
    let out = check::out(ticket_out, "ticket")?;
    *out = std::ptr::null_mut();
    let client = mc_store::client(store)?;
    let ticket = issue(&client, stream_of(stream_kind, stream)?)?;
    *out = Box::into_raw(Box::new(mc_ticket { ticket }));
    Ok(0)
}

/// `mc_store_batch_get_into` on a stream: `keys[i]` into `bufs[i]` (`sizes[i]` bytes, at
/// least the object size), one master call (which pins the objects), then the copies are
/// enqueued on `stream` and the call returns without waiting for them.
///
/// `stream_kind`: `MC_STREAM_HOST` (`stream` is an `mc_host_stream_t *`), `MC_STREAM_CUDA`
/// (`cudaStream_t`) or `MC_STREAM_ASCEND` (`aclrtStream`) — never guessed from the pointer.
/// `stream` NULL runs the blocking call and returns a ticket that is already final. On a
/// CUDA/Ascend stream every destination must be device memory; a host stream takes any.
///
/// When the stream reaches any work enqueued after this call, every successful key's bytes
/// are in its buffer; `mc_ticket_status` / `mc_ticket_status_word` say whether all keys
/// succeeded. The buffers must stay valid and unused by others until then. The objects stay
/// pinned (not evicted, not freed by a forced remove) until the stream has passed the call.
///
/// Returns 0 and stores a ticket in `*ticket` (free it with `mc_ticket_free`); per-key
/// outcomes are in the ticket. Otherwise nothing was enqueued, `*ticket` is NULL and the
/// return value says why: -600 (bad arguments, store not set up, host destination on a
/// device stream, overlapping buffers), -1012 `MC_ERR_NOT_SUPPORTED` (no runtime for the
/// stream kind), -9002 `MC_ERR_STREAM_CAPTURE_UNSUPPORTED` (the stream is being captured:
/// issue the call on an uncaptured side stream and let the graph wait on an event recorded
/// after it), -9001 `MC_ERR_TRY_AGAIN` (ticket slots or staging exhausted for now), -1
/// (the runtime refused an enqueue). Thread-safe; capture-unsafe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_into_on_stream(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    stream_kind: i32,
    stream: *mut c_void,
    ticket: *mut *mut mc_ticket_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        issue(store, stream_kind, stream, ticket, |client, stream| {
            let keys = check::keys(keys, count)?;
            let lists = batch::flat_buffers(bufs, sizes, count)?;
            let bufs = batch::destinations(&lists)?;
            // SAFETY: the caller promises writable, non-overlapping buffers that stay valid
            // until the stream has passed the call.
            unsafe { client.batch_get_into_on_stream_raw(&keys, bufs, false, stream) }
        })
    })
}

/// `mc_store_batch_get_into_multi_buffers` on a stream: key `i`'s object scattered over
/// `buf_counts[i]` buffers `bufs[i][j]` of `sizes[i][j]` bytes (adding up to the object
/// size exactly). Stream, ticket and error contract as `mc_store_batch_get_into_on_stream`.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_into_multi_buffers_on_stream(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *mut c_void,
    sizes: *const *const usize,
    buf_counts: *const usize,
    stream_kind: i32,
    stream: *mut c_void,
    ticket: *mut *mut mc_ticket_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        issue(store, stream_kind, stream, ticket, |client, stream| {
            let keys = check::keys(keys, count)?;
            let lists = batch::multi_buffers(bufs, sizes, buf_counts, count)?;
            let bufs = batch::destinations(&lists)?;
            // SAFETY: as `mc_store_batch_get_into_on_stream`.
            unsafe { client.batch_get_into_on_stream_raw(&keys, bufs, true, stream) }
        })
    })
}

/// `mc_store_batch_get_into_multi_buffer_ranges` on a stream, inside get sessions (started
/// once with `mc_store_batch_get_session_start`): **no master call** — the session's pin
/// keeps each object. For key `i`, `bufs[i][j]` receives `sizes[i][j]` object bytes from
/// offset `src_offsets[i][j]` (`buf_counts[i]` fragments). Per-key errors in the ticket:
/// -600 (no session, range past the object). Stream, ticket and call errors as
/// `mc_store_batch_get_into_on_stream`. One call per layer is the intended use.
#[no_mangle]
pub extern "C" fn mc_store_get_into_ranges_on_stream(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *mut c_void,
    sizes: *const *const usize,
    src_offsets: *const *const u64,
    buf_counts: *const usize,
    stream_kind: i32,
    stream: *mut c_void,
    ticket: *mut *mut mc_ticket_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        issue(store, stream_kind, stream, ticket, |client, stream| {
            let keys = check::keys(keys, count)?;
            let lists = batch::multi_buffers(bufs, sizes, buf_counts, count)?;
            let bufs: Vec<Vec<Buf>> = batch::destinations(&lists)?;
            let src = offsets(src_offsets, buf_counts, count, "src_offsets")?;
            // SAFETY: as `mc_store_batch_get_into_on_stream`.
            unsafe {
                client.batch_get_into_multi_buffer_ranges_on_stream_raw(&keys, bufs, &src, stream)
            }
        })
    })
}

/// `mc_store_batch_put_from` ordered on a producer's stream: reserves the objects at the
/// master (`PutStart`) and returns; when the stream reaches this call (after the work that
/// produced the data) the sources `bufs[i]` (`sizes[i]` bytes) are copied into the reserved
/// replicas, and a worker then writes remote replicas and commits (`PutEnd`) — or revokes
/// (`PutRevoke`) on any failure, so nothing is ever half-visible.
///
/// The ticket becomes 0 only after the commit: a get issued after that sees the data; before
/// it a get sees the old state (insert-if-absent is unchanged: an existing key keeps its
/// value and reports 0 bytes). The sources must stay valid and unchanged until the stream
/// has passed the call. Per key in the ticket: bytes written, or the error (-9004
/// `MC_ERR_CANCELLED` when the store was torn down first). Same `stream_kind` / `stream`
/// rules as `mc_store_batch_get_into_on_stream` (NULL stream: the blocking put with a final
/// ticket; on a device stream sources must be device memory). Call errors as there, plus
/// -600 for a key listed twice or a bad `cfg` (NULL: defaults). Thread-safe; capture-unsafe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_from_on_stream(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
    stream_kind: i32,
    stream: *mut c_void,
    ticket: *mut *mut mc_ticket_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        issue(store, stream_kind, stream, ticket, |client, stream| {
            let keys = check::keys(keys, count)?;
            let cfg = config::replicate_config(cfg)?;
            let bufs = batch::sources(&batch::flat_buffers(bufs, sizes, count)?)?;
            // SAFETY: the caller promises readable sources that stay valid and unchanged
            // until the stream has passed the call.
            unsafe { client.batch_put_from_on_stream_raw(&keys, bufs, &cfg, stream) }
        })
    })
}

/// `mc_store_batch_put_from_multi_buffers` ordered on a stream: key `i`'s object is the
/// concatenation of `buf_counts[i]` buffers `bufs[i][j]` of `sizes[i][j]` bytes. Contract as
/// `mc_store_batch_put_from_on_stream`.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_from_multi_buffers_on_stream(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *const c_void,
    sizes: *const *const usize,
    buf_counts: *const usize,
    cfg: *const mc_replicate_config_t,
    stream_kind: i32,
    stream: *mut c_void,
    ticket: *mut *mut mc_ticket_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        issue(store, stream_kind, stream, ticket, |client, stream| {
            let keys = check::keys(keys, count)?;
            let cfg = config::replicate_config(cfg)?;
            let bufs = batch::sources(&batch::multi_buffers(bufs, sizes, buf_counts, count)?)?;
            // SAFETY: as `mc_store_batch_put_from_on_stream`.
            unsafe { client.batch_put_from_on_stream_raw(&keys, bufs, &cfg, stream) }
        })
    })
}
