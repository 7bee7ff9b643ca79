//! Session-based ranged transfers (layer-wise KV cache): get sessions pin a replica and
//! lease once, then ranged reads need no master call; put sessions reserve objects, accept
//! ranged writes, and are ended (committed) or revoked.

use super::batch;
use super::check;
use super::config::{self, mc_replicate_config_t};
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use crate::error::Result;
use std::ffi::{c_char, c_int, c_void};

/// Per-key offsets `offsets[i][j]` (`buf_counts[i]` entries each).
pub(super) fn offsets(
    offsets: *const *const u64,
    buf_counts: *const usize,
    count: usize,
    what: &str,
) -> Result<Vec<Vec<u64>>> {
    let counts = check::array(buf_counts, count, "buf_counts")?;
    Ok(batch::nested(offsets, counts, what)?
        .into_iter()
        .map(<[u64]>::to_vec)
        .collect())
}

/// Starts get sessions for `count` keys with one master query. `results[i]`: 0, the query
/// error (-704, ...), -707 (lease already expired) or -702 (no readable memory replica).
/// Restarting a key replaces its session. Results contract as `mc_store_batch_get_into`.
/// Thread-safe (sessions are per handle, shared by all threads).
#[no_mangle]
pub extern "C" fn mc_store_batch_get_session_start(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            Ok(client.batch_get_session_start(&check::keys(keys, count)?))
        })
    })
}

/// Ranged reads within get sessions, no master call: for key `i`, buffer `bufs[i][j]`
/// receives `sizes[i][j]` object bytes from offset `src_offsets[i][j]` (`buf_counts[i]`
/// fragments). `results[i]`: total bytes read, -600 (no session, range past the object) or
/// -707 (lease expired; the session is ended). Results contract as
/// `mc_store_batch_get_into`; overlapping destination buffers are rejected. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_into_multi_buffer_ranges(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *mut c_void,
    sizes: *const *const usize,
    src_offsets: *const *const u64,
    buf_counts: *const usize,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let lists = batch::multi_buffers(bufs, sizes, buf_counts, count)?;
            let src = offsets(src_offsets, buf_counts, count, "src_offsets")?;
            let bufs = batch::destinations(&lists)?;
            // SAFETY: the caller promises writable, non-overlapping buffers (host or device).
            Ok(unsafe { client.batch_get_into_multi_buffer_ranges_raw(&keys, bufs, &src) })
        })
    })
}

/// Ends get sessions (idempotent; unknown keys are ignored). Returns 0; -600 for a NULL
/// store/keys/`keys[i]` or a store not set up; -1 (panic, poisoned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_session_end(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
) -> c_int {
    ffi_boundary!(poison: store, {
        let client = mc_store::client(store)?;
        client.batch_get_session_end(&check::keys(keys, count)?)?;
        Ok(0)
    })
}

/// Starts put sessions: reserves `sizes[i]` bytes for each key at the master. `results[i]`:
/// 0, -600 (a session for the key already exists), -705 (the key exists), -702 (no memory
/// replica), another master error. `cfg` NULL means defaults. Results contract as
/// `mc_store_batch_put_from`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_session_start(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    sizes: *const u64,
    count: usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let sizes = check::array(sizes, count, "sizes")?;
            let cfg = config::replicate_config(cfg)?;
            Ok(client.batch_put_session_start(&keys, sizes, &cfg))
        })
    })
}

/// Ranged writes within put sessions, no master call: for key `i`, `sizes[i][j]` bytes at
/// `bufs[i][j]` go to object offset `dst_offsets[i][j]` on every memory replica.
/// `results[i]`: logical bytes written, -600 (no or sealed session, range past the object) or
/// the transfer error. Results contract as `mc_store_batch_put_from`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_from_multi_buffer_ranges(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *const c_void,
    sizes: *const *const usize,
    dst_offsets: *const *const u64,
    buf_counts: *const usize,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let lists = batch::multi_buffers(bufs, sizes, buf_counts, count)?;
            let dst = offsets(dst_offsets, buf_counts, count, "dst_offsets")?;
            let bufs = batch::sources(&lists)?;
            // SAFETY: the caller promises readable buffers (host or device) for the call.
            Ok(unsafe { client.batch_put_from_multi_buffer_ranges_raw(&keys, bufs, &dst) })
        })
    })
}

/// Seals put sessions, waits for their ranged writes and commits the objects (they become
/// readable). `results[i]`: 0 (session ended), -600 (no session) or the master's error (the
/// session is kept so the caller can retry or revoke). Results contract as
/// `mc_store_batch_put_from`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_session_end(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            Ok(client.batch_put_session_end(&check::keys(keys, count)?))
        })
    })
}

/// Seals put sessions, waits for their ranged writes and revokes the reservations.
/// `results[i]`: 0 (also when the master no longer knows the key), -600 (no session) or the
/// master's error (session kept). Results contract as `mc_store_batch_put_from`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_session_revoke(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            Ok(client.batch_put_session_revoke(&check::keys(keys, count)?))
        })
    })
}
