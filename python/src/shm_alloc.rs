//! `MooncakeHostMemAllocator` (spec §5.3): shared memory a dummy's real client can map, for a
//! framework's host KV pool (SGLang wraps the address with ctypes / `torch.frombuffer`).

use crate::convert;
use mooncake_rs::standalone::ShmPool;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Wraps the process-wide shared-memory pool. Thread-safe; holds no state of its own.
#[pyclass(module = "mooncake.store", name = "MooncakeHostMemAllocator")]
pub struct PyHostMemAllocator;

#[pymethods]
impl PyHostMemAllocator {
    #[new]
    fn new() -> Self {
        PyHostMemAllocator
    }

    /// Address of a new zero-filled shared-memory block of `size` bytes (rounded up to
    /// pages); `RuntimeError` when the OS refuses (or `size` is 0). GIL released.
    fn alloc(&self, py: Python<'_>, size: convert::U64) -> PyResult<u64> {
        py.detach(|| ShmPool::global().alloc(size.0, "MooncakeHostMemAllocator"))
            .map(|block| block.addr() as u64)
            .map_err(|_| PyRuntimeError::new_err(mooncake_rs::error::last_error_message()))
    }

    /// Frees a block from `alloc`: 0, or -1 for an unknown pointer. GIL released.
    fn free(&self, py: Python<'_>, ptr: u64) -> i64 {
        match py.detach(|| ShmPool::global().free(ptr as usize)) {
            Ok(()) => 0,
            Err(_) => -1,
        }
    }
}
