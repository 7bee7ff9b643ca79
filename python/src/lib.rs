//! `mooncake.store`: Mooncake Store's Python module on the mooncake-rs client.
use pyo3::prelude::*;

#[pymodule(name = "store")]
fn mooncake_store(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
