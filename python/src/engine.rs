//! `mooncake.engine`: upstream's `TransferEngine` Python API (its pybind module `engine`)
//! on the mooncake-rs transfer engine ([`TransferEndpoint`]), for PD disaggregation (SGLang's
//! `MooncakeTransferEngine`, vLLM's `MooncakeConnector`). The contract is upstream's Transfer
//! Engine Python reference; docs/python.md lists what differs.
//!
//! Return values are upstream's integers: 0 for success and -1 for failure, except
//! `register_memory`/`batch_register_memory` (-7: overlaps a registered range),
//! `unregister_memory` (-3: no registered range starts there), the address-returning calls
//! (0 for failure) and `transfer_check_status` (1 done, 0 pending, -1 failed, -2 timed out).
//! Every failure is also logged with its reason. Methods called before `initialize`
//! fail the same way. Transfers, registrations and waits run with the GIL released.

use crate::convert::U64;
use mooncake_rs::error::{last_error_message, ErrorCode, Result};
use mooncake_rs::transfer::TransferOp;
use mooncake_rs::transfer_api::{BatchState, EndpointConfig, TransferEndpoint, TransferPart};
use parking_lot::RwLock;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;

/// Upstream's `ERR_ADDRESS_NOT_REGISTERED`.
const NOT_REGISTERED: i32 = -3;
/// Upstream's `ERR_ADDRESS_OVERLAPPED`.
const OVERLAPPED: i32 = -7;

/// Upstream's `TransferOpcode` (`Read` = 0, `Write` = 1; equal to those integers).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "mooncake.engine")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOpcode {
    Read = 0,
    Write = 1,
}

/// Upstream's `TransferNotify(name, msg)`: a message for the peer.
#[pyclass(module = "mooncake.engine", from_py_object)]
#[derive(Clone, Debug, Default)]
pub struct TransferNotify {
    #[pyo3(get, set)]
    name: String,
    #[pyo3(get, set)]
    msg: String,
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn new(name: String, msg: String) -> Self {
        TransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// An opcode argument: a `TransferOpcode` or its integer.
fn opcode(value: &Bound<'_, PyAny>) -> PyResult<TransferOp> {
    let number = match value.extract::<TransferOpcode>() {
        Ok(op) => op as i64,
        Err(_) => value.extract::<i64>()?,
    };
    match number {
        0 => Ok(TransferOp::Read),
        1 => Ok(TransferOp::Write),
        other => Err(PyTypeError::new_err(format!(
            "opcode {other} is neither TransferOpcode.Read (0) nor TransferOpcode.Write (1)"
        ))),
    }
}

/// Logs why `what` failed (the library's last error message on this thread).
fn log_failure(what: &str, code: ErrorCode) {
    tracing::error!(call = what, code = ?code, detail = %last_error_message(), "TransferEngine call failed");
}

/// `0`, or -1 with the reason logged.
fn status(what: &str, outcome: Result<()>) -> i32 {
    match outcome {
        Ok(()) => 0,
        Err(code) => {
            log_failure(what, code);
            -1
        }
    }
}

/// The Python `TransferEngine`. Holds at most one endpoint (`initialize` again replaces it).
/// `Sync`: the endpoint is cloned out of the lock for every call.
#[pyclass(module = "mooncake.engine", name = "TransferEngine", subclass)]
pub struct PyTransferEngine {
    endpoint: RwLock<Option<Arc<TransferEndpoint>>>,
}

impl PyTransferEngine {
    fn live(&self, what: &str) -> Option<Arc<TransferEndpoint>> {
        let endpoint = self.endpoint.read().clone();
        if endpoint.is_none() {
            tracing::error!(call = what, "TransferEngine is not initialized");
        }
        endpoint
    }

    fn start(&self, py: Python<'_>, config: EndpointConfig) -> i32 {
        match py.detach(|| TransferEndpoint::start(&config)) {
            Ok(endpoint) => {
                let old = self.endpoint.write().replace(Arc::new(endpoint));
                py.detach(|| drop(old));
                0
            }
            Err(code) => {
                log_failure("initialize", code);
                -1
            }
        }
    }

    /// Runs one sync transfer of `parts` (GIL released); 0 or -1 (also for `None`: lists
    /// that did not zip).
    fn run(
        &self,
        py: Python<'_>,
        target: &str,
        op: TransferOp,
        parts: Option<Vec<TransferPart>>,
    ) -> i32 {
        let (Some(endpoint), Some(parts)) = (self.live("transfer"), parts) else {
            return -1;
        };
        // SAFETY: the local ranges are registered with the endpoint, which the caller keeps
        // valid until unregistering them (upstream's contract).
        let outcome = py.detach(|| unsafe { endpoint.transfer(target, op, &parts) });
        status("transfer", outcome)
    }

    /// After a transfer that returned `moved`: when it succeeded and names a notification,
    /// sends it to `target` (GIL released) and returns 0 once the peer acknowledged it, else
    /// -1; `moved` otherwise.
    fn then_notify(
        &self,
        py: Python<'_>,
        moved: i32,
        target: &str,
        notify: Option<TransferNotify>,
    ) -> i32 {
        let (0, Some(note)) = (moved, notify) else {
            return moved;
        };
        let Some(endpoint) = self.live("notify") else {
            return -1;
        };
        let sent = py.detach(|| endpoint.notify(target, &note.name, &note.msg));
        status("notify", sent)
    }

    /// Submits `parts` (GIL released); the batch id, or 0 (also for `None`).
    fn submit(
        &self,
        py: Python<'_>,
        target: &str,
        op: TransferOp,
        parts: Option<Vec<TransferPart>>,
    ) -> u64 {
        let (Some(endpoint), Some(parts)) = (self.live("transfer_submit"), parts) else {
            return 0;
        };
        // SAFETY: as in `run`; the caller keeps the buffers until the batch ended.
        match py.detach(|| unsafe { endpoint.submit(target, op, parts) }) {
            Ok(id) => id,
            Err(code) => {
                log_failure("transfer_submit", code);
                0
            }
        }
    }
}

/// Zips a batch's lists into parts; `None` when their lengths differ.
fn parts(buffers: &[U64], peers: &[U64], lengths: &[U64]) -> Option<Vec<TransferPart>> {
    if buffers.len() != peers.len() || buffers.len() != lengths.len() {
        tracing::error!(
            buffers = buffers.len(),
            peer_buffer_addresses = peers.len(),
            lengths = lengths.len(),
            "TransferEngine batch lists differ in length"
        );
        return None;
    }
    let zipped = buffers.iter().zip(peers).zip(lengths);
    Some(
        zipped
            .map(|((local, remote), len)| TransferPart {
                local: local.usize(),
                remote: remote.0,
                len: len.0,
            })
            .collect(),
    )
}

fn one(buffer: U64, peer: U64, length: U64) -> Option<Vec<TransferPart>> {
    Some(vec![TransferPart {
        local: buffer.usize(),
        remote: peer.0,
        len: length.0,
    }])
}

#[pymethods]
impl PyTransferEngine {
    #[new]
    fn new() -> Self {
        mooncake_rs::init_logging();
        PyTransferEngine {
            endpoint: RwLock::new(None),
        }
    }

    /// Starts the engine: `metadata_server` is `P2PHANDSHAKE`, `http://host:port/metadata`,
    /// or etcd (`etcd://host:port[,host:port]`, or a bare `host:port` as upstream's default);
    /// `protocol` `"tcp"` or `"rdma"`.
    /// 0 or -1.
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        self.start(
            py,
            EndpointConfig {
                local_hostname: local_hostname.into(),
                metadata_server: metadata_server.into(),
                metadata_type: None,
                protocol: protocol.into(),
                device_name: device_name.into(),
            },
        )
    }

    /// As `initialize`; `metadata_type` is the scheme of a server string without one.
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i32 {
        self.start(
            py,
            EndpointConfig {
                local_hostname: local_hostname.into(),
                metadata_server: metadata_server.into(),
                metadata_type: Some(metadata_type.into()),
                protocol: protocol.into(),
                device_name: device_name.into(),
            },
        )
    }

    /// The port peers reach this engine on (its segment name is `host:port` in P2P mode).
    fn get_rpc_port(&self) -> i32 {
        self.live("get_rpc_port")
            .map_or(-1, |e| i32::from(e.rpc_port()))
    }

    /// This engine's segment name (what peers pass as `target_hostname`). Ours.
    fn get_local_segment_name(&self) -> String {
        self.live("get_local_segment_name")
            .map(|e| e.segment_name().to_string())
            .unwrap_or_default()
    }

    #[pyo3(signature = (buffer_addr, capacity, location = "*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: U64,
        capacity: U64,
        location: &str,
    ) -> i32 {
        let _ = location;
        self.batch_register_memory(py, vec![buffer_addr], vec![capacity], "*")
    }

    fn unregister_memory(&self, py: Python<'_>, buffer_addr: U64) -> i32 {
        self.batch_unregister_memory(py, vec![buffer_addr])
    }

    #[pyo3(signature = (buffer_addresses, capacities, location = "*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<U64>,
        capacities: Vec<U64>,
        location: &str,
    ) -> i32 {
        let _ = location;
        let Some(endpoint) = self.live("register_memory") else {
            return -1;
        };
        if capacities.len() < buffer_addresses.len() || capacities.iter().any(|c| c.0 == 0) {
            tracing::error!("register_memory: a capacity is missing or 0");
            return -1;
        }
        let ranges: Vec<(usize, usize)> = buffer_addresses
            .iter()
            .zip(&capacities)
            .map(|(addr, len)| (addr.usize(), len.usize()))
            .collect();
        if ranges
            .iter()
            .any(|&(addr, len)| endpoint.overlaps_registered(addr, len))
        {
            tracing::error!("register_memory: the range overlaps a registered one");
            return OVERLAPPED;
        }
        // SAFETY: upstream's contract: the caller registers memory it keeps valid until it
        // unregisters it.
        let outcome = py.detach(|| unsafe { endpoint.register_all(&ranges) });
        match outcome {
            Err(ErrorCode::InvalidParams) if last_error_message().contains("overlap") => {
                log_failure("register_memory", ErrorCode::InvalidParams);
                OVERLAPPED
            }
            other => status("register_memory", other),
        }
    }

    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<U64>) -> i32 {
        let Some(endpoint) = self.live("unregister_memory") else {
            return -1;
        };
        let addrs: Vec<usize> = buffer_addresses.iter().map(|a| a.usize()).collect();
        if addrs.iter().any(|&addr| !endpoint.is_registered_base(addr)) {
            tracing::error!("unregister_memory: no registered range starts at an address given");
            return NOT_REGISTERED;
        }
        status(
            "unregister_memory",
            py.detach(|| endpoint.unregister_all(&addrs)),
        )
    }

    /// A registered buffer the engine owns; its address, or 0.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: U64) -> u64 {
        let Some(endpoint) = self.live("allocate_managed_buffer") else {
            return 0;
        };
        match py.detach(|| endpoint.allocate_managed(length.0)) {
            Ok(addr) => addr as u64,
            Err(code) => {
                log_failure("allocate_managed_buffer", code);
                0
            }
        }
    }

    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: U64, length: U64) -> i32 {
        let Some(endpoint) = self.live("free_managed_buffer") else {
            return -1;
        };
        let outcome = py.detach(|| endpoint.free_managed(buffer_addr.usize(), length.0));
        status("free_managed_buffer", outcome)
    }

    /// The lowest address segment `segment_name` serves, or 0.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        let Some(endpoint) = self.live("get_first_buffer_address") else {
            return 0;
        };
        match py.detach(|| endpoint.first_buffer_address(segment_name)) {
            Ok(addr) => addr,
            Err(code) => {
                log_failure("get_first_buffer_address", code);
                0
            }
        }
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: U64,
        peer_buffer_address: U64,
        length: U64,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.run(
            py,
            target_hostname,
            TransferOp::Write,
            one(buffer, peer_buffer_address, length),
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: U64,
        peer_buffer_address: U64,
        length: U64,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.run(
            py,
            target_hostname,
            TransferOp::Read,
            one(buffer, peer_buffer_address, length),
        )
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: U64,
        peer_buffer_address: U64,
        length: U64,
        opcode: &Bound<'_, PyAny>,
        notify: Option<TransferNotify>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let op = self::opcode(opcode)?;
        let moved = self.run(
            py,
            target_hostname,
            op,
            one(buffer, peer_buffer_address, length),
        );
        Ok(self.then_notify(py, moved, target_hostname, notify))
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.run(
            py,
            target_hostname,
            TransferOp::Write,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        transport_hint: &str,
    ) -> i32 {
        let _ = transport_hint;
        self.run(
            py,
            target_hostname,
            TransferOp::Read,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify = None, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<TransferNotify>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let _ = transport_hint;
        let op = self::opcode(opcode)?;
        let moved = self.run(
            py,
            target_hostname,
            op,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        );
        Ok(self.then_notify(py, moved, target_hostname, notify))
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            TransferOp::Write,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint = ""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            TransferOp::Read,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        )
    }

    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint = ""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        opcode: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let _ = transport_hint;
        let op = self::opcode(opcode)?;
        Ok(self.submit(
            py,
            target_hostname,
            op,
            parts(&buffers, &peer_buffer_addresses, &lengths),
        ))
    }

    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint = ""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: U64,
        peer_buffer_address: U64,
        length: U64,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        self.submit(
            py,
            target_hostname,
            TransferOp::Write,
            one(buffer, peer_buffer_address, length),
        )
    }

    /// 1 done, 0 pending, -1 failed (or not a live batch), -2 past its deadline.
    fn transfer_check_status(&self, batch_id: U64) -> i32 {
        let Some(endpoint) = self.live("transfer_check_status") else {
            return -1;
        };
        match endpoint.batch_state(batch_id.0) {
            Ok(BatchState::Done) => 1,
            Ok(BatchState::Pending) => 0,
            Ok(BatchState::Failed) => {
                tracing::error!(batch_id = batch_id.0, "TransferEngine batch failed");
                -1
            }
            Ok(BatchState::TimedOut) => -2,
            Err(code) => {
                log_failure("transfer_check_status", code);
                -1
            }
        }
    }

    /// Waits for every batch (GIL released); 0 when all completed, else -1. Frees them all.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<U64>) -> i32 {
        let Some(endpoint) = self.live("get_batch_transfer_status") else {
            return -1;
        };
        let ids: Vec<u64> = batch_ids.iter().map(|id| id.0).collect();
        status(
            "get_batch_transfer_status",
            py.detach(|| endpoint.wait_batches(&ids)),
        )
    }

    /// Copies `length` bytes of `src_ptr` to `dest_address` (inside registered memory).
    fn write_bytes_to_buffer(&self, dest_address: U64, src_ptr: &[u8], length: U64) -> i32 {
        let Some(endpoint) = self.live("write_bytes_to_buffer") else {
            return -1;
        };
        if length.usize() > src_ptr.len() {
            tracing::error!(
                length = length.0,
                given = src_ptr.len(),
                "write_bytes_to_buffer: length is past the bytes given"
            );
            return -1;
        }
        let bytes = &src_ptr[..length.usize()];
        status(
            "write_bytes_to_buffer",
            endpoint.write_local(dest_address.usize(), bytes),
        )
    }

    /// `length` bytes at `source_address` (inside registered memory); empty on failure.
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: U64,
        length: U64,
    ) -> Bound<'py, PyBytes> {
        let bytes = self
            .live("read_bytes_from_buffer")
            .map(|endpoint| endpoint.read_local(source_address.usize(), length.usize()));
        match bytes {
            Some(Ok(bytes)) => PyBytes::new(py, &bytes),
            Some(Err(code)) => {
                log_failure("read_bytes_from_buffer", code);
                PyBytes::new(py, b"")
            }
            None => PyBytes::new(py, b""),
        }
    }

    /// Benchmark helper of `python/bench.py` (ours): the same sync transfer `times` times in
    /// Rust with the GIL released, the limit a Python caller's `batch_transfer_sync` is
    /// measured against. 0, or -1 at the first failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, times))]
    #[allow(clippy::too_many_arguments)]
    fn _transfer_repeat(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<U64>,
        peer_buffer_addresses: Vec<U64>,
        lengths: Vec<U64>,
        opcode: &Bound<'_, PyAny>,
        times: u32,
    ) -> PyResult<i32> {
        let op = self::opcode(opcode)?;
        let parts = parts(&buffers, &peer_buffer_addresses, &lengths);
        let (Some(endpoint), Some(parts)) = (self.live("_transfer_repeat"), parts) else {
            return Ok(-1);
        };
        let outcome = py.detach(|| {
            (0..times).try_for_each(|_| {
                // SAFETY: as in `run`.
                unsafe { endpoint.transfer(target_hostname, op, &parts) }
            })
        });
        Ok(status("_transfer_repeat", outcome))
    }

    /// Whether the peer answers: 0, or -1.
    #[pyo3(signature = (peer_server_name))]
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
        let Some(endpoint) = self.live("send_probe") else {
            return -1;
        };
        status("send_probe", py.detach(|| endpoint.probe(peer_server_name)))
    }

    /// The notifications peers sent since the last call, oldest first (at most 4096 kept).
    fn get_notifies(&self) -> Vec<TransferNotify> {
        let Some(endpoint) = self.live("get_notifies") else {
            return Vec::new();
        };
        let taken = endpoint.take_notifications().into_iter();
        taken
            .map(|(name, msg)| TransferNotify { name, msg })
            .collect()
    }
}

/// Adds `TransferEngine`, `TransferOpcode` (and its members `Read`, `Write`) and
/// `TransferNotify` to `module`.
pub fn add_to(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyTransferEngine>()?;
    module.add_class::<TransferOpcode>()?;
    module.add_class::<TransferNotify>()?;
    let py = module.py();
    let opcode = py.get_type::<TransferOpcode>();
    module.add("Read", opcode.getattr("Read")?)?;
    module.add("Write", opcode.getattr("Write")?)?;
    py.get_type::<PyTransferEngine>()
        .setattr("TransferOpcode", opcode)?;
    Ok(())
}
