//! `mc_buffer_t`: an object read by `mc_store_get_buffer`, owned by the caller until
//! `mc_buffer_free`.

use super::panic::ffi_boundary;
use crate::client::BufferHandle;
use std::ffi::c_void;

/// An object's bytes in client-owned memory (Mooncake's `BufferHandle`). Opaque and
/// immutable.
///
/// Produced by `mc_store_get_buffer` / `mc_store_batch_get_buffer`; the caller owns it and
/// releases it with `mc_buffer_free`. It stays valid after the store is torn down or freed
/// (the memory is kept until the last buffer is freed). Under the hood this is a `Box` around
/// an allocation in the client's local buffer.
///
/// Thread-safety: the accessors may be called from any number of threads at once;
/// `mc_buffer_free` must be the last call.
///
/// Methods: `mc_buffer_ptr`, `mc_buffer_len`, `mc_buffer_free`.
pub struct mc_buffer {
    handle: BufferHandle,
}
/// See `struct mc_buffer`.
pub type mc_buffer_t = mc_buffer;

impl mc_buffer {
    /// Moves a handle into a caller-owned C object.
    pub(crate) fn into_raw(handle: BufferHandle) -> *mut mc_buffer {
        Box::into_raw(Box::new(mc_buffer { handle }))
    }
}

/// The first byte of the object. Valid until `mc_buffer_free(buffer)`; never write through
/// it. NULL when `buffer` is NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_buffer_ptr(buffer: *const mc_buffer_t) -> *const c_void {
    ffi_boundary!({
        // SAFETY: NULL is checked; otherwise a live buffer from `mc_store_get_buffer`.
        Ok(
            unsafe { buffer.as_ref() }
                .map_or(std::ptr::null(), |b| b.handle.ptr().cast::<c_void>()),
        )
    })
}

/// The object's size in bytes; 0 when `buffer` is NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn mc_buffer_len(buffer: *const mc_buffer_t) -> usize {
    ffi_boundary!({
        // SAFETY: NULL is checked; otherwise a live buffer from `mc_store_get_buffer`.
        Ok(unsafe { buffer.as_ref() }.map_or(0, |b| b.handle.len()))
    })
}

/// Releases a buffer. Calling with NULL is fine. Must not be called twice with the same
/// value.
#[no_mangle]
pub extern "C" fn mc_buffer_free(buffer: *mut mc_buffer_t) {
    ffi_boundary!({
        if !buffer.is_null() {
            // SAFETY: non-NULL; a buffer from `mc_buffer::into_raw`, released exactly once.
            drop(unsafe { Box::from_raw(buffer) });
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn null_buffers_are_harmless() {
        assert_send_sync::<mc_buffer>();
        mc_buffer_free(std::ptr::null_mut());
        assert!(mc_buffer_ptr(std::ptr::null()).is_null());
        assert_eq!(mc_buffer_len(std::ptr::null()), 0);
    }
}
