//! Error codes, error messages and the library version (`mc_strerror`,
//! `mc_last_error_message`, `mc_version`).

use super::check;
use super::panic::{ffi_boundary, StaticStr};
use crate::error::{last_error_message, ErrorCode};
use once_cell::sync::Lazy;
use std::ffi::{c_char, CString};

/// Major version of this library (agrees with `mc_version()` and Cargo.toml).
pub const MC_VERSION_MAJOR: u32 = 0;
/// Minor version of this library.
pub const MC_VERSION_MINOR: u32 = 2;
/// Patch version of this library.
pub const MC_VERSION_PATCH: u32 = 0;

// The error codes are written `0 - N` so cbindgen emits `#define MC_ERR_X (0 - N)`: a
// parenthesised expression that stays correct inside any C expression (a bare `-N` would
// not, e.g. in `x-MC_ERR_X`).

/// Success.
pub const MC_OK: i32 = 0;
/// Internal error; also returned after a caught panic and on a poisoned handle.
pub const MC_ERR_INTERNAL: i32 = 0 - 1;
/// A caller buffer was too small (rarely used; Mooncake reports most size problems as -600).
pub const MC_ERR_BUFFER_OVERFLOW: i32 = 0 - 10;
/// No free space in any segment.
pub const MC_ERR_NO_AVAILABLE_HANDLE: i32 = 0 - 200;
/// The master's version differs from the client's.
pub const MC_ERR_INVALID_VERSION: i32 = 0 - 300;
/// Bad key.
pub const MC_ERR_INVALID_KEY: i32 = 0 - 400;
/// Bad argument (NULL pointer, size overflow, count mismatch, unknown enum value, buffer too
/// small), or the store is not set up.
pub const MC_ERR_INVALID_PARAMS: i32 = 0 - 600;
/// No usable replica.
pub const MC_ERR_INVALID_REPLICA: i32 = 0 - 702;
/// The object is still being written.
pub const MC_ERR_REPLICA_IS_NOT_READY: i32 = 0 - 703;
/// No such object.
pub const MC_ERR_OBJECT_NOT_FOUND: i32 = 0 - 704;
/// The object exists (reported by put sessions only; plain puts return 0).
pub const MC_ERR_OBJECT_ALREADY_EXISTS: i32 = 0 - 705;
/// A read lease blocks a non-forced remove.
pub const MC_ERR_OBJECT_HAS_LEASE: i32 = 0 - 706;
/// The read lease ran out before the transfer finished.
pub const MC_ERR_LEASE_EXPIRED: i32 = 0 - 707;
/// A copy/move task holds the object.
pub const MC_ERR_OBJECT_HAS_REPLICATION_TASK: i32 = 0 - 708;
/// A replica is in use and cannot be overwritten.
pub const MC_ERR_OBJECT_REPLICA_BUSY: i32 = 0 - 714;
/// A data transfer failed.
pub const MC_ERR_TRANSFER_FAIL: i32 = 0 - 800;
/// Checksum verification failed.
pub const MC_ERR_CHECKSUM_MISMATCH: i32 = 0 - 801;
/// A master RPC failed.
pub const MC_ERR_RPC_FAIL: i32 = 0 - 900;
/// A master RPC timed out.
pub const MC_ERR_RPC_TIMEOUT: i32 = 0 - 901;
/// The operation is not supported here (e.g. no runtime for an on-stream call's stream kind).
pub const MC_ERR_NOT_SUPPORTED: i32 = 0 - 1012;
/// Resources for on-stream calls (ticket slots, pinned staging) are exhausted for now: free
/// tickets or wait for earlier calls to complete, then retry (mooncake-rs code).
pub const MC_ERR_TRY_AGAIN: i32 = 0 - 9001;
/// The stream is being captured into a graph; on-stream calls cannot be captured
/// (mooncake-rs code).
pub const MC_ERR_STREAM_CAPTURE_UNSUPPORTED: i32 = 0 - 9002;
/// An on-stream transfer missed its deadline (`MC_STREAM_TIMEOUT_MS`) (mooncake-rs code).
pub const MC_ERR_TRANSFER_TIMEOUT: i32 = 0 - 9003;
/// The store was torn down before an on-stream transfer completed (mooncake-rs code).
pub const MC_ERR_CANCELLED: i32 = 0 - 9004;
/// A write finish (put end, revoke, commit) named a write that is no longer the key's current
/// one: another start superseded it, or the master reclaimed it. Nothing was changed
/// (mooncake-rs code).
pub const MC_ERR_STALE_WRITE_TOKEN: i32 = 0 - 9005;
/// A transfer named a segment mount (epoch) that is no longer current: the owner restarted or
/// remounted its segment since the descriptor was issued. No byte was moved (mooncake-rs code).
pub const MC_ERR_STALE_SEGMENT_EPOCH: i32 = 0 - 9006;
/// A connection's cluster-key handshake failed: the peer has no key, another key, or is not
/// a mooncake-rs service of the expected kind; nothing was sent past the handshake
/// (mooncake-rs code).
pub const MC_ERR_AUTH_FAILED: i32 = 0 - 9007;

static VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(v) => v,
    Err(_) => c"unknown",
};

static NAMES: Lazy<Vec<(i32, CString)>> = Lazy::new(|| {
    ErrorCode::ALL
        .iter()
        .filter_map(|c| CString::new(c.name()).ok().map(|s| (c.code(), s)))
        .collect()
});

/// The library version as a static string, e.g. `"0.2.0"`.
///
/// Ownership: the string is static; never free it. Never NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_version() -> *const c_char {
    ffi_boundary!({ Ok(StaticStr(VERSION.as_ptr())) }).0
}

/// Mooncake's name for an error code, e.g. `mc_strerror(-704)` is `"OBJECT_NOT_FOUND"`,
/// `mc_strerror(0)` is `"OK"`; an unknown code gives `"UNKNOWN_ERROR"`.
///
/// Ownership: the string is static; never free it. Never NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_strerror(code: i64) -> *const c_char {
    ffi_boundary!({
        let name = i32::try_from(code)
            .ok()
            .and_then(|c| NAMES.iter().find(|(n, _)| *n == c))
            .map(|(_, s)| s.as_ptr())
            .unwrap_or(c"UNKNOWN_ERROR".as_ptr());
        Ok(StaticStr(name))
    })
    .0
}

/// Copies the calling thread's most recent error detail (e.g.
/// `"INVALID_PARAMS: keys[2] is NULL"`) into `buf` as a NUL-terminated string, truncated to
/// `len - 1` bytes. Returns the full length of the message (without the NUL), so a caller can
/// size a buffer: `mc_last_error_message(NULL, 0)` only returns the length.
///
/// The message is per thread and is replaced by the next failing call on that thread; a
/// successful call does not clear it. `buf` may be NULL only when `len` is 0 (otherwise
/// nothing is written and the length is still returned). Thread-safe.
#[no_mangle]
pub extern "C" fn mc_last_error_message(buf: *mut c_char, len: usize) -> usize {
    ffi_boundary!({
        let message = last_error_message();
        // A NULL `buf` is skipped here, not refused through `check`: refusing it would
        // record a new message in place of the one asked for.
        if len > 0 && !buf.is_null() {
            let n = message.len().min(len - 1);
            // Non-NULL, and `n + 1 <= len` bytes: this check cannot fail (nor record).
            if let Ok(out) = check::bytes_mut(buf, n + 1, "buf") {
                out[..n].copy_from_slice(&message.as_bytes()[..n]);
                out[n] = 0;
            }
        }
        Ok(message.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text(p: *const c_char) -> String {
        // SAFETY: the functions under test return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn error_constants_match_mooncake_names() {
        let pairs = [
            (MC_OK, "OK"),
            (MC_ERR_INTERNAL, "INTERNAL_ERROR"),
            (MC_ERR_BUFFER_OVERFLOW, "BUFFER_OVERFLOW"),
            (MC_ERR_NO_AVAILABLE_HANDLE, "NO_AVAILABLE_HANDLE"),
            (MC_ERR_INVALID_VERSION, "INVALID_VERSION"),
            (MC_ERR_INVALID_KEY, "INVALID_KEY"),
            (MC_ERR_INVALID_PARAMS, "INVALID_PARAMS"),
            (MC_ERR_INVALID_REPLICA, "INVALID_REPLICA"),
            (MC_ERR_REPLICA_IS_NOT_READY, "REPLICA_IS_NOT_READY"),
            (MC_ERR_OBJECT_NOT_FOUND, "OBJECT_NOT_FOUND"),
            (MC_ERR_OBJECT_ALREADY_EXISTS, "OBJECT_ALREADY_EXISTS"),
            (MC_ERR_OBJECT_HAS_LEASE, "OBJECT_HAS_LEASE"),
            (MC_ERR_LEASE_EXPIRED, "LEASE_EXPIRED"),
            (
                MC_ERR_OBJECT_HAS_REPLICATION_TASK,
                "OBJECT_HAS_REPLICATION_TASK",
            ),
            (MC_ERR_OBJECT_REPLICA_BUSY, "OBJECT_REPLICA_BUSY"),
            (MC_ERR_TRANSFER_FAIL, "TRANSFER_FAIL"),
            (MC_ERR_CHECKSUM_MISMATCH, "CHECKSUM_MISMATCH"),
            (MC_ERR_RPC_FAIL, "RPC_FAIL"),
            (MC_ERR_RPC_TIMEOUT, "RPC_TIMEOUT"),
        ];
        for (code, name) in pairs {
            assert_eq!(text(mc_strerror(code.into())), name);
            assert_eq!(ErrorCode::from_i32(code).map(|c| c.name()), Some(name));
        }
        assert_eq!(text(mc_strerror(-2)), "UNKNOWN_ERROR");
        assert_eq!(text(mc_strerror(i64::MIN)), "UNKNOWN_ERROR");
    }

    #[test]
    fn last_error_message_truncates_and_reports_length() {
        crate::error::set_last_error_message("INVALID_PARAMS: key is NULL");
        let full = mc_last_error_message(std::ptr::null_mut(), 0);
        assert_eq!(full, "INVALID_PARAMS: key is NULL".len());
        let mut small = [0x55 as c_char; 8];
        assert_eq!(mc_last_error_message(small.as_mut_ptr(), 8), full);
        assert_eq!(text(small.as_ptr()), "INVALID");
        assert_eq!(mc_last_error_message(std::ptr::null_mut(), 4), full);
        // Refusing a NULL buffer must not replace the message it was asked for.
        assert_eq!(
            crate::error::last_error_message(),
            "INVALID_PARAMS: key is NULL"
        );
    }
}
