//! [`memcpy_safe`]: the one primitive that copies caller memory. Host ↔ host is a plain
//! memcpy (a large one split across the copy crew, `crew.rs`); anything touching device
//! memory is a driver copy on the device's context. No other code in the crate copies caller
//! memory (a test greps the sources for it).

use super::stats::{self, STATS};
use super::{crew, runtime, Side};

/// Which way a [`memcpy_safe`] moved the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyRoute {
    /// A CPU memcpy (both sides host memory); also returned for `len == 0`.
    Host,
    /// A driver copy (at least one side device memory).
    Driver,
}

/// Copies `len` bytes from `src` to `dst`, either of which may be device memory. Blocking:
/// when it returns, the destination holds the bytes (or, for a host → device copy, the copy
/// is ordered before any later work on the device) and `src` may be reused.
///
/// Errors: the driver's failure as text (only possible when a side is device memory); the
/// destination's contents are then unspecified.
///
/// Thread-safe. Cost: two pointer-attribute lookups per call when a runtime is loaded.
///
/// # Safety
/// `src` must be valid for reads and `dst` valid for writes of `len` bytes (on the host or
/// on a device) for the duration of the call, and the two ranges must not overlap.
/// `len == 0` is always allowed.
pub unsafe fn memcpy_safe(dst: *mut u8, src: *const u8, len: usize) -> Result<CopyRoute, String> {
    if len == 0 {
        return Ok(CopyRoute::Host);
    }
    let Some(backend) = runtime().backend() else {
        // SAFETY: forwarded from the caller; no runtime means both sides are host memory.
        unsafe { host_copy(dst, src, len) };
        return Ok(CopyRoute::Host);
    };
    let (d, s) = (
        backend.classify(dst as usize),
        backend.classify(src as usize),
    );
    if d.device().is_none() && s.device().is_none() {
        // SAFETY: forwarded; both sides are host memory.
        unsafe { host_copy(dst, src, len) };
        return Ok(CopyRoute::Host);
    }
    let (to, from) = (
        Side {
            addr: dst as usize,
            kind: d,
        },
        Side {
            addr: src as usize,
            kind: s,
        },
    );
    // SAFETY: forwarded from the caller.
    unsafe { backend.copy(to, from, len) }.map_err(|e| {
        stats::bump(&STATS.driver_copy_failures);
        format!("device copy of {len} bytes ({s:?} -> {d:?}) failed: {e}")
    })?;
    stats::add(&STATS.driver_copies, &STATS.driver_copy_bytes, len as u64);
    Ok(CopyRoute::Driver)
}

/// The CPU copy, for host memory on both sides only: split across the copy crew when it is
/// large enough ([`crew::split_copy`]), else one memcpy on this thread.
///
/// # Safety
/// As [`memcpy_safe`], and both ranges are host memory.
unsafe fn host_copy(dst: *mut u8, src: *const u8, len: usize) {
    stats::add(&STATS.host_copies, &STATS.host_copy_bytes, len as u64);
    // SAFETY: forwarded from the caller.
    if unsafe { crew::split_copy(dst, src, len) } {
        stats::bump(&STATS.host_split_copies);
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { copy_piece(dst, src, len) }
    }
}

/// One memcpy on the calling thread: a whole host copy, or one piece of a split one.
///
/// # Safety
/// As [`host_copy`].
pub(super) unsafe fn copy_piece(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller guarantees validity, host residence and non-overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_copies_exactly_len_bytes() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [0u8; 4];
        let route = unsafe { memcpy_safe(dst.as_mut_ptr(), src.as_ptr(), 3) };
        assert_eq!(route, Ok(CopyRoute::Host));
        assert_eq!(dst, [1, 2, 3, 0]);
        let empty = unsafe { memcpy_safe(std::ptr::null_mut(), std::ptr::null(), 0) };
        assert_eq!(empty, Ok(CopyRoute::Host));
    }
}
