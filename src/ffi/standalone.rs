//! The standalone layout from C: `mc_store_setup_dummy` (attach to a `mooncake_client` real
//! client on this host) and the shared-memory allocator `mc_shm_alloc` / `mc_shm_free`
//! (upstream's `MooncakeHostMemAllocator` / `alloc_from_mem_pool`). See docs/standalone.md.

use super::check;
use super::panic::ffi_boundary;
use super::store::{mc_store, mc_store_t};
use crate::client::Client;
use crate::standalone::ShmPool;
use std::ffi::{c_char, c_int, c_void};

/// Sets the store up as a *dummy* of the real client `server_address` (`"host:port"`, the
/// segment name `mooncake_client` prints after `READY`; it must run on this host). The dummy
/// owns no segment: its `local_buffer_size` local buffer is shared memory (memfd) the real
/// client maps, and every later store call is carried out by the real client, straight into
/// and out of this process's shared memory. Caller memory elsewhere is staged through a
/// shared block (one copy); memory from `mc_shm_alloc` moves with no copy, and only such
/// memory can be registered with `mc_store_register_buffer` (-600 otherwise).
/// `mem_pool_size` is accepted and unused (as upstream). `server_address` is read during the
/// call only.
///
/// Health: `mc_store_health_check` answers 2 while the real client cannot be reached; the
/// dummy reconnects by itself (pings every third of `MC_DUMMY_TTL_MS`, default 10 s) and
/// calls work again once it is back; a call while it is down fails with -800 within the TTL.
///
/// Returns 0; -600 for a NULL store or address, an address without a port, no real client
/// there (or one running an in-process master), or a store already set up; -1 after a
/// caught panic; master errors as `mc_store_setup`. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_setup_dummy(
    store: *mut mc_store_t,
    mem_pool_size: u64,
    local_buffer_size: u64,
    server_address: *const c_char,
) -> c_int {
    ffi_boundary!(poison: store, {
        mc_store::from_ptr(store)?;
        let address = check::cstr(server_address, "server_address")?;
        mc_store::install(store, || {
            Client::setup_dummy(mem_pool_size, local_buffer_size, address)
        })?;
        Ok(0)
    })
}

/// Allocates `size` bytes (rounded up to pages, zero-filled) of shared memory that a dummy's
/// real client can map: pass it to `mc_store_register_buffer` and the zero-copy calls of a
/// dummy store. Process-wide (not tied to a store). Returns the address, or NULL when `size`
/// is 0 or the OS refuses (message in `mc_last_error_message`).
///
/// Ownership: the caller frees it with `mc_shm_free`; a real client that mapped it keeps its
/// mapping until the dummy's next call. Thread-safe.
#[no_mangle]
#[must_use]
pub extern "C" fn mc_shm_alloc(size: usize) -> *mut c_void {
    ffi_boundary!({
        let block = ShmPool::global().alloc(size as u64, "mc_shm_alloc")?;
        Ok(block.addr() as *mut c_void)
    })
}

/// Frees memory from `mc_shm_alloc` (unregister it first if it was registered). Returns 0;
/// -600 for NULL or an address that is not the start of such memory. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_shm_free(ptr: *mut c_void) -> c_int {
    ffi_boundary!({
        ShmPool::global().free(ptr as usize)?;
        Ok(0)
    })
}
