//! The tensor APIs of `MooncakeDistributedStore` (spec §4.10): each method forwards its
//! arguments, the store first, to the function of the same name in the pure-Python module
//! `mooncake._tensor`, which lays tensors out as upstream does (the tensor-metadata header,
//! then the data) on this class's byte calls. Torch is imported only when such a call runs.
//! Also the module-level `_serialize_tensor`, `_deserialize_tensor` and
//! `_tensor_metadata_size`.

use crate::store::Store;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Calls `mooncake._tensor.<name>(*prefix, *args, **kwargs)`.
fn forward<'py>(
    py: Python<'py>,
    name: &str,
    prefix: Option<&Bound<'py, PyAny>>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let function = py.import("mooncake._tensor")?.getattr(name)?;
    let mut all: Vec<Bound<'py, PyAny>> = prefix.into_iter().cloned().collect();
    all.extend(args.iter());
    function.call(PyTuple::new(py, all)?, kwargs)
}

/// Declares store methods that forward to `mooncake._tensor` under their own names.
macro_rules! tensor_methods {
    ($($name:ident),+ $(,)?) => {
        #[pymethods]
        impl Store {
            $(
                #[pyo3(signature = (*args, **kwargs))]
                fn $name<'py>(
                    slf: &Bound<'py, Self>,
                    args: &Bound<'py, PyTuple>,
                    kwargs: Option<&Bound<'py, PyDict>>,
                ) -> PyResult<Bound<'py, PyAny>> {
                    forward(slf.py(), stringify!($name), Some(slf.as_any()), args, kwargs)
                }
            )+
        }
    };
}

tensor_methods!(
    put_tensor,
    upsert_tensor,
    batch_put_tensor,
    batch_upsert_tensor,
    pub_tensor,
    upsert_pub_tensor,
    batch_pub_tensor,
    batch_upsert_pub_tensor,
    get_tensor,
    batch_get_tensor,
    get_tensor_into,
    batch_get_tensor_into,
    put_tensor_from,
    upsert_tensor_from,
    batch_put_tensor_from,
    batch_upsert_tensor_from,
    put_tensor_with_tp,
    batch_put_tensor_with_tp,
    pub_tensor_with_tp,
    batch_pub_tensor_with_tp,
    get_tensor_with_tp,
    batch_get_tensor_with_tp,
    get_tensor_with_tp_into,
    batch_get_tensor_with_tp_into,
);

/// Upstream's `_serialize_tensor(tensor)`: (header bytes, data_ptr, data bytes, owner).
#[pyfunction]
#[pyo3(signature = (*args, **kwargs))]
pub fn _serialize_tensor<'py>(
    py: Python<'py>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    forward(py, "serialize_tensor", None, args, kwargs)
}

/// Upstream's `_deserialize_tensor(payload)`: the tensor of header + data bytes.
#[pyfunction]
#[pyo3(signature = (*args, **kwargs))]
pub fn _deserialize_tensor<'py>(
    py: Python<'py>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    forward(py, "deserialize_tensor", None, args, kwargs)
}

/// Upstream's `_tensor_metadata_size()`: bytes of the tensor-metadata header.
#[pyfunction]
pub fn _tensor_metadata_size<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
    forward(py, "tensor_metadata_size", None, &PyTuple::empty(py), None)
}
