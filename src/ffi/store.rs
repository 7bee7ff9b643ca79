//! `mc_store_t`: the store handle, its life cycle (new/setup/init_all/teardown/free), health,
//! hostname and buffer registration.

use super::check;
use super::config::{self, mc_setup_config_t, MC_HEALTH_NOT_INITIALIZED};
use super::handle::{self, ClientSlot};
use super::panic::ffi_boundary;
use crate::client::Client;
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_char, c_int, c_void};

/// A store client handle (Mooncake's RealClient). Opaque.
///
/// Create with `mc_store_new`, set up with `mc_store_setup` or `mc_store_init_all`, release
/// with `mc_store_free`. Under the hood this is a `Box` holding a reader-writer lock around an
/// optional, reference-counted Rust client plus a poisoned flag.
///
/// Thread-safety: any number of threads may call any `mc_store_*` function on one handle at
/// once, except `mc_store_free`, which must be the last call. A data call racing with
/// `mc_store_teardown` either completes or fails with -600.
///
/// Methods: `mc_store_setup`, `mc_store_init_all`, `mc_store_teardown`,
/// `mc_store_health_check`, `mc_store_get_hostname`, `mc_store_register_buffer`,
/// `mc_store_unregister_buffer`, the put / upsert / get / session / exist / remove families,
/// `mc_store_metrics_json`, `mc_store_free`.
pub struct mc_store {
    slot: ClientSlot<Client>,
}
/// See `struct mc_store`.
pub type mc_store_t = mc_store;

impl mc_store {
    /// Marks the handle unusable after a caught panic.
    pub(crate) fn poison(&self) {
        self.slot.poison();
    }

    /// The handle, unless it is NULL or poisoned.
    pub(crate) fn from_ptr<'a>(store: *const mc_store) -> Result<&'a mc_store> {
        handle::checked(store, |s: &mc_store| &s.slot)
    }

    /// The set-up client (a cheap clone, so the lock is not held during the operation).
    pub(crate) fn client(store: *const mc_store) -> Result<Client> {
        Self::from_ptr(store)?
            .slot
            .client("store is not set up (call mc_store_setup first)")
    }

    /// Installs a client made by `make` unless one is already installed.
    pub(crate) fn install(
        store: *const mc_store,
        make: impl FnOnce() -> Result<Client>,
    ) -> Result<()> {
        Self::from_ptr(store)?.slot.install(make)
    }

    pub(crate) fn new_raw() -> *mut mc_store {
        crate::init_logging();
        Box::into_raw(Box::new(mc_store {
            slot: ClientSlot::new(),
        }))
    }

    /// Releases a handle from `new_raw` (NULL is fine).
    pub(crate) fn free_raw(store: *mut mc_store) {
        if store.is_null() {
            return;
        }
        // SAFETY: non-NULL; the caller passes a handle from `mc_store_new` exactly once.
        let store = unsafe { Box::from_raw(store) };
        if let Some(client) = store.slot.into_client() {
            client.teardown();
        }
    }

    pub(crate) fn teardown(store: *const mc_store) -> Result<()> {
        if let Some(client) = Self::from_ptr(store)?.slot.take() {
            client.teardown();
        }
        Ok(())
    }

    pub(crate) fn health(store: *const mc_store) -> Result<c_int> {
        Ok(match Self::from_ptr(store)?.slot.current() {
            Some(client) => client.health_check(),
            None => MC_HEALTH_NOT_INITIALIZED,
        })
    }

    /// Copies the hostname NUL-terminated into `buf`; -600 if it does not fit.
    pub(crate) fn hostname(store: *const mc_store, buf: *mut c_char, len: usize) -> Result<()> {
        let name = Self::client(store)?.get_hostname();
        check::write_cstr(buf, len, &name, "hostname")
    }
}

/// Creates an unconfigured store handle (logging to stderr is initialised; filter with the
/// `MC_LOG` environment variable). Data calls fail with -600 until `mc_store_setup` or
/// `mc_store_init_all` succeeds.
///
/// Ownership: the caller owns the handle and must release it with `mc_store_free`.
/// Returns NULL only if a panic was caught. Thread-safe.
#[no_mangle]
#[must_use]
pub extern "C" fn mc_store_new() -> *mut mc_store_t {
    ffi_boundary!({ Ok(mc_store::new_raw()) })
}

/// Tears the client down (as `mc_store_teardown`) and releases the handle.
///
/// Calling with NULL is fine. Must not be called twice with the same handle, nor while
/// another thread still uses it. Works on a poisoned handle.
#[no_mangle]
pub extern "C" fn mc_store_free(store: *mut mc_store_t) {
    ffi_boundary!({
        mc_store::free_raw(store);
        Ok(())
    })
}

/// Sets the store up (Mooncake's `setup_real`): connects to the master named in `config`
/// (or starts an in-process one), mounts a segment and registers the local buffer.
///
/// `config` is read during the call only; NULL string fields take the defaults documented on
/// `mc_setup_config_t`. Returns 0; -600 for a NULL store or config, an invalid field, or a
/// store that is already set up; -1 when no port could be bound, after a caught panic or on a
/// poisoned handle; a master or RPC error code (-300, -900, -901). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_setup(
    store: *mut mc_store_t,
    config: *const mc_setup_config_t,
) -> c_int {
    ffi_boundary!(poison: store, { setup(store, config) })
}

/// The body of [`mc_store_setup`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn setup(store: *mut mc_store_t, config: *const mc_setup_config_t) -> Result<c_int> {
    mc_store::from_ptr(store)?;
    let config = config::setup_config(config)?;
    mc_store::install(store, || Client::setup(config))?;
    Ok(0)
}

/// Mooncake's `initAll`: an in-process master and a client named `"localhost"` with a 1 GiB
/// local buffer and a `mount_segment_size` segment. `protocol` NULL means `"tcp"`,
/// `device_name` NULL means `""`; both are read during the call only.
///
/// Returns 0, or -600 (NULL store, bad argument, already set up), -1 (panic, poisoned).
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_init_all(
    store: *mut mc_store_t,
    protocol: *const c_char,
    device_name: *const c_char,
    mount_segment_size: u64,
) -> c_int {
    ffi_boundary!(poison: store, { init_all(store, protocol, device_name, mount_segment_size) })
}

/// The body of [`mc_store_init_all`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn init_all(
    store: *mut mc_store_t,
    protocol: *const c_char,
    device_name: *const c_char,
    mount_segment_size: u64,
) -> Result<c_int> {
    mc_store::from_ptr(store)?;
    let protocol = check::opt_cstr(protocol, "protocol")?.unwrap_or("tcp");
    let device = check::opt_cstr(device_name, "device_name")?.unwrap_or("");
    mc_store::install(store, || {
        Client::init_all(protocol, device, mount_segment_size)
    })?;
    Ok(0)
}

/// Tears the client down: unmounts its segment (objects stored only there disappear
/// cluster-wide) and stops its engine. Idempotent: returns 0 also when not set up. The handle
/// can be set up again afterwards. Returns -600 for a NULL store, -1 on a poisoned handle.
/// Thread-safe; calls racing with it fail with -600.
#[no_mangle]
pub extern "C" fn mc_store_teardown(store: *mut mc_store_t) -> c_int {
    ffi_boundary!(poison: store, {
        mc_store::teardown(store)?;
        Ok(0)
    })
}

/// Health: `MC_HEALTH_OK` (0), `MC_HEALTH_NOT_INITIALIZED` (1: before setup or after
/// teardown) or `MC_HEALTH_MASTER_UNREACHABLE` (2). -600 for a NULL store, -1 on a poisoned
/// handle. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_health_check(store: *mut mc_store_t) -> c_int {
    ffi_boundary!(poison: store, { health_check(store) })
}

/// The body of [`mc_store_health_check`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn health_check(store: *mut mc_store_t) -> Result<c_int> {
    mc_store::health(store)
}

/// Copies this client's segment name (`host:port` once a port was chosen) into `buf` as a
/// NUL-terminated string. Returns 0; -600 when `buf` is NULL, `len <= strlen(name)`, the store
/// is NULL or not set up; -1 on a poisoned handle. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_get_hostname(
    store: *mut mc_store_t,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    ffi_boundary!(poison: store, {
        mc_store::hostname(store, buf, len)?;
        Ok(0)
    })
}

/// Registers caller memory `[buf, buf + size)` for zero-copy puts and gets. The memory must
/// stay valid until `mc_store_unregister_buffer` or teardown; the store never frees it.
/// Returns 0; -600 for NULL `buf`, `size` 0, an overlap with a registered range, a NULL or
/// not set up store. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_register_buffer(
    store: *mut mc_store_t,
    buf: *mut c_void,
    size: usize,
) -> c_int {
    ffi_boundary!(poison: store, { register_buffer(store, buf, size) })
}

/// The body of [`mc_store_register_buffer`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn register_buffer(
    store: *mut mc_store_t,
    buf: *mut c_void,
    size: usize,
) -> Result<c_int> {
    let client = mc_store::client(store)?;
    if buf.is_null() || size == 0 {
        return fail(ErrorCode::InvalidParams, "buf is NULL or size is 0");
    }
    client.register_buffer(buf as usize, size)?;
    Ok(0)
}

/// Undoes `mc_store_register_buffer` for the range starting at `buf`. Returns 0; -600 for an
/// unknown or NULL address, a NULL or not set up store. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_store_unregister_buffer(store: *mut mc_store_t, buf: *mut c_void) -> c_int {
    ffi_boundary!(poison: store, { unregister_buffer(store, buf) })
}

/// The body of [`mc_store_unregister_buffer`], shared with the Mooncake C API's export (one panic
/// boundary per call, in the export).
pub(crate) fn unregister_buffer(store: *mut mc_store_t, buf: *mut c_void) -> Result<c_int> {
    let client = mc_store::client(store)?;
    if buf.is_null() {
        return fail(ErrorCode::InvalidParams, "buf is NULL");
    }
    client.unregister_buffer(buf as usize)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn the_handle_is_send_and_sync_as_documented() {
        assert_send_sync::<mc_store>();
    }

    /// The handle's address, to share it with a thread (the handle is `Send + Sync`).
    #[derive(Clone, Copy)]
    struct Shared(usize);

    impl Shared {
        fn ptr(self) -> *mut mc_store_t {
            self.0 as *mut mc_store_t
        }
    }

    #[test]
    fn health_check_answers_while_a_setup_waits_for_a_silent_master() {
        use std::net::TcpListener;
        use std::sync::mpsc;
        use std::time::{Duration, Instant};
        // A "master" that accepts the connection and never answers.
        let master = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std::ffi::CString::new(master.local_addr().unwrap().to_string()).unwrap();
        let host = std::ffi::CString::new("127.0.0.1").unwrap();
        let store = Shared(mc_store_new() as usize);
        let mut config = std::mem::MaybeUninit::<mc_setup_config_t>::uninit();
        config::mc_setup_config_init(config.as_mut_ptr());
        // SAFETY: initialised by `mc_setup_config_init`.
        let mut config = unsafe { config.assume_init() };
        config.local_hostname = host.as_ptr();
        config.master_server_addr = addr.as_ptr();
        config.global_segment_size = 0;
        config.local_buffer_size = 0;
        let config = Shared(&config as *const mc_setup_config_t as usize);
        std::thread::scope(|s| {
            let setup =
                s.spawn(move || mc_store_setup(store.ptr(), config.0 as *const mc_setup_config_t));
            master.set_nonblocking(true).unwrap();
            let start = Instant::now();
            let connection = loop {
                match master.accept() {
                    Ok((stream, _)) => break stream,
                    Err(_) if start.elapsed() < Duration::from_secs(10) => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("setup never connected: {e}"),
                }
            };
            let (tx, rx) = mpsc::channel();
            s.spawn(move || {
                let _ = tx.send((
                    mc_store_health_check(store.ptr()),
                    mc_store::client(store.ptr()).err(),
                ));
            });
            let answer = rx.recv_timeout(Duration::from_secs(2));
            drop(connection); // the setup now fails at once
            assert_eq!(
                answer,
                Ok((MC_HEALTH_NOT_INITIALIZED, Some(ErrorCode::InvalidParams))),
                "health_check and data calls must answer during a setup"
            );
            assert_ne!(setup.join().unwrap(), 0);
        });
        mc_store_free(store.ptr());
    }
}
