//! `mooncake.store`: Mooncake Store's Python module (upstream's pybind `store`), backed by
//! the mooncake-rs client. What it builds and what it does not: [`MODULE_DOC`] (also the
//! module's `__doc__`); the contract is `shared/spec/python-api.md`; docs/python.md.

mod buffer;
mod cli;
mod config;
mod convert;
mod engine;
mod enums;
mod http;
mod memory;
mod ops_admin;
mod ops_copying;
mod ops_ranges;
mod ops_tensor;
mod ops_zero_copy;
mod pybuf;
mod replicas;
mod setup_args;
mod shm_alloc;
mod store;
mod stream;

use pyo3::prelude::*;

/// The module's `__doc__`.
const MODULE_DOC: &str = "Mooncake Store's Python module on the mooncake-rs client (Rust).

Frameworks (vLLM's MooncakeStoreConnector, SGLang's HiCache backend, LMCache's connector)
use it unchanged. Built: MooncakeDistributedStore (setup in both forms, close, health,
hostname, the copying, zero-copy, multi-buffer, ranged, session, exist/size/remove and
upsert families, replica descriptors, and seed 000's on-stream calls), ReplicateConfig, the
enums, BufferHandle, HostStream, HostEvent, Ticket, dummy mode (setup_dummy: a worker of a
standalone mooncake_client on this host) and MooncakeHostMemAllocator.

The transfer engine's own API (mooncake.engine.TransferEngine) is the submodule `engine`,
imported as mooncake.engine.

The tensor APIs (put_tensor, get_tensor, their batch, into, from, publish, upsert, TP and
parallelism forms, safetensors files; torch imported when called) are in mooncake._tensor,
mooncake._parallel and mooncake._safetensors, upstream's layout.

Not built (absent, so getattr(..., None) probes see that): copy/move tasks and batch_replica_clear, segment
mounting helpers, BufferPool, NVMe-oF and Engram helpers. See docs/python.md of mooncake-rs.";

#[pymodule(name = "store")]
fn mooncake_store(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.setattr("__doc__", MODULE_DOC)?;
    m.add_class::<store::Store>()?;
    m.add_class::<shm_alloc::PyHostMemAllocator>()?;
    m.add_class::<config::PyReplicateConfig>()?;
    m.add_class::<buffer::PyBufferHandle>()?;
    m.add_class::<stream::PyHostStream>()?;
    m.add_class::<stream::PyHostEvent>()?;
    m.add_class::<stream::PyTicket>()?;
    m.add_class::<replicas::PyReplicaDescriptor>()?;
    m.add_class::<replicas::PyMemoryDescriptor>()?;
    m.add_class::<replicas::PyDescriptor>()?;
    enums::add_enums(m)?;
    let engine_module = PyModule::new(m.py(), "engine")?;
    engine::add_to(&engine_module)?;
    m.add_submodule(&engine_module)?;
    ops_tensor::add_to(m)?;
    m.add_function(wrap_pyfunction!(cli::_run_master, m)?)?;
    m.add_function(wrap_pyfunction!(cli::_run_client, m)?)?;
    m.add_function(wrap_pyfunction!(cli::_run_metadata_server, m)?)?;
    let teardown = wrap_pyfunction!(store::_teardown_all, m)?;
    m.add_function(teardown.clone())?;
    m.py()
        .import("atexit")?
        .call_method1("register", (teardown,))?;
    Ok(())
}
