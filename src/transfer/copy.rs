//! The transfer engine's entry to the one primitive that copies caller memory:
//! [`copy_bytes`] forwards to the device-aware [`memcpy_safe`](crate::device::memcpy_safe),
//! so caller buffers may be device memory on every local path.

use crate::device::{memcpy_safe, CopyRoute};

/// Copies `len` bytes from `src` to `dst`; either may be device memory. Errors: the device
/// driver's failure as text.
///
/// # Safety
/// `src` must be valid for reads and `dst` valid for writes of `len` bytes (host or device)
/// for the duration of the call, and the two ranges must not overlap. `len == 0` is always
/// allowed.
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) -> Result<CopyRoute, String> {
    // SAFETY: forwarded from the caller.
    unsafe { memcpy_safe(dst, src, len) }
}

/// [`copy_bytes`] with a failure reported as `TRANSFER_FAIL` (detail recorded for the thread).
///
/// # Safety
/// As [`copy_bytes`].
pub unsafe fn copy_or_fail(dst: *mut u8, src: *const u8, len: usize) -> crate::Result<()> {
    // SAFETY: forwarded from the caller.
    match unsafe { copy_bytes(dst, src, len) } {
        Ok(_) => Ok(()),
        Err(e) => crate::error::fail(
            crate::ErrorCode::TransferFail,
            format!("copy of {len} bytes failed: {e}"),
        ),
    }
}
