//! Buffer-protocol arguments (`value`, `values[i]`, `parts`): a held `Py_buffer` whose
//! address range the store reads while the GIL is released.

use mooncake_rs::client::Buf;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;

/// A C-contiguous buffer exported by a Python object, held until drop (which releases it,
/// taking the GIL if needed). While held, the exporter keeps the memory alive and in place.
/// The byte length is the real one (`Py_buffer.len`), whatever the element type.
pub struct HeldBuffer {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the view is only read (address and length) off the GIL; `PyBuffer_Release` runs in
// `drop` with the GIL attached.
unsafe impl Send for HeldBuffer {}

impl HeldBuffer {
    /// Exports `obj`'s buffer as contiguous bytes. `bytes_1d` additionally requires a 1-D
    /// buffer of one-byte items (`put_parts`' rule), else `RuntimeError`. Objects without the
    /// buffer protocol (e.g. `str`) raise `TypeError`; a non-contiguous one the exporter's error
    /// (`BufferError`, numpy's `ValueError`).
    pub fn get(obj: &Bound<'_, PyAny>, bytes_1d: bool) -> PyResult<HeldBuffer> {
        if obj.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(
                "a bytes-like object is required, not 'str'",
            ));
        }
        let flags: c_int = if bytes_1d {
            ffi::PyBUF_FORMAT | ffi::PyBUF_ND | ffi::PyBUF_C_CONTIGUOUS
        } else {
            ffi::PyBUF_C_CONTIGUOUS
        };
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `obj` is a live object; `view` is writable storage for the export.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let held = HeldBuffer { view };
        if bytes_1d && (held.view.ndim != 1 || held.view.itemsize != 1) {
            return Err(PyRuntimeError::new_err("parts must be 1-D bytes-like"));
        }
        Ok(held)
    }

    /// The exported bytes as an address range.
    pub fn buf(&self) -> Buf {
        Buf::new(self.view.buf as usize, self.view.len.max(0) as u64)
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        // SAFETY: the view came from a successful `PyObject_GetBuffer` and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Exports every object of `objs` (see [`HeldBuffer::get`]).
pub fn hold_all(objs: &[Bound<'_, PyAny>], bytes_1d: bool) -> PyResult<Vec<HeldBuffer>> {
    objs.iter().map(|o| HeldBuffer::get(o, bytes_1d)).collect()
}
