//! The tensor APIs of `MooncakeDistributedStore` (spec §4.10): each method forwards its
//! arguments, the store first, to the function of the same name in a pure-Python module,
//! which lays tensors out as upstream does (the tensor-metadata header, then the data) on this
//! class's byte calls: `mooncake._tensor` (put/get, batch, into, from, publish, upsert, TP),
//! `mooncake._parallel` (the `*_with_parallelism*` calls; its `ParallelAxis`,
//! `TensorParallelism` and `ReadTarget` are added to the module by `add_to`) and
//! `mooncake._safetensors` (safetensors files). Torch is imported only when a call that takes
//! or returns a tensor runs. Also the module-level `_serialize_tensor`, `_deserialize_tensor`
//! and `_tensor_metadata_size`.

use crate::store::Store;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The Python module of the plain tensor calls.
const TENSOR: &str = "mooncake._tensor";
/// The Python module of the parallelism calls and their helper classes.
const PARALLEL: &str = "mooncake._parallel";
/// The Python module of the safetensors calls.
const SAFETENSORS: &str = "mooncake._safetensors";

/// Calls `<module>.<name>(*prefix, *args, **kwargs)`.
fn forward<'py>(
    py: Python<'py>,
    module: &str,
    name: &str,
    prefix: Option<&Bound<'py, PyAny>>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let function = py.import(module)?.getattr(name)?;
    let mut all: Vec<Bound<'py, PyAny>> = prefix.into_iter().cloned().collect();
    all.extend(args.iter());
    function.call(PyTuple::new(py, all)?, kwargs)
}

/// Declares store methods that forward to `module` under their own names.
macro_rules! tensor_methods {
    ($module:expr; $($name:ident),+ $(,)?) => {
        #[pymethods]
        impl Store {
            $(
                #[pyo3(signature = (*args, **kwargs))]
                fn $name<'py>(
                    slf: &Bound<'py, Self>,
                    args: &Bound<'py, PyTuple>,
                    kwargs: Option<&Bound<'py, PyDict>>,
                ) -> PyResult<Bound<'py, PyAny>> {
                    forward(slf.py(), $module, stringify!($name), Some(slf.as_any()), args, kwargs)
                }
            )+
        }
    };
}

tensor_methods!(TENSOR;
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
    put_tensor_with_tp_from,
    batch_put_tensor_with_tp_from,
    get_tensor_into_cuda,
    batch_get_tensor_into_cuda,
);

tensor_methods!(PARALLEL;
    put_tensor_with_parallelism,
    batch_put_tensor_with_parallelism,
    put_tensor_with_parallelism_from,
    batch_put_tensor_with_parallelism_from,
    upsert_tensor_with_parallelism,
    upsert_tensor_with_parallelism_from,
    batch_upsert_tensor_with_parallelism,
    batch_upsert_tensor_with_parallelism_from,
    get_tensor_with_parallelism,
    batch_get_tensor_with_parallelism,
    get_tensor_with_parallelism_into,
    batch_get_tensor_with_parallelism_into,
);

tensor_methods!(SAFETENSORS; save_tensor_to_safetensor, load_tensor_from_safetensor);

/// Adds the module-level tensor functions and the parallelism helper classes to `m`.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_serialize_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(_deserialize_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_metadata_size, m)?)?;
    let parallel = m.py().import(PARALLEL)?;
    for class in ["ParallelAxis", "TensorParallelism", "ReadTarget"] {
        m.add(class, parallel.getattr(class)?)?;
    }
    Ok(())
}

/// Declares module-level functions that forward their arguments to `module`'s function named
/// by each.
macro_rules! module_functions {
    ($module:expr; $($(#[$doc:meta])* $name:ident => $target:literal),+ $(,)?) => {
        $(
            $(#[$doc])*
            #[pyfunction]
            #[pyo3(signature = (*args, **kwargs))]
            fn $name<'py>(
                py: Python<'py>,
                args: &Bound<'py, PyTuple>,
                kwargs: Option<&Bound<'py, PyDict>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                forward(py, $module, $target, None, args, kwargs)
            }
        )+
    };
}

module_functions!(TENSOR;
    /// Upstream's `_serialize_tensor(tensor)`: (header bytes, data_ptr, data bytes, owner).
    _serialize_tensor => "serialize_tensor",
    /// Upstream's `_deserialize_tensor(payload)`: the tensor of header + data bytes.
    _deserialize_tensor => "deserialize_tensor",
    /// Upstream's `_tensor_metadata_size()`: bytes of the tensor-metadata header.
    _tensor_metadata_size => "tensor_metadata_size",
);
