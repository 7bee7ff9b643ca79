//! Replica descriptors (spec §4.9): `get_replica_desc`, `batch_get_replica_desc` and the
//! view classes `ReplicaDescriptor`, `MemoryDescriptor`, `Descriptor`. A replica is in memory
//! or, with an SSD tier, a LOCAL_DISK record (`is_local_disk_replica`; its `Descriptor` names
//! the owner's disk read service); there is no shared-filesystem disk tier.
//! Copy/move tasks and `batch_replica_clear` are not built.

use crate::enums::ReplicaStatus;
use crate::store::Store;
use mooncake_rs::types;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::HashMap;

/// Where a replica's bytes are: `size` bytes at `buffer_address` in the owner
/// `transport_endpoint` (the owner's segment name). Plain data.
#[pyclass(module = "mooncake.store", name = "Descriptor", from_py_object)]
#[derive(Clone, Debug, Default)]
pub struct PyDescriptor {
    #[pyo3(get, set)]
    size: u64,
    #[pyo3(get, set)]
    buffer_address: u64,
    #[pyo3(get, set)]
    transport_endpoint: String,
}

#[pymethods]
impl PyDescriptor {
    #[new]
    fn new() -> Self {
        PyDescriptor::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// A memory replica's location (`buffer_descriptor`). No constructor.
#[pyclass(module = "mooncake.store", name = "MemoryDescriptor")]
pub struct PyMemoryDescriptor {
    #[pyo3(get, set)]
    buffer_descriptor: PyDescriptor,
}

/// One replica of an object, as the master reported it at the call. No constructor.
#[pyclass(frozen, module = "mooncake.store", name = "ReplicaDescriptor")]
pub struct PyReplicaDescriptor {
    status: ReplicaStatus,
    buffer: PyDescriptor,
    /// A LOCAL_DISK replica (in a client's SSD tier, `docs/ssd-tier.md`).
    local_disk: bool,
}

#[pymethods]
impl PyReplicaDescriptor {
    #[getter]
    fn status(&self) -> ReplicaStatus {
        self.status
    }

    /// Whether the replica is in a segment's memory.
    fn is_memory_replica(&self) -> bool {
        !self.local_disk
    }

    /// Always `False` (no shared-filesystem disk tier; see `is_local_disk_replica`).
    fn is_disk_replica(&self) -> bool {
        false
    }

    /// Whether the replica is a record in its owner's SSD tier (upstream's LOCAL_DISK).
    fn is_local_disk_replica(&self) -> bool {
        self.local_disk
    }

    /// The replica's memory location; `RuntimeError` for a LOCAL_DISK replica.
    fn get_memory_descriptor(&self) -> PyResult<PyMemoryDescriptor> {
        if self.local_disk {
            return Err(PyRuntimeError::new_err("Expected MemoryDescriptor"));
        }
        Ok(PyMemoryDescriptor {
            buffer_descriptor: self.buffer.clone(),
        })
    }

    /// Raises `RuntimeError`: there are no disk replicas.
    fn get_disk_descriptor(&self) -> PyResult<()> {
        Err(PyRuntimeError::new_err("Expected DiskDescriptor"))
    }
}

fn view(replica: &types::ReplicaDescriptor) -> PyReplicaDescriptor {
    PyReplicaDescriptor {
        status: match replica.status {
            types::ReplicaStatus::Undefined => ReplicaStatus::UNDEFINED,
            types::ReplicaStatus::Initialized => ReplicaStatus::INITIALIZED,
            types::ReplicaStatus::Processing => ReplicaStatus::PROCESSING,
            types::ReplicaStatus::Complete => ReplicaStatus::COMPLETE,
            types::ReplicaStatus::Removed => ReplicaStatus::REMOVED,
            types::ReplicaStatus::Failed => ReplicaStatus::FAILED,
        },
        buffer: PyDescriptor {
            size: replica.buffer.size,
            buffer_address: replica.buffer.buffer_address,
            transport_endpoint: replica.buffer.transport_endpoint.clone(),
        },
        local_disk: replica.disk.is_some(),
    }
}

impl Store {
    /// Per found key its replicas (missing or failed keys absent).
    fn replicas(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
    ) -> HashMap<String, Vec<types::ReplicaDescriptor>> {
        self.run(py, HashMap::new(), |c| {
            keys.iter()
                .zip(c.batch_get_replica_desc(&keys))
                .filter_map(|(k, r)| r.ok().map(|q| (k.clone(), q.replicas)))
                .collect()
        })
    }
}

#[pymethods]
impl Store {
    /// The replicas of `key` (`[]` on any error, a missing key included). Grants a lease.
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<PyReplicaDescriptor> {
        self.replicas(py, vec![key])
            .into_values()
            .flatten()
            .map(|r| view(&r))
            .collect()
    }

    /// Key → replicas for every found key; missing or failed keys are absent.
    fn batch_get_replica_desc(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
    ) -> HashMap<String, Vec<PyReplicaDescriptor>> {
        self.replicas(py, keys)
            .into_iter()
            .map(|(k, rs)| (k, rs.iter().map(view).collect()))
            .collect()
    }
}
