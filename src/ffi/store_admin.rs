//! Existence, size, removal and metrics.

use super::batch;
use super::check;
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_char, c_int};

/// Whether `key` has a readable replica: 1 yes, 0 no (missing or still being written), or
/// -600 (NULL store/key, not set up), another negative code, -1 (panic, poisoned). Grants a
/// read lease when it exists (a following non-forced remove then gets -706). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_is_exist(store: *mut mc_store_t, key: *const c_char) -> c_int {
    ffi_boundary!(poison: store, { is_exist(store, key) })
}

/// The body of [`mc_store_is_exist`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn is_exist(store: *mut mc_store_t, key: *const c_char) -> Result<c_int> {
    let client = mc_store::client(store)?;
    Ok(c_int::from(client.is_exist(check::cstr(key, "key")?)?))
}

/// `mc_store_is_exist` for `count` keys with one master call: `results[i]` is 1, 0 or a
/// negative code; returns 0. Results contract as `mc_store_batch_get_into`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_is_exist(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, { batch_is_exist(store, keys, count, results) })
}

/// The body of [`mc_store_batch_is_exist`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn batch_is_exist(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    results: *mut c_int,
) -> Result<c_int> {
    batch::run(store, count, results, |client| {
        Ok(client.batch_is_exist(&check::keys(keys, count)?))
    })
}

/// The object size of `key` (>= 0), or -704 (missing), -600 (NULL store/key, not set up),
/// another negative code, -1 (panic, poisoned). Grants a read lease. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_get_size(store: *mut mc_store_t, key: *const c_char) -> i64 {
    ffi_boundary!(poison: store, { get_size(store, key) })
}

/// The body of [`mc_store_get_size`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn get_size(store: *mut mc_store_t, key: *const c_char) -> Result<i64> {
    let client = mc_store::client(store)?;
    let size = client.get_size(check::cstr(key, "key")?)?;
    Ok(i64::try_from(size).unwrap_or(i64::MAX))
}

/// Removes `key`. `force` non-zero ignores read leases. Returns 0, -704 (missing), -706
/// (leased and not forced), -703 (being written), -708 (replication task), -600 (NULL
/// store/key, not set up), -1 (panic, poisoned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_remove(
    store: *mut mc_store_t,
    key: *const c_char,
    force: c_int,
) -> c_int {
    ffi_boundary!(poison: store, { remove(store, key, force) })
}

/// The body of [`mc_store_remove`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn remove(store: *mut mc_store_t, key: *const c_char, force: c_int) -> Result<c_int> {
    let client = mc_store::client(store)?;
    client.remove(check::cstr(key, "key")?, force != 0)?;
    Ok(0)
}

/// `mc_store_remove` for `count` keys: `results[i]` is 0 or a negative code (a key listed
/// twice: 0 then -704); returns 0. Results contract as `mc_store_batch_get_into`.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_batch_remove(
    store: *mut mc_store_t,
    keys: *const *const c_char,
    count: usize,
    force: c_int,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        batch::run(store, count, results, |client| {
            Ok(client.batch_remove(&check::keys(keys, count)?, force != 0))
        })
    })
}

/// Removes every complete object whose key matches `pattern` (ECMAScript-like regular
/// expression, substring match; anchor with `^...$`), skipping leased objects unless `force`
/// is non-zero. Returns the number removed (>= 0); -600 for an invalid pattern, NULL
/// store/pattern or a store not set up; -1 (panic, poisoned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_remove_by_regex(
    store: *mut mc_store_t,
    pattern: *const c_char,
    force: c_int,
) -> i64 {
    ffi_boundary!(poison: store, { remove_by_regex(store, pattern, force) })
}

/// The body of [`mc_store_remove_by_regex`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn remove_by_regex(
    store: *mut mc_store_t,
    pattern: *const c_char,
    force: c_int,
) -> Result<i64> {
    let client = mc_store::client(store)?;
    let n = client.remove_by_regex(check::cstr(pattern, "pattern")?, force != 0)?;
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Removes every complete object (all tenants), skipping leased objects unless `force` is
/// non-zero. Returns the number removed (>= 0); -600 (NULL store, not set up); -1 (panic,
/// poisoned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_remove_all(store: *mut mc_store_t, force: c_int) -> i64 {
    ffi_boundary!(poison: store, { remove_all(store, force) })
}

/// The body of [`mc_store_remove_all`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn remove_all(store: *mut mc_store_t, force: c_int) -> Result<i64> {
    let n = mc_store::client(store)?.remove_all(force != 0)?;
    Ok(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Writes this client's counters as a JSON object (NUL-terminated) into `buf`.
///
/// `*needed` (when `needed` is not NULL) receives the size the JSON needs including its NUL,
/// also on failure. Returns 0; -600 when `len` is too small (nothing written except
/// `*needed`), `buf` is NULL with `len > 0`, or the store is NULL or not set up; -1 (panic,
/// poisoned). `mc_store_metrics_json(store, NULL, 0, &needed)` only sizes. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_metrics_json(
    store: *mut mc_store_t,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> c_int {
    ffi_boundary!(poison: store, {
        let client = mc_store::client(store)?;
        let json = match serde_json::to_string(&client.metrics()) {
            Ok(json) => json,
            Err(e) => return fail(ErrorCode::InternalError, format!("metrics to JSON: {e}")),
        };
        if !needed.is_null() {
            *check::out(needed, "needed")? = json.len() + 1;
        }
        check::write_cstr(buf, len, &json, "metrics JSON")?;
        Ok(0)
    })
}
