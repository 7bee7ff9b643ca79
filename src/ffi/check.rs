//! Argument checks: every pointer and length from C passes through one of these before it
//! becomes a Rust reference or slice. Each failure records a message and returns
//! `INVALID_PARAMS`; none of them dereferences anything it has not checked.
//!
//! The one thing that cannot be checked is that a non-NULL pointer really points to as many
//! live elements as the caller says; that is the caller's contract, stated in the header.

use crate::client::Buf;
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_char, CStr};

/// Largest byte count a Rust slice may span.
const MAX_BYTES: usize = isize::MAX as usize;

fn invalid<T>(message: impl std::fmt::Display) -> Result<T> {
    fail(ErrorCode::InvalidParams, message)
}

/// A required NUL-terminated UTF-8 string.
pub(crate) fn cstr<'a>(ptr: *const c_char, what: &str) -> Result<&'a str> {
    match opt_cstr(ptr, what)? {
        Some(s) => Ok(s),
        None => invalid(format!("{what} is NULL")),
    }
}

/// An optional NUL-terminated UTF-8 string (NULL → `None`).
pub(crate) fn opt_cstr<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL; the caller promises a NUL-terminated string live for the call.
    let text = unsafe { CStr::from_ptr(ptr) };
    match text.to_str() {
        Ok(s) => Ok(Some(s)),
        Err(_) => invalid(format!("{what} is not valid UTF-8")),
    }
}

/// Checks that `count` elements of `T` fit in one slice.
fn span<T>(count: usize, what: &str) -> Result<()> {
    match count.checked_mul(std::mem::size_of::<T>().max(1)) {
        Some(bytes) if bytes <= MAX_BYTES => Ok(()),
        _ => invalid(format!("{what}: count/size {count} overflows")),
    }
}

/// `count` elements at `ptr`; NULL is allowed only with `count == 0`.
pub(crate) fn array<'a, T>(ptr: *const T, count: usize, what: &str) -> Result<&'a [T]> {
    span::<T>(count, what)?;
    if count == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return invalid(format!("{what} is NULL but {count} entries were given"));
    }
    // SAFETY: non-NULL, size checked; the caller promises `count` live elements.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// `count` writable elements at `ptr`; NULL is allowed only with `count == 0`.
pub(crate) fn array_mut<'a, T>(ptr: *mut T, count: usize, what: &str) -> Result<&'a mut [T]> {
    span::<T>(count, what)?;
    if count == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return invalid(format!("{what} is NULL but {count} entries were given"));
    }
    // SAFETY: non-NULL, size checked; the caller promises `count` writable elements that
    // nothing else accesses during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, count) })
}

/// A caller data buffer of `size` bytes at `ptr` as an address range (NULL allowed only
/// with size 0). It may be device memory, so it never becomes a slice: only the transfer
/// engine's copy primitive (and sockets, through bounce buffers for device memory) touch it.
pub(crate) fn region<P>(ptr: *const P, size: usize, what: &str) -> Result<Buf> {
    span::<u8>(size, what)?;
    if ptr.is_null() && size > 0 {
        return invalid(format!("{what} is NULL but {size} bytes were given"));
    }
    if (ptr as usize).checked_add(size).is_none() {
        return invalid(format!("{what}: range wraps around the address space"));
    }
    Ok(Buf::new(ptr as usize, size as u64))
}

/// `size` readable bytes of **host** memory at `ptr` (NULL allowed only with size 0). Only for
/// calls documented as host-memory-only (the `mc_p2p_*` data calls); paths that may see device
/// memory use [`region`].
pub(crate) fn host_bytes<'a, P>(ptr: *const P, size: usize, what: &str) -> Result<&'a [u8]> {
    array(ptr.cast::<u8>(), size, what)
}

/// `size` writable bytes at `ptr` (NULL allowed only with size 0).
pub(crate) fn bytes_mut<'a, P>(ptr: *mut P, size: usize, what: &str) -> Result<&'a mut [u8]> {
    array_mut(ptr.cast::<u8>(), size, what)
}

/// A required out-parameter.
pub(crate) fn out<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T> {
    if ptr.is_null() {
        return invalid(format!("{what} is NULL"));
    }
    // SAFETY: non-NULL; the caller promises a writable, aligned `T`.
    Ok(unsafe { &mut *ptr })
}

/// `count` keys (every entry a non-NULL UTF-8 string).
pub(crate) fn keys<'a>(ptr: *const *const c_char, count: usize) -> Result<Vec<&'a str>> {
    array(ptr, count, "keys")?
        .iter()
        .enumerate()
        .map(|(i, &k)| cstr(k, &format!("keys[{i}]")))
        .collect()
}

/// Rejects writable ranges that overlap each other (two `&mut` to the same bytes would be
/// undefined behaviour in Rust). Empty ranges never overlap.
pub(crate) fn disjoint(ranges: &[(usize, usize)], what: &str) -> Result<()> {
    let mut spans: Vec<(usize, usize)> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.0.saturating_add(a.1) > b.0 {
            return invalid(format!("{what} overlap: two destinations share bytes"));
        }
    }
    Ok(())
}

/// Copies `text` NUL-terminated into `len` bytes at `buf`; `INVALID_PARAMS` when it does not
/// fit (nothing written) or `buf` is NULL with `len > 0`.
pub(crate) fn write_cstr(buf: *mut c_char, len: usize, text: &str, what: &str) -> Result<()> {
    let out = bytes_mut(buf, len, "buf")?;
    if out.len() <= text.len() {
        return invalid(format!(
            "buffer of {len} bytes cannot hold the {what} ({} bytes with its NUL)",
            text.len() + 1
        ));
    }
    out[..text.len()].copy_from_slice(text.as_bytes());
    out[text.len()] = 0;
    Ok(())
}

/// Fills every slot with `code` (used when a batch's arguments are unusable).
pub(crate) fn fill<T: Copy>(results: &mut [T], value: T) {
    results.iter_mut().for_each(|r| *r = value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_overflow_are_rejected() {
        assert!(array::<u64>(std::ptr::null(), 0, "x").unwrap().is_empty());
        assert_eq!(
            array::<u64>(std::ptr::null(), 1, "x"),
            Err(ErrorCode::InvalidParams)
        );
        let one = 7u64;
        assert_eq!(array(&one, usize::MAX, "x"), Err(ErrorCode::InvalidParams));
        assert_eq!(
            region(&one, usize::MAX / 2 + 1, "x"),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(region::<u8>(std::ptr::null(), 0, "x"), Ok(Buf::new(0, 0)));
        assert_eq!(
            region::<u8>(std::ptr::null(), 1, "x"),
            Err(ErrorCode::InvalidParams)
        );
        assert_eq!(cstr(std::ptr::null(), "key"), Err(ErrorCode::InvalidParams));
        assert_eq!(cstr(c"\xff".as_ptr(), "key"), Err(ErrorCode::InvalidParams));
        assert_eq!(cstr(c"k".as_ptr(), "key"), Ok("k"));
    }

    #[test]
    fn overlapping_destinations_are_rejected() {
        assert!(disjoint(&[(0, 10), (10, 5), (100, 0), (102, 0)], "b").is_ok());
        assert!(disjoint(&[(0, 10), (9, 5)], "b").is_err());
        assert!(disjoint(&[(50, 10), (0, 51)], "b").is_err());
    }
}
