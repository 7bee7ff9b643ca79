//! The get family: `get_into`, batch and multi-buffer gets, ranged gathers and
//! `get_buffer`.

use super::batch;
use super::buffer::{mc_buffer, mc_buffer_t};
use super::check;
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use crate::client::{Buf, RangeRequest};
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_char, c_int, c_void};

/// One fragment of `mc_store_get_into_ranges`: copy object bytes
/// `[src_offset, src_offset + size)` of `key` to `buffers[buffer_index] + dst_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mc_range {
    /// Index into the `buffers` / `buffer_sizes` arrays.
    pub buffer_index: usize,
    /// The object's key (NUL-terminated UTF-8, read during the call only).
    pub key: *const c_char,
    /// Destination offset inside the buffer.
    pub dst_offset: u64,
    /// Source offset inside the object.
    pub src_offset: u64,
    /// Bytes to copy.
    pub size: u64,
}
/// See `struct mc_range`.
pub type mc_range_t = mc_range;

/// Reads `key` into `buf` (`size` bytes). Returns the object size (>= 0); -600 when `buf` is
/// smaller than the object, `buf` is NULL with `size > 0`, the store/key is NULL or the store
/// is not set up; -704 missing, -703 still being written, -707 lease expired, -800 transfer
/// failure; -1 (panic, poisoned). Grants a read lease. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_get_into(
    store: *mut mc_store_t,
    key: *const c_char,
    buf: *mut c_void,
    size: usize,
) -> i64 {
    ffi_boundary!(poison: store, { get_into(store, key, buf, size) })
}

/// The body of [`mc_store_get_into`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn get_into(
    store: *mut mc_store_t,
    key: *const c_char,
    buf: *mut c_void,
    size: usize,
) -> Result<i64> {
    let client = mc_store::client(store)?;
    let key = check::cstr(key, "key")?;
    let buf = check::region(buf.cast_const(), size, "buf")?;
    // SAFETY: the caller promises a writable buffer (host or device) for the call.
    let mut results = unsafe { client.get_into_raw(&[key], vec![vec![buf]], false) };
    let n = results.pop().unwrap_or(Err(ErrorCode::InternalError))?;
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Batch `get_into`: `keys[i]` into `bufs[i]` (`sizes[i]` bytes), one master query.
///
/// Writes per key the object size or a negative code into `results[count]` and returns 0.
/// `results` NULL with `count > 0` → -600, nothing written; another unusable argument (NULL
/// array, NULL `keys[i]`, NULL `bufs[i]` with `sizes[i] > 0`, overlapping buffers) or a store
/// not set up → that code in the return value and in every slot. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_into(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, { batch_get_into(store, keys, bufs, sizes, count, results) })
}

/// The body of [`mc_store_batch_get_into`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn batch_get_into(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    results: *mut i64,
) -> Result<c_int> {
    batch::run(store, count, results, |client| {
        let keys = check::keys(keys, count)?;
        let lists = batch::flat_buffers(bufs, sizes, count)?;
        let bufs = batch::destinations(&lists)?;
        // SAFETY: the caller promises writable, non-overlapping buffers (host or device).
        Ok(unsafe { client.get_into_raw(&keys, bufs, false) })
    })
}

/// Reads key `i`'s object scattered over `buf_counts[i]` buffers `bufs[i][j]` of
/// `sizes[i][j]` bytes, in order. The sizes must add up to the object size exactly (less:
/// -600, more: -800, Mooncake's behaviour). Results contract as `mc_store_batch_get_into`
/// (per key the object size). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_into_multi_buffers(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *mut c_void,
    sizes: *const *const usize,
    buf_counts: *const usize,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let lists = batch::multi_buffers(bufs, sizes, buf_counts, count)?;
            let bufs = batch::destinations(&lists)?;
            // SAFETY: the caller promises writable, non-overlapping buffers (host or device).
            Ok(unsafe { client.get_into_raw(&keys, bufs, true) })
        })
    })
}

/// Gathers `range_count` fragments (see `mc_range_t`) into `buffer_count` buffers with one
/// master query. Writes per fragment the bytes copied or a negative code into
/// `results[range_count]` (-600 for a fragment past its buffer or object, with a bad
/// `buffer_index`, or whose destination overlaps another fragment's — every fragment of an
/// overlap is refused and writes nothing; the key's query error; -707; -800) and returns 0. Batch-level errors
/// (NULL arrays with non-zero counts, NULL `key`, overlapping buffers, store not set up)
/// follow the contract of `mc_store_batch_get_into`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_get_into_ranges(
    store: *mut mc_store_t,
    buffers: *const *mut c_void,
    buffer_sizes: *const usize,
    buffer_count: usize,
    ranges: *const mc_range_t,
    range_count: usize,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, range_count, results, |client| {
            let lists = batch::flat_buffers(buffers, buffer_sizes, buffer_count)?;
            let bufs: Vec<Buf> = batch::destinations(&lists)?.into_iter().flatten().collect();
            let ranges = check::array(ranges, range_count, "ranges")?;
            gather(client, &bufs, ranges)
        })
    })
}

/// Runs flat ranges as a buffer-major [`RangeRequest`] (one key entry per range) and maps
/// the answers back to range order.
fn gather(
    client: &crate::client::Client,
    bufs: &[Buf],
    ranges: &[mc_range],
) -> Result<Vec<Result<u64>>> {
    let n = bufs.len();
    let mut keys = vec![Vec::new(); n];
    let (mut dst, mut src, mut sizes) = (
        vec![Vec::new(); n],
        vec![Vec::new(); n],
        vec![Vec::new(); n],
    );
    // Where each range landed: (buffer, entry) or None for a bad buffer index.
    let mut place = Vec::with_capacity(ranges.len());
    for (r, range) in ranges.iter().enumerate() {
        let key = check::cstr(range.key, &format!("ranges[{r}].key"))?;
        let i = range.buffer_index;
        if i >= n {
            place.push(None);
            continue;
        }
        place.push(Some((i, keys[i].len())));
        keys[i].push(key.to_string());
        dst[i].push(vec![range.dst_offset]);
        src[i].push(vec![range.src_offset]);
        sizes[i].push(vec![range.size]);
    }
    let request = RangeRequest {
        keys: &keys,
        dst_offsets: &dst,
        src_offsets: &src,
        sizes: &sizes,
    };
    // SAFETY: the caller promises writable, non-overlapping buffers (host or device).
    let answers = unsafe { client.get_into_ranges_raw(bufs, &request) };
    Ok(place
        .into_iter()
        .map(|at| match at {
            None => fail(ErrorCode::InvalidParams, "range buffer_index out of bounds"),
            Some((i, j)) => answers
                .get(i)
                .and_then(|row| row.get(j))
                .and_then(|frags| frags.first())
                .copied()
                .unwrap_or(Err(ErrorCode::InternalError)),
        })
        .collect())
}

/// Reads `key` into a new buffer owned by the caller (one copy into the client's local
/// buffer). On success stores it in `*out` and returns 0; the caller releases it with
/// `mc_buffer_free`. On failure sets `*out` to NULL (when `out` is not NULL) and returns
/// -600 (NULL store/key/out, not set up, local buffer absent or full), -704, -703, -707,
/// -800 or -1. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_get_buffer(
    store: *mut mc_store_t,
    key: *const c_char,
    out: *mut *mut mc_buffer_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        let out = check::out(out, "out")?;
        *out = std::ptr::null_mut();
        let client = mc_store::client(store)?;
        let key = check::cstr(key, "key")?;
        *out = mc_buffer::into_raw(client.get_buffer(key)?);
        Ok(0)
    })
}

/// `mc_store_get_buffer` for `count` keys with one master query. Sets `out[i]` to a new
/// caller-owned buffer (free each with `mc_buffer_free`) or NULL, and `results[i]` to 0 or the
/// key's error; returns 0. `out` or `results` NULL with `count > 0` → -600, nothing written;
/// other batch-level errors set every `results[i]` to the code and every `out[i]` to NULL.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_get_buffer(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    out: *mut *mut mc_buffer_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        let out = check::array_mut(out, count, "out")?;
        // Both arrays are checked before `out` is written.
        check::array_mut(results, count, "results")?;
        check::fill(out, std::ptr::null_mut());
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let answers = client.batch_get_buffer(&keys);
            Ok(answers
                .into_iter()
                .zip(out.iter_mut())
                .map(|(answer, slot)| {
                    answer.map(|handle| {
                        *slot = mc_buffer::into_raw(handle);
                    })
                })
                .collect())
        })
    })
}
