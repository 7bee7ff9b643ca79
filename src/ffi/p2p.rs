//! `mc_p2p_store_t`: a P2P (V3) client handle (`setup_p2p_real_client`) and its put / get /
//! batch / exist / remove calls with a per-request transfer direction.

use super::batch::Slot;
use super::check;
use super::handle::{self, ClientSlot};
use super::panic::{ffi_boundary, Poison};
use crate::error::{fail, ErrorCode, Result};
use crate::p2p::{P2pClient, P2pSetupConfig, RequestOptions, TransferDirection};
use std::ffi::{c_char, c_int, c_void};

/// `direction`: the handle's `p2p_transfer_direction_mode` (REVERSE unless set up otherwise).
pub const MC_P2P_DIRECTION_DEFAULT: i32 = -1;
/// `direction`: REVERSE — the owner's transfer engine moves the bytes in one RPC.
pub const MC_P2P_DIRECTION_REVERSE: i32 = 0;
/// `direction`: FORWARD — this client's engine moves them (PreWrite/WriteCommit, PinKey).
pub const MC_P2P_DIRECTION_FORWARD: i32 = 1;

/// Arguments of `mc_p2p_store_setup` (Mooncake's `setup_p2p_real_client`). Plain data owned
/// by the caller; strings are read during the call only. Fill with
/// `mc_p2p_setup_config_init` first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mc_p2p_setup_config {
    /// This client's host, or `host:port`. Required (NULL or empty: -600).
    pub local_hostname: *const c_char,
    /// `"P2PHANDSHAKE"` or `"http://host:port/metadata"` (`https://` with TLS); NULL means `"P2PHANDSHAKE"`.
    pub metadata_server: *const c_char,
    /// TieredBackend JSON, e.g. `{"tiers":[{"type":"DRAM","capacity":67108864,"priority":100,
    /// "allocator_type":"OFFSET"}]}`; `{"tiers":[]}` makes a pure accessor. Required; bad JSON
    /// or an unknown tier type: -600 with a message.
    pub tiered_backend_config_json: *const c_char,
    /// Registered staging buffer of the REVERSE path: 0 (REVERSE disabled), or 1024..1 TiB.
    pub local_buffer_size: u64,
    /// Transport; NULL means `"tcp"` (the only one built).
    pub protocol: *const c_char,
    /// RDMA devices; NULL means `""`. Unused by tcp.
    pub rdma_devices: *const c_char,
    /// `"host:port"` of a master started with `--deployment_mode P2P`. Required.
    pub master_server_addr: *const c_char,
    /// Port of the client RPC service; 0 picks a free one.
    pub client_rpc_port: u16,
    /// Threads of the client RPC service; 0 means 16.
    pub client_rpc_thread_num: u32,
    /// Lease of PreWrite / PinKey records in ms (> 0; default 5000).
    pub p2p_key_lease_duration_ms: u64,
    /// Period of the expired-record scan in ms; 0 means 1000.
    pub p2p_key_lease_scan_interval_ms: u64,
    /// `"forward"` or `"reverse"`; NULL or `""` means `"reverse"`.
    pub p2p_transfer_direction_mode: *const c_char,
}
/// See `struct mc_p2p_setup_config`.
pub type mc_p2p_setup_config_t = mc_p2p_setup_config;

/// A P2P client handle. Opaque. Create with `mc_p2p_store_new`, set up with
/// `mc_p2p_store_setup`, release with `mc_p2p_store_free`.
///
/// Memory: the P2P data calls take host memory only (device pointers are supported by the
/// `mc_store_*` calls of the centralized deployment).
///
/// Thread-safety: any number of threads may call any `mc_p2p_store_*` function on one handle
/// at once, except `mc_p2p_store_free`, which must be the last call. A caught panic poisons
/// the handle (every later call: -1).
pub struct mc_p2p_store {
    slot: ClientSlot<P2pClient>,
}
/// See `struct mc_p2p_store`.
pub type mc_p2p_store_t = mc_p2p_store;

impl Poison for mc_p2p_store {
    fn poison(&self) {
        self.slot.poison();
    }
}

impl mc_p2p_store {
    fn from_ptr<'a>(store: *const mc_p2p_store) -> Result<&'a mc_p2p_store> {
        handle::checked(store, |s: &mc_p2p_store| &s.slot)
    }

    fn client(store: *const mc_p2p_store) -> Result<P2pClient> {
        Self::from_ptr(store)?
            .slot
            .client("P2P store is not set up (call mc_p2p_store_setup first)")
    }
}

/// A batch call's keys and its (buffer, size) pairs.
type BatchArgs<'a, P> = (Vec<&'a str>, Vec<(P, usize)>);

/// The keys and the (buffer, size) pairs of a batch call, checked.
fn batch_args<'a, P: Copy>(
    keys: *const *const c_char,
    bufs: *const P,
    sizes: *const usize,
    count: usize,
) -> Result<BatchArgs<'a, P>> {
    let keys = check::keys(keys, count)?;
    let bufs = check::array(bufs, count, "bufs")?;
    let sizes = check::array(sizes, count, "sizes")?;
    Ok((
        keys,
        bufs.iter().copied().zip(sizes.iter().copied()).collect(),
    ))
}

fn options(direction: i32) -> Result<RequestOptions> {
    Ok(RequestOptions {
        direction: match direction {
            MC_P2P_DIRECTION_DEFAULT => None,
            MC_P2P_DIRECTION_REVERSE => Some(TransferDirection::Reverse),
            MC_P2P_DIRECTION_FORWARD => Some(TransferDirection::Forward),
            other => {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("direction {other} is not one of MC_P2P_DIRECTION_*"),
                )
            }
        },
        preferred_owner: None,
    })
}

fn setup_config(config: *const mc_p2p_setup_config_t) -> Result<P2pSetupConfig> {
    // SAFETY: NULL is checked by `as_ref`; the caller promises a live struct otherwise.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return fail(ErrorCode::InvalidParams, "config is NULL");
    };
    let text = |p, what, default: &str| -> Result<String> {
        Ok(check::opt_cstr(p, what)?.unwrap_or(default).to_string())
    };
    let direction = check::opt_cstr(c.p2p_transfer_direction_mode, "direction mode")?;
    Ok(P2pSetupConfig {
        local_hostname: check::cstr(c.local_hostname, "local_hostname")?.to_string(),
        metadata_server: text(c.metadata_server, "metadata_server", "P2PHANDSHAKE")?,
        tiered_backend_config_json: check::cstr(c.tiered_backend_config_json, "tiers")?.to_string(),
        local_buffer_size: c.local_buffer_size,
        protocol: text(c.protocol, "protocol", "tcp")?,
        rdma_devices: text(c.rdma_devices, "rdma_devices", "")?,
        master_server_addr: check::cstr(c.master_server_addr, "master_server_addr")?.to_string(),
        client_rpc_port: c.client_rpc_port,
        client_rpc_thread_num: c.client_rpc_thread_num as usize,
        p2p_key_lease_duration_ms: c.p2p_key_lease_duration_ms,
        p2p_key_lease_scan_interval_ms: c.p2p_key_lease_scan_interval_ms,
        p2p_transfer_direction_mode: TransferDirection::parse(direction.unwrap_or(""))?,
    })
}

/// Fills `config` with the defaults: `"127.0.0.1"`, `"P2PHANDSHAKE"`, tiers `{"tiers":[]}`,
/// 16 MiB staging buffer, `"tcp"`, `""`, master `"127.0.0.1:50051"`, RPC port 0, 16 RPC
/// threads, lease 5000 ms, scan 1000 ms, `"reverse"`. The strings are static. NULL is
/// ignored. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_setup_config_init(config: *mut mc_p2p_setup_config_t) {
    ffi_boundary!({
        if let Ok(config) = check::out(config, "config") {
            let d = P2pSetupConfig::default();
            *config = mc_p2p_setup_config {
                local_hostname: c"127.0.0.1".as_ptr(),
                metadata_server: c"P2PHANDSHAKE".as_ptr(),
                tiered_backend_config_json: c"{\"tiers\":[]}".as_ptr(),
                local_buffer_size: d.local_buffer_size,
                protocol: c"tcp".as_ptr(),
                rdma_devices: c"".as_ptr(),
                master_server_addr: c"127.0.0.1:50051".as_ptr(),
                client_rpc_port: 0,
                client_rpc_thread_num: d.client_rpc_thread_num as u32,
                p2p_key_lease_duration_ms: d.p2p_key_lease_duration_ms,
                p2p_key_lease_scan_interval_ms: d.p2p_key_lease_scan_interval_ms,
                p2p_transfer_direction_mode: c"reverse".as_ptr(),
            };
        }
        Ok(())
    })
}

/// Creates an unconfigured P2P handle. Ownership: the caller releases it with
/// `mc_p2p_store_free`. Returns NULL only if a panic was caught. Thread-safe.
#[no_mangle]
#[must_use]
pub extern "C" fn mc_p2p_store_new() -> *mut mc_p2p_store_t {
    ffi_boundary!({
        crate::init_logging();
        Ok(Box::into_raw(Box::new(mc_p2p_store {
            slot: ClientSlot::new(),
        })))
    })
}

/// Tears the client down and releases the handle. NULL is fine. Must be the last call on the
/// handle, made once.
#[no_mangle]
pub extern "C" fn mc_p2p_store_free(store: *mut mc_p2p_store_t) {
    ffi_boundary!({
        if !store.is_null() {
            // SAFETY: non-NULL; a handle from `mc_p2p_store_new`, released exactly once.
            let store = unsafe { Box::from_raw(store) };
            if let Some(client) = store.slot.into_client() {
                client.teardown();
            }
        }
        Ok(())
    })
}

/// Sets the handle up as a P2P client (`setup_p2p_real_client`). Returns 0; -600 for a NULL
/// handle/config, bad arguments or tier JSON (see `mc_last_error_message`) or a handle already
/// set up; -1011 when the master is not in P2P mode; -900/-901 when the master cannot be
/// reached; -1 (panic, poisoned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_setup(
    store: *mut mc_p2p_store_t,
    config: *const mc_p2p_setup_config_t,
) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        let handle = mc_p2p_store::from_ptr(store)?;
        let config = setup_config(config)?;
        handle.slot.install(|| P2pClient::setup_p2p(config))?;
        Ok(0)
    })
}

/// Tears the client down (the handle stays valid; data calls then fail with -600). Returns 0.
#[no_mangle]
pub extern "C" fn mc_p2p_store_teardown(store: *mut mc_p2p_store_t) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        if let Some(client) = mc_p2p_store::from_ptr(store)?.slot.take() {
            client.teardown();
        }
        Ok(0)
    })
}

/// Stores `size` bytes at `buf` as `key` with `direction` (`MC_P2P_DIRECTION_*`). Returns 0;
/// -600 bad arguments; -705 exists; -714 a concurrent put of the key; -200 no space; -707
/// lease expired before commit; -800 transfer failure (a FORWARD write is revoked); -900/-901
/// owner unreachable; -1 (panic). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_put(
    store: *mut mc_p2p_store_t,
    key: *const c_char,
    buf: *const c_void,
    size: usize,
    direction: i32,
) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        let client = mc_p2p_store::client(store)?;
        let key = check::cstr(key, "key")?;
        let value = check::host_bytes(buf, size, "buf")?;
        client.put(key, value, &options(direction)?)?;
        Ok(0)
    })
}

/// Reads `key` into `buf` (`size` bytes) with `direction`. Returns the value size (>= 0);
/// -600 bad arguments or `buf` too small; -704 missing; -707 a FORWARD read outlived its pin;
/// -800 transfer failure; -900/-901 owner unreachable; -1 (panic). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_get_into(
    store: *mut mc_p2p_store_t,
    key: *const c_char,
    buf: *mut c_void,
    size: usize,
    direction: i32,
) -> i64 {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        let client = mc_p2p_store::client(store)?;
        let key = check::cstr(key, "key")?;
        let buf = check::bytes_mut(buf, size, "buf")?;
        let n = client.get_into(key, buf, &options(direction)?)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    })
}

/// Runs a P2P batch with the results contract of the C API (see `mc_store_batch_put_from`):
/// `results` NULL with `count > 0` → -600, nothing written; a batch-level error → that code
/// in the return value and every slot; otherwise 0 and one slot per key.
fn run_batch<S: Slot<R>, R>(
    store: *const mc_p2p_store,
    count: usize,
    results: *mut S,
    op: impl FnOnce(&P2pClient) -> Result<Vec<Result<R>>>,
) -> Result<c_int> {
    let slots = check::array_mut(results, count, "results")?;
    match mc_p2p_store::client(store).and_then(|client| op(&client)) {
        Ok(answers) if answers.len() == count => {
            for (slot, answer) in slots.iter_mut().zip(answers) {
                *slot = answer.map_or_else(S::err, S::ok);
            }
            Ok(0)
        }
        Ok(_) => Err(ErrorCode::InternalError),
        Err(code) => {
            check::fill(slots, S::err(code));
            Err(code)
        }
    }
}

/// Batch put: `keys[i]` = `bufs[i]` (`sizes[i]` bytes) on one owner with `direction`. Writes
/// per key 0 or a negative code into `results[count]` and returns 0 (batch-level errors:
/// see `mc_store_batch_put_from`). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_batch_put(
    store: *mut mc_p2p_store_t,
    keys: *const *const c_char,
    bufs: *const *const c_void,
    sizes: *const usize,
    count: usize,
    direction: i32,
    results: *mut c_int,
) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        run_batch(store, count, results, |client| {
            let (keys, bufs) = batch_args(keys, bufs, sizes, count)?;
            let values = bufs
                .iter()
                .map(|&(b, s)| check::host_bytes(b, s, "bufs[i]"))
                .collect::<Result<Vec<&[u8]>>>()?;
            Ok(client.batch_put(&keys, &values, &options(direction)?))
        })
    })
}

/// Batch get: `keys[i]` into `bufs[i]` (`sizes[i]` bytes) with `direction`. Writes per key
/// the value size or a negative code into `results[count]` and returns 0 (batch-level errors
/// as `mc_store_batch_get_into`; overlapping buffers: -600). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_batch_get_into(
    store: *mut mc_p2p_store_t,
    keys: *const *const c_char,
    bufs: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    direction: i32,
    results: *mut i64,
) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        run_batch(store, count, results, |client| {
            let (keys, bufs) = batch_args(keys, bufs, sizes, count)?;
            let ranges: Vec<(usize, usize)> = bufs.iter().map(|&(b, s)| (b as usize, s)).collect();
            check::disjoint(&ranges, "bufs")?;
            let mut views = bufs
                .iter()
                .map(|&(b, s)| check::bytes_mut(b, s, "bufs[i]"))
                .collect::<Result<Vec<&mut [u8]>>>()?;
            Ok(client.batch_get_into(&keys, &mut views, &options(direction)?))
        })
    })
}

/// 1 if `key` exists, 0 if not, negative on error. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_p2p_store_is_exist(store: *mut mc_p2p_store_t, key: *const c_char) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        let client = mc_p2p_store::client(store)?;
        Ok(c_int::from(client.is_exist(check::cstr(key, "key")?)?))
    })
}

/// Removes `key` at its owner. Returns 0; -704 missing; -900/-901 owner unreachable.
#[no_mangle]
pub extern "C" fn mc_p2p_store_remove(store: *mut mc_p2p_store_t, key: *const c_char) -> c_int {
    ffi_boundary!(poison_handle: store as *const mc_p2p_store, {
        let client = mc_p2p_store::client(store)?;
        client.remove(check::cstr(key, "key")?)?;
        Ok(0)
    })
}
