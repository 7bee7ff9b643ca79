//! The put and upsert families. Both share one implementation, parameterised by [`Write`];
//! each exported function is a one-line delegation.
//!
//! Put is insert-if-absent (an existing key is kept and 0 returned, Mooncake's behaviour);
//! upsert inserts or overwrites. A total size of 0 is a silent no-op returning 0.

use super::batch;
use super::check;
use super::config::{self, mc_replicate_config_t};
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use crate::client::WriteMode;
use crate::error::Result;
use std::ffi::{c_char, c_int, c_void};

/// Which write family a call belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Put,
    Upsert,
}

// Caller buffers become address ranges (`check::region`), never slices: they may be device
// memory, which Rust must not dereference; the client's `*_raw` methods take them as such.
impl Write {
    fn mode(self) -> WriteMode {
        match self {
            Write::Put => WriteMode::Put,
            Write::Upsert => WriteMode::Upsert,
        }
    }

    /// Copying single-key write (`put`, `put_parts`, and their upserts).
    pub(crate) fn one(
        self,
        store: *const mc_store,
        key: *const c_char,
        parts: &[(*const c_void, usize)],
        cfg: *const mc_replicate_config_t,
    ) -> Result<c_int> {
        let client = mc_store::client(store)?;
        let key = check::cstr(key, "key")?;
        let cfg = config::replicate_config(cfg)?;
        let parts = batch::sources(&[parts.to_vec()])?;
        // SAFETY: the caller promises readable buffers (host or device) for the call.
        unsafe { client.copying_write_raw(&[key], parts, &cfg, self.mode()) }?;
        Ok(0)
    }

    /// Zero-copy single-key write (`put_from`, `upsert_from`).
    pub(crate) fn from(
        self,
        store: *const mc_store,
        key: *const c_char,
        buf: *const c_void,
        size: usize,
        cfg: *const mc_replicate_config_t,
    ) -> Result<c_int> {
        let client = mc_store::client(store)?;
        let key = check::cstr(key, "key")?;
        let cfg = config::replicate_config(cfg)?;
        let buf = check::region(buf, size, "buf")?;
        // SAFETY: the caller promises a readable buffer (host or device) for the call.
        let mut results = unsafe { client.write_raw(&[key], vec![vec![buf]], &cfg, self.mode()) };
        results.pop().unwrap_or(Ok(()))?;
        Ok(0)
    }

    /// Copying batch: 0 if every key succeeded, else the first per-key error.
    pub(crate) fn copy_batch(
        self,
        store: *const mc_store,
        keys: *const *const c_char,
        values: *const *const c_void,
        sizes: *const usize,
        count: usize,
        cfg: *const mc_replicate_config_t,
    ) -> Result<c_int> {
        let client = mc_store::client(store)?;
        let keys = check::keys(keys, count)?;
        let cfg = config::replicate_config(cfg)?;
        let values = batch::sources(&batch::flat_buffers(values, sizes, count)?)?;
        // SAFETY: the caller promises readable buffers (host or device) for the call.
        unsafe { client.copying_write_raw(&keys, values, &cfg, self.mode()) }?;
        Ok(0)
    }

    /// Zero-copy batch from per-key buffer lists; one result per key.
    pub(crate) fn zero_copy_batch(
        self,
        store: *const mc_store,
        keys: *const *const c_char,
        count: usize,
        lists: impl FnOnce() -> Result<Vec<Vec<(*const c_void, usize)>>>,
        cfg: *const mc_replicate_config_t,
        results: *mut c_int,
    ) -> Result<c_int> {
        batch::run(store, count, results, |client| {
            let keys = check::keys(keys, count)?;
            let cfg = config::replicate_config(cfg)?;
            let bufs = batch::sources(&lists()?)?;
            // SAFETY: the caller promises readable buffers (host or device) for the call.
            Ok(unsafe { client.write_raw(&keys, bufs, &cfg, self.mode()) })
        })
    }
}

/// Copying put of `size` bytes at `value` under `key` (staged through the local buffer).
///
/// Inputs are read during the call only. `value` may be NULL only when `size` is 0; a size of
/// 0 stores nothing and returns 0. An existing key is kept and 0 returned (insert-if-absent).
/// `cfg` NULL means defaults. Returns 0, or -600 (NULL store/key, NULL value with size > 0,
/// bad cfg, not set up, local buffer too small or absent), -200 (no space), another negative
/// code, -1 (panic, poisoned handle). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_put(
    store: *mut mc_store_t,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, { put(store, key, value, size, cfg) })
}

/// The body of [`mc_store_put`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn put(
    store: *mut mc_store_t,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> Result<c_int> {
    Write::Put.one(store, key, &[(value, size)], cfg)
}

/// Zero-copy put straight from `buf` (ideally memory registered with
/// `mc_store_register_buffer`). Same arguments, NULL rules and return codes as `mc_store_put`,
/// except that the local buffer is not used. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_put_from(
    store: *mut mc_store_t,
    key: *const c_char,
    buf: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, { put_from(store, key, buf, size, cfg) })
}

/// The body of [`mc_store_put_from`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn put_from(
    store: *mut mc_store_t,
    key: *const c_char,
    buf: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> Result<c_int> {
    Write::Put.from(store, key, buf, size, cfg)
}

/// Copying put of the concatenation of `count` parts (`parts[i]`, `sizes[i]` bytes each).
/// `parts`/`sizes` may be NULL only when `count` is 0; `parts[i]` may be NULL only when
/// `sizes[i]` is 0. A total of 0 bytes is a no-op. Return codes as `mc_store_put`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_put_parts(
    store: *mut mc_store_t,
    key: *const c_char,
    parts: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        let parts = batch::flat_buffers(parts, sizes, count)?;
        let parts: Vec<_> = parts.into_iter().flatten().collect();
        Write::Put.one(store, key, &parts, cfg)
    })
}

/// Copying batch put of `count` keys. Returns 0 if every key succeeded, else the first
/// per-key error; -600 for NULL arrays with `count > 0`, a NULL `keys[i]`, NULL `values[i]`
/// with `sizes[i] > 0`, or a size overflow. `count` 0 returns 0. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_put_batch(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    values: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        Write::Put.copy_batch(store, keys, values, sizes, count, cfg)
    })
}

/// Zero-copy batch put: key `keys[i]` gets `sizes[i]` bytes at `bufs[i]`.
///
/// Writes one code per key into `results[count]` (0 or negative) and returns 0. When
/// `results` is NULL with `count > 0` returns -600 and writes nothing; when another argument
/// is unusable (NULL array, NULL `keys[i]`, NULL `bufs[i]` with `sizes[i] > 0`, bad cfg) or the
/// store is not set up, returns that code and sets every `results[i]` to it. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_from(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, { batch_put_from(store, keys, bufs, sizes, count, cfg, results) })
}

/// The body of [`mc_store_batch_put_from`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn batch_put_from(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> Result<c_int> {
    let lists = || batch::flat_buffers(bufs, sizes, count);
    Write::Put.zero_copy_batch(store, keys, count, lists, cfg, results)
}

/// Zero-copy batch put where key `i`'s object is the concatenation of `buf_counts[i]` buffers
/// `bufs[i][j]` of `sizes[i][j]` bytes. Results contract as `mc_store_batch_put_from`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_put_from_multi_buffers(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *const c_void,
    sizes: *const *const usize,
    buf_counts: *const usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        let lists = || batch::multi_buffers(bufs, sizes, buf_counts, count);
        Write::Put.zero_copy_batch(store, keys, count, lists, cfg, results)
    })
}

/// Copying upsert (insert or overwrite). Arguments and return codes as `mc_store_put`; in
/// addition -708 / -714 when a replication task or a reader holds the object. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_upsert(
    store: *mut mc_store_t,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, { Write::Upsert.one(store, key, &[(value, size)], cfg) })
}

/// Zero-copy upsert; as `mc_store_put_from` but overwriting. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_upsert_from(
    store: *mut mc_store_t,
    key: *const c_char,
    buf: *const c_void,
    size: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, { Write::Upsert.from(store, key, buf, size, cfg) })
}

/// Copying upsert of concatenated parts; as `mc_store_put_parts` but overwriting.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_upsert_parts(
    store: *mut mc_store_t,
    key: *const c_char,
    parts: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        let parts = batch::flat_buffers(parts, sizes, count)?;
        let parts: Vec<_> = parts.into_iter().flatten().collect();
        Write::Upsert.one(store, key, &parts, cfg)
    })
}

/// Copying batch upsert; as `mc_store_put_batch` but overwriting. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_upsert_batch(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    values: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        Write::Upsert.copy_batch(store, keys, values, sizes, count, cfg)
    })
}

/// Zero-copy batch upsert; as `mc_store_batch_put_from` but overwriting. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_upsert_from(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    bufs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        let lists = || batch::flat_buffers(bufs, sizes, count);
        Write::Upsert.zero_copy_batch(store, keys, count, lists, cfg, results)
    })
}

/// Zero-copy batch upsert from scattered buffers; as
/// `mc_store_batch_put_from_multi_buffers` but overwriting. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_upsert_from_multi_buffers(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    bufs: *const *const *const c_void,
    sizes: *const *const usize,
    buf_counts: *const usize,
    cfg: *const mc_replicate_config_t,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        let lists = || batch::multi_buffers(bufs, sizes, buf_counts, count);
        Write::Upsert.zero_copy_batch(store, keys, count, lists, cfg, results)
    })
}
