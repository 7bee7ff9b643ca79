//! Mooncake's existing C API (`include/store_c.h`, the 19 `mooncake_store_*` functions),
//! unchanged in signature and behaviour, on the same handle as the `mc_*` API.
//!
//! Each function first makes the argument checks Mooncake's `store_c.cpp` makes and returns
//! **-1** for them (Mooncake's convention for its own argument errors); then it runs the
//! internal body of the matching `mc_*` function (not the export: one panic boundary per
//! call), so everything else (codes, semantics) is shared. Batch functions
//! return 0 once their pointers passed the checks, with per-key codes in `results_out`, as
//! Mooncake does. These items are declared by the hand-written `include/store_c.h`, not by
//! the generated header.

use super::check;
use super::config::{mc_replicate_config, MC_SOFT_PIN_ENABLE, MC_SOFT_PIN_PRESERVE};
use super::error::MC_ERR_INTERNAL;
use super::panic::ffi_boundary;
use super::store::{self, mc_store};
use super::{config, store_admin, store_get, store_put};
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_char, c_int, c_void};

/// Mooncake's handle type (`typedef void *mooncake_store_t`).
pub type mooncake_store_t = *mut c_void;

/// Mooncake's `struct mooncake_replicate_config` (32 bytes on LP64).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mooncake_replicate_config {
    /// Memory replicas; copied verbatim (0 gives -600).
    pub replica_num: usize,
    /// Non-zero: soft pin with the master's default TTL; 0: preserve.
    pub with_soft_pin: c_int,
    /// Non-zero: hard pin.
    pub with_hard_pin: c_int,
    /// Preferred segment names (NULL entries skipped).
    pub preferred_segments: *mut *const c_char,
    /// Number of entries in `preferred_segments`.
    pub preferred_segments_count: usize,
}
/// See `struct mooncake_replicate_config`.
pub type mooncake_replicate_config_t = mooncake_replicate_config;

/// Mooncake's own argument check: -1 with a message when `ok` is false.
fn require(ok: bool, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        fail(ErrorCode::InternalError, format!("store_c: {what}"))
    }
}

/// Translates Mooncake's config into ours (NULL stays NULL = defaults).
fn config_of(cfg: *const mooncake_replicate_config_t) -> Option<mc_replicate_config> {
    // SAFETY: NULL is checked by `as_ref`; otherwise the caller's live struct.
    unsafe { cfg.as_ref() }.map(|c| mc_replicate_config {
        replica_num: c.replica_num as u64,
        soft_pin_action: if c.with_soft_pin != 0 {
            MC_SOFT_PIN_ENABLE
        } else {
            MC_SOFT_PIN_PRESERVE
        },
        soft_pin_ttl_ms: -1,
        with_hard_pin: c.with_hard_pin,
        preferred_segments: c.preferred_segments.cast_const(),
        preferred_segments_count: c.preferred_segments_count,
    })
}

fn cfg_ptr(cfg: &Option<mc_replicate_config>) -> *const mc_replicate_config {
    cfg.as_ref().map_or(std::ptr::null(), |c| c as *const _)
}

/// Mooncake's batch checks: every array non-NULL, every key non-NULL, and with `bufs`, no NULL
/// buffer with a non-zero size.
fn batch_args(
    keys: *mut *const c_char,
    bufs: Option<(*mut *mut c_void, *const usize)>,
    count: usize,
    results: bool,
) -> Result<()> {
    require(!keys.is_null() && results, "NULL argument")?;
    for &k in check::array(keys.cast_const(), count, "keys")? {
        require(!k.is_null(), "NULL key")?;
    }
    if let Some((bufs, sizes)) = bufs {
        require(!bufs.is_null() && !sizes.is_null(), "NULL argument")?;
        let bufs = check::array(bufs.cast_const(), count, "buffers")?;
        let sizes = check::array(sizes, count, "sizes")?;
        for (b, &size) in bufs.iter().zip(sizes) {
            require(
                !b.is_null() || size == 0,
                "NULL buffer with a non-zero size",
            )?;
        }
    }
    Ok(())
}

/// The batch result: -1 only for a panic or a poisoned handle, else 0 (slots are filled).
fn batch_rc(rc: Result<c_int>) -> c_int {
    if rc.unwrap_or_else(ErrorCode::code) == MC_ERR_INTERNAL {
        MC_ERR_INTERNAL
    } else {
        0
    }
}

/// Mooncake C API: creates a handle (`mc_store_new`). Release with `mooncake_store_destroy`.
#[no_mangle]
pub extern "C" fn mooncake_store_create() -> mooncake_store_t {
    ffi_boundary!({ Ok(mc_store::new_raw().cast::<c_void>()) })
}

/// Mooncake C API: tears down and releases the handle; NULL-safe.
#[no_mangle]
pub extern "C" fn mooncake_store_destroy(store: mooncake_store_t) {
    ffi_boundary!({
        mc_store::free_raw(store.cast());
        Ok(())
    })
}

/// Mooncake C API: `setup_real`. NULL strings become `""`, except `protocol` (`"tcp"`) and
/// `master_server_addr` (`"127.0.0.1:50051"`); `"embedded"` selects the in-process master.
/// -1 if the store is NULL.
#[no_mangle]
pub extern "C" fn mooncake_store_setup(
    store: mooncake_store_t,
    local_hostname: *const c_char,
    metadata_server: *const c_char,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: *const c_char,
    device_name: *const c_char,
    master_server_addr: *const c_char,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        let or = |p: *const c_char, d: &'static std::ffi::CStr| if p.is_null() { d.as_ptr() } else { p };
        let config = config::mc_setup_config {
            local_hostname: or(local_hostname, c""),
            metadata_server: or(metadata_server, c""),
            global_segment_size,
            local_buffer_size,
            protocol: or(protocol, c"tcp"),
            device_name: or(device_name, c""),
            master_server_addr: or(master_server_addr, c"127.0.0.1:50051"),
            ssd_offload_path: c"".as_ptr(),
        };
        store::setup(store.cast(), &config)
    })
}

/// Mooncake C API: `initAll` (in-process master, client "localhost"). -1 if the store is
/// NULL.
#[no_mangle]
pub extern "C" fn mooncake_store_init_all(
    store: mooncake_store_t,
    protocol: *const c_char,
    device_name: *const c_char,
    mount_segment_size: u64,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        store::init_all(
            store.cast(),
            protocol,
            device_name,
            mount_segment_size,
        )
    })
}

/// Mooncake C API: 0 healthy, 1 not initialised, 2 master unreachable; -1 if NULL.
#[no_mangle]
pub extern "C" fn mooncake_store_health_check(store: mooncake_store_t) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        store::health_check(store.cast())
    })
}

/// Mooncake C API: copying put. -1 if the store or key is NULL or `value` is NULL with
/// `size > 0`.
#[no_mangle]
pub extern "C" fn mooncake_store_put(
    store: mooncake_store_t,
    key: *const c_char,
    value: *const c_void,
    size: usize,
    config: *const mooncake_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        require(!value.is_null() || size == 0, "NULL value with a non-zero size")?;
        let cfg = config_of(config);
        store_put::put(store.cast(), key, value, size, cfg_ptr(&cfg))
    })
}

/// Mooncake C API: zero-copy put. -1 as `mooncake_store_put`.
#[no_mangle]
pub extern "C" fn mooncake_store_put_from(
    store: mooncake_store_t,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
    config: *const mooncake_replicate_config_t,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        require(!buffer.is_null() || size == 0, "NULL buffer with a non-zero size")?;
        let cfg = config_of(config);
        store_put::put_from(store.cast(), key, buffer, size, cfg_ptr(&cfg))
    })
}

/// Mooncake C API: zero-copy batch put; 0 with per-key codes in `results_out`. -1 if any
/// pointer or key is NULL or a buffer is NULL with a non-zero size.
#[no_mangle]
pub extern "C" fn mooncake_store_batch_put_from(
    store: mooncake_store_t,
    keys: *mut *const c_char,
    buffers: *mut *mut c_void,
    sizes: *const usize,
    count: usize,
    config: *const mooncake_replicate_config_t,
    results_out: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        batch_args(keys, Some((buffers, sizes)), count, !results_out.is_null())?;
        let cfg = config_of(config);
        Ok(batch_rc(store_put::batch_put_from(
            store.cast(),
            keys.cast_const(),
            buffers.cast_const().cast(),
            sizes,
            count,
            cfg_ptr(&cfg),
            results_out,
        )))
    })
}

/// Mooncake C API: reads `key` into `buffer`; bytes or a negative code. -1 for a NULL store
/// or key, or a NULL buffer with a non-zero size.
#[no_mangle]
pub extern "C" fn mooncake_store_get_into(
    store: mooncake_store_t,
    key: *const c_char,
    buffer: *mut c_void,
    size: usize,
) -> i64 {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        require(!buffer.is_null() || size == 0, "NULL buffer with a non-zero size")?;
        store_get::get_into(store.cast(), key, buffer, size)
    })
}

/// Mooncake C API: batch read; 0 with per-key bytes or codes in `results_out`. -1 on a NULL
/// argument.
#[no_mangle]
pub extern "C" fn mooncake_store_batch_get_into(
    store: mooncake_store_t,
    keys: *mut *const c_char,
    buffers: *mut *mut c_void,
    sizes: *const usize,
    count: usize,
    results_out: *mut i64,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        batch_args(keys, Some((buffers, sizes)), count, !results_out.is_null())?;
        Ok(batch_rc(store_get::batch_get_into(
            store.cast(),
            keys.cast_const(),
            buffers.cast_const(),
            sizes,
            count,
            results_out,
        )))
    })
}

/// Mooncake C API: 1 exists, 0 missing, negative error; -1 for a NULL store or key.
#[no_mangle]
pub extern "C" fn mooncake_store_is_exist(store: mooncake_store_t, key: *const c_char) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        store_admin::is_exist(store.cast(), key)
    })
}

/// Mooncake C API: batch existence; 0 with 1/0/negative per key in `results_out`. -1 on a
/// NULL argument.
#[no_mangle]
pub extern "C" fn mooncake_store_batch_is_exist(
    store: mooncake_store_t,
    keys: *mut *const c_char,
    count: usize,
    results_out: *mut c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        batch_args(keys, None, count, !results_out.is_null())?;
        Ok(batch_rc(store_admin::batch_is_exist(
            store.cast(),
            keys.cast_const(),
            count,
            results_out,
        )))
    })
}

/// Mooncake C API: object size or a negative code; -1 for a NULL store or key.
#[no_mangle]
pub extern "C" fn mooncake_store_get_size(store: mooncake_store_t, key: *const c_char) -> i64 {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        store_admin::get_size(store.cast(), key)
    })
}

/// Mooncake C API: copies the hostname (`""` before setup) NUL-terminated; -1 for a NULL
/// argument or `buf_len <= strlen(hostname)`.
#[no_mangle]
pub extern "C" fn mooncake_store_get_hostname(
    store: mooncake_store_t,
    buf_out: *mut c_char,
    buf_len: usize,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !buf_out.is_null(), "NULL argument")?;
        let name = match mc_store::client(store.cast()) {
            Ok(client) => client.get_hostname(),
            Err(ErrorCode::InvalidParams) => String::new(),
            Err(e) => return Err(e),
        };
        require(buf_len > name.len(), "buffer too small for the hostname")?;
        check::write_cstr(buf_out, buf_len, &name, "hostname")?;
        Ok(0)
    })
}

/// Mooncake C API: removes `key` (`force` non-zero ignores leases); -1 for a NULL store or
/// key.
#[no_mangle]
pub extern "C" fn mooncake_store_remove(
    store: mooncake_store_t,
    key: *const c_char,
    force: c_int,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !key.is_null(), "NULL store or key")?;
        store_admin::remove(store.cast(), key, force)
    })
}

/// Mooncake C API: removes matching objects; count or a negative code. -1 for a NULL store
/// or pattern.
#[no_mangle]
pub extern "C" fn mooncake_store_remove_by_regex(
    store: mooncake_store_t,
    pattern: *const c_char,
    force: c_int,
) -> i64 {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !pattern.is_null(), "NULL store or pattern")?;
        store_admin::remove_by_regex(store.cast(), pattern, force)
    })
}

/// Mooncake C API: removes every object; count or a negative code. -1 for a NULL store.
#[no_mangle]
pub extern "C" fn mooncake_store_remove_all(store: mooncake_store_t, force: c_int) -> i64 {
    ffi_boundary!(poison: store, {
        require(!store.is_null(), "store is NULL")?;
        store_admin::remove_all(store.cast(), force)
    })
}

/// Mooncake C API: registers memory for zero-copy; -1 for a NULL store or buffer or size 0.
#[no_mangle]
pub extern "C" fn mooncake_store_register_buffer(
    store: mooncake_store_t,
    buffer: *mut c_void,
    size: usize,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !buffer.is_null() && size > 0, "NULL argument or size 0")?;
        store::register_buffer(store.cast(), buffer, size)
    })
}

/// Mooncake C API: unregisters memory; -1 for a NULL store or buffer.
#[no_mangle]
pub extern "C" fn mooncake_store_unregister_buffer(
    store: mooncake_store_t,
    buffer: *mut c_void,
) -> c_int {
    ffi_boundary!(poison: store, {
        require(!store.is_null() && !buffer.is_null(), "NULL argument")?;
        store::unregister_buffer(store.cast(), buffer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicate_config_has_mooncakes_layout() {
        assert_eq!(std::mem::size_of::<mooncake_replicate_config>(), 32);
        assert_eq!(
            std::mem::offset_of!(mooncake_replicate_config, with_soft_pin),
            8
        );
        assert_eq!(
            std::mem::offset_of!(mooncake_replicate_config, with_hard_pin),
            12
        );
        assert_eq!(
            std::mem::offset_of!(mooncake_replicate_config, preferred_segments),
            16
        );
        assert_eq!(
            std::mem::offset_of!(mooncake_replicate_config, preferred_segments_count),
            24
        );
    }
}
