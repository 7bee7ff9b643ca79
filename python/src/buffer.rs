//! `BufferHandle` (spec §5.1): an object read into the client's local buffer, handed to
//! Python without a second copy. Exports the buffer protocol (1-D, format `'b'`, writable).

use mooncake_rs::client::BufferHandle;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::{c_int, c_void};

/// Owns one local-buffer allocation holding an object's bytes. The memory returns to the
/// local buffer when the handle and every view exported from it (memoryview, numpy, torch)
/// are gone; it stays valid after `store.close()`. No Python constructor. Thread-safe
/// (immutable from Rust; Python may write through a writable view).
#[pyclass(frozen, module = "mooncake.store", name = "BufferHandle")]
pub struct PyBufferHandle {
    handle: BufferHandle,
    /// `shape` and `strides` of exported views; they live as long as the object.
    shape: [ffi::Py_ssize_t; 1],
    strides: [ffi::Py_ssize_t; 1],
}

impl PyBufferHandle {
    /// Wraps a handle from `get_buffer` / `batch_get_buffer`.
    pub fn new(handle: BufferHandle) -> PyBufferHandle {
        let len = handle.len() as ffi::Py_ssize_t;
        PyBufferHandle {
            handle,
            shape: [len],
            strides: [1],
        }
    }
}

#[pymethods]
impl PyBufferHandle {
    /// Address of the first byte (in the client's local buffer).
    fn ptr(&self) -> usize {
        self.handle.ptr() as usize
    }

    /// Length in bytes (the object size).
    fn size(&self) -> usize {
        self.handle.len()
    }

    fn __len__(&self) -> usize {
        self.handle.len()
    }

    /// # Safety
    /// Called by CPython with a writable `view`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is NULL"));
        }
        let this = slf.get();
        let v = &mut *view;
        v.obj = slf.clone().into_any().into_ptr();
        v.buf = if this.handle.is_empty() {
            std::ptr::null_mut()
        } else {
            this.handle.ptr() as *mut c_void
        };
        v.len = this.shape[0];
        v.readonly = 0;
        v.itemsize = 1;
        v.format = if flags & ffi::PyBUF_FORMAT != 0 {
            c"b".as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        v.ndim = 1;
        v.shape = if flags & ffi::PyBUF_ND != 0 {
            this.shape.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        v.strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            this.strides.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        v.suboffsets = std::ptr::null_mut();
        v.internal = std::ptr::null_mut();
        Ok(())
    }

    /// # Safety
    /// Called by CPython for a view filled by `__getbuffer__`; nothing to free.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl PyBufferHandle {
    /// The bytes (read-only from Rust).
    pub fn as_slice(&self) -> &[u8] {
        self.handle.as_slice()
    }
}
