//! The one place where the transfer engine copies bytes of caller memory.
//!
//! Every local transfer goes through [`copy_bytes`], so that a later device-aware primitive
//! (GPU-safe memcpy) has exactly one call site to replace.

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads and `dst` valid for writes of `len` bytes for the duration of
/// the call, and the two ranges must not overlap. `len == 0` is always allowed.
pub unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller guarantees validity and non-overlap of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_exactly_len_bytes() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [0u8; 4];
        unsafe { copy_bytes(dst.as_mut_ptr(), src.as_ptr(), 3) };
        assert_eq!(dst, [1, 2, 3, 0]);
        unsafe { copy_bytes(std::ptr::null_mut(), std::ptr::null(), 0) };
    }
}
