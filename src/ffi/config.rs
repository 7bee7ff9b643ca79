//! `mc_setup_config_t` and `mc_replicate_config_t`: plain C structs, their `_init` functions
//! and their checked conversion into the client's Rust types.

use super::check;
use super::panic::ffi_boundary;
use crate::client::{SetupConfig, EMBEDDED_MASTER, P2P_HANDSHAKE};
use crate::error::{fail, ErrorCode, Result};
use crate::types::{ReplicateConfig, SoftPinAction};
use std::ffi::{c_char, c_int};

/// `soft_pin_action`: keep the object's soft pin as it is (default).
pub const MC_SOFT_PIN_PRESERVE: i32 = 0;
/// `soft_pin_action`: soft-pin the object (for `soft_pin_ttl_ms`, or the master's default).
pub const MC_SOFT_PIN_ENABLE: i32 = 1;
/// `soft_pin_action`: clear the soft pin.
pub const MC_SOFT_PIN_DISABLE: i32 = 2;

/// `mc_store_health_check`: set up, and the master answered the last ping.
pub const MC_HEALTH_OK: i32 = 0;
/// `mc_store_health_check`: not set up, or torn down.
pub const MC_HEALTH_NOT_INITIALIZED: i32 = 1;
/// `mc_store_health_check`: the last master ping failed.
pub const MC_HEALTH_MASTER_UNREACHABLE: i32 = 2;

/// Arguments of `mc_store_setup` (Mooncake's `setup_real`). Plain data owned by the caller;
/// strings are read during the call only. Fill with `mc_setup_config_init` first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mc_setup_config {
    /// This client's name, `host` or `host:port`. Required (NULL or empty: -600).
    pub local_hostname: *const c_char,
    /// `"P2PHANDSHAKE"` or `"http://host:port/metadata"` (`https://` with TLS); NULL means `"P2PHANDSHAKE"`.
    pub metadata_server: *const c_char,
    /// Bytes this client contributes to the pool: 0, or at least 1024.
    pub global_segment_size: u64,
    /// Bytes of the registered local buffer used by copying puts and `get_buffer`: 0, or
    /// 1024 to 1 TiB.
    pub local_buffer_size: u64,
    /// Transport; NULL means `"tcp"` (the only one built).
    pub protocol: *const c_char,
    /// RDMA device names; NULL means `""`. Unused by tcp.
    pub device_name: *const c_char,
    /// `"host:port"` of a master; NULL, `""` or `"embedded"` selects the in-process master.
    pub master_server_addr: *const c_char,
    /// The SSD tier's directory (`docs/ssd-tier.md`); NULL or `""`: no SSD tier.
    pub ssd_offload_path: *const c_char,
}
/// See `struct mc_setup_config`.
pub type mc_setup_config_t = mc_setup_config;

/// How to place an object's replicas. Plain data owned by the caller; read during the call
/// only. Fill with `mc_replicate_config_init` first. Every `cfg` parameter may be NULL,
/// meaning the defaults of `mc_replicate_config_init`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mc_replicate_config {
    /// Memory replicas wanted (best effort, each on a distinct segment); must be >= 1.
    pub replica_num: u64,
    /// One of `MC_SOFT_PIN_PRESERVE`, `MC_SOFT_PIN_ENABLE`, `MC_SOFT_PIN_DISABLE`; any other
    /// value is rejected with -600.
    pub soft_pin_action: i32,
    /// Soft pin duration in ms; negative means none. Only valid with `MC_SOFT_PIN_ENABLE`.
    pub soft_pin_ttl_ms: i64,
    /// Non-zero: never evicted (fixed at creation).
    pub with_hard_pin: i32,
    /// Segment names tried first, in order; may be NULL when the count is 0. NULL entries are
    /// skipped.
    pub preferred_segments: *const *const c_char,
    /// Number of entries in `preferred_segments`.
    pub preferred_segments_count: usize,
}
/// See `struct mc_replicate_config`.
pub type mc_replicate_config_t = mc_replicate_config;

/// Fills `config` with Mooncake's defaults: `"localhost"`, `"P2PHANDSHAKE"`, 16 MiB segment,
/// 16 MiB local buffer, `"tcp"`, `""`, master `"127.0.0.1:50051"`, no SSD tier. The strings
/// are static.
/// NULL is ignored. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_setup_config_init(config: *mut mc_setup_config_t) {
    ffi_boundary!({
        if let Ok(config) = check::out(config, "config") {
            let d = SetupConfig::default();
            *config = mc_setup_config {
                local_hostname: c"localhost".as_ptr(),
                metadata_server: c"P2PHANDSHAKE".as_ptr(),
                global_segment_size: d.global_segment_size,
                local_buffer_size: d.local_buffer_size,
                protocol: c"tcp".as_ptr(),
                device_name: c"".as_ptr(),
                master_server_addr: c"127.0.0.1:50051".as_ptr(),
                ssd_offload_path: c"".as_ptr(),
            };
        }
        Ok(())
    })
}

/// Fills `config` with the defaults: one replica, `MC_SOFT_PIN_PRESERVE`, no TTL, no hard
/// pin, no preferred segments. NULL is ignored. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_replicate_config_init(config: *mut mc_replicate_config_t) {
    ffi_boundary!({
        if let Ok(config) = check::out(config, "config") {
            *config = mc_replicate_config {
                replica_num: 1,
                soft_pin_action: MC_SOFT_PIN_PRESERVE,
                soft_pin_ttl_ms: -1,
                with_hard_pin: 0,
                preferred_segments: std::ptr::null(),
                preferred_segments_count: 0,
            };
        }
        Ok(())
    })
}

/// Makes the key file at `path` this process's cluster key: every connection this process
/// opens or accepts from then on proves or checks it (README, "A cluster key"). Call it
/// before the first setup; the same as `MC_CLUSTER_KEY_FILE`, which it overrides. Naming the
/// file already in use again is fine.
///
/// Returns 0; -600 (`INVALID_PARAMS`) for a NULL, empty or non-UTF-8 `path`, or when the
/// process already uses another key file or has connected without one; -1101
/// (`FILE_OPEN_FAIL`) when the file cannot be read and -600 when it holds no valid key
/// (`mc_last_error_message` says why), and then every connection fails `AUTH_FAILED` (-9007)
/// rather than open without a key. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_set_cluster_key_file(path: *const c_char) -> c_int {
    ffi_boundary!({
        let path = check::cstr(path, "path")?;
        if path.is_empty() {
            return fail(ErrorCode::InvalidParams, "path is empty");
        }
        crate::auth::use_key_file(std::path::Path::new(path))?;
        Ok(0)
    })
}

/// Converts a C setup config (NULL strings take the documented defaults).
pub(crate) fn setup_config(config: *const mc_setup_config_t) -> Result<SetupConfig> {
    // SAFETY: NULL is checked by `as_ref`; the caller promises a live struct otherwise.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return fail(ErrorCode::InvalidParams, "config is NULL");
    };
    let text = |p, what, default: &str| -> Result<String> {
        Ok(check::opt_cstr(p, what)?.unwrap_or(default).to_string())
    };
    Ok(SetupConfig {
        local_hostname: check::cstr(c.local_hostname, "local_hostname")?.to_string(),
        metadata_server: text(c.metadata_server, "metadata_server", P2P_HANDSHAKE)?,
        global_segment_size: c.global_segment_size,
        local_buffer_size: c.local_buffer_size,
        protocol: text(c.protocol, "protocol", "tcp")?,
        device_name: text(c.device_name, "device_name", "")?,
        master_server_addr: text(c.master_server_addr, "master_server_addr", EMBEDDED_MASTER)?,
        ssd_offload_path: text(c.ssd_offload_path, "ssd_offload_path", "")?,
        // The C struct keeps its layout: C callers name the key file with
        // `mc_set_cluster_key_file` or in MC_CLUSTER_KEY_FILE.
        cluster_key_file: String::new(),
    })
}

/// Converts a C replicate config; NULL gives the defaults.
pub(crate) fn replicate_config(config: *const mc_replicate_config_t) -> Result<ReplicateConfig> {
    // SAFETY: NULL is checked by `as_ref`; the caller promises a live struct otherwise.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return Ok(ReplicateConfig::default());
    };
    let soft_pin_action = match c.soft_pin_action {
        MC_SOFT_PIN_PRESERVE => SoftPinAction::Preserve,
        MC_SOFT_PIN_ENABLE => SoftPinAction::Enable,
        MC_SOFT_PIN_DISABLE => SoftPinAction::Disable,
        other => {
            return fail(
                ErrorCode::InvalidParams,
                format!("soft_pin_action {other} is not one of MC_SOFT_PIN_*"),
            )
        }
    };
    replicate(
        c.replica_num,
        soft_pin_action,
        u64::try_from(c.soft_pin_ttl_ms).ok(),
        c.with_hard_pin != 0,
        c.preferred_segments,
        c.preferred_segments_count,
    )
}

/// The part both C configs (ours and Mooncake's) share: checks and builds the Rust config.
pub(crate) fn replicate(
    replica_num: u64,
    soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    with_hard_pin: bool,
    preferred: *const *const c_char,
    preferred_count: usize,
) -> Result<ReplicateConfig> {
    if replica_num == 0 {
        return fail(ErrorCode::InvalidParams, "replica_num must be at least 1");
    }
    let mut preferred_segments = Vec::new();
    for (i, &name) in check::array(preferred, preferred_count, "preferred_segments")?
        .iter()
        .enumerate()
    {
        if let Some(name) = check::opt_cstr(name, &format!("preferred_segments[{i}]"))? {
            preferred_segments.push(name.to_string());
        }
    }
    Ok(ReplicateConfig {
        replica_num,
        soft_pin_action,
        soft_pin_ttl_ms,
        with_hard_pin,
        preferred_segments,
        ..ReplicateConfig::default()
    })
}
