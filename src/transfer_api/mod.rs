//! The transfer engine on its own, as upstream's `mooncake.engine.TransferEngine` offers it
//! to PD-disaggregation frameworks (SGLang's `MooncakeTransferEngine`, vLLM's
//! `MooncakeConnector`): no master and no keys, just registered memory, peers named by
//! segment, and reads and writes of raw addresses. [`TransferEndpoint`] runs on the crate's
//! [`TransferEngine`] (TCP, RDMA, same-host mapping, cluster key), so its rules hold here
//! too: a peer reaches only what this process registered, and every failure is an error
//! code, never a crash.
//!
//! Modules, one job each: `naming` (the `initialize` arguments), `managed` (managed
//! buffers), `batches` (asynchronous batches); this file holds the endpoint.

mod batches;
mod managed;
mod naming;

pub use batches::BatchState;

use crate::device::memcpy_safe;
use crate::env;
use crate::error::{fail, last_error_message, ErrorCode, Result};
use crate::ha::etcd::{self, Etcd};
use crate::metadata::{BufferEntry, MetadataClient, MetadataResolver, SegmentDescriptor};
use crate::transfer::rdma::RdmaDevices;
use crate::transfer::{
    DirectResolver, EngineConfig, SegmentResolver, TransferEngine, TransferOp, TransferRequest,
};
use batches::AsyncBatches;
use managed::ManagedBuffers;
use naming::Metadata;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One piece of a transfer: `len` bytes between local `local` and the peer's `remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferPart {
    /// Address in this process, inside memory registered with this endpoint.
    pub local: usize,
    /// Address in the peer process, inside memory the peer registered.
    pub remote: u64,
    /// Bytes; 0 moves nothing.
    pub len: u64,
}

/// How to start a [`TransferEndpoint`]: upstream's `initialize` arguments.
#[derive(Clone, Debug, Default)]
pub struct EndpointConfig {
    /// `host`, `host:port`, `[v6]:port`: the address peers reach (a port given here is used
    /// only with a metadata service, where this string is the segment name verbatim).
    pub local_hostname: String,
    /// `P2PHANDSHAKE`, `http://host:port/metadata`, or etcd (`etcd://host:port[,host:port]`
    /// or a bare `host:port`).
    pub metadata_server: String,
    /// For `metadata_server` without a scheme (upstream's `initialize_ext`); `None`: etcd.
    pub metadata_type: Option<String>,
    /// `"tcp"` or `"rdma"` (TCP when no RDMA device opens, unless `MC_FORCE_HCA`).
    pub protocol: String,
    /// RDMA devices, comma-separated; empty: the first.
    pub device_name: String,
}

/// Counts of this process's transfers using each registered range (by base), so that an
/// unregistration waits for them.
#[derive(Default)]
struct LocalUses {
    counts: Mutex<HashMap<usize, usize>>,
    ended: Condvar,
}

/// The ranges a running transfer uses; released on drop.
struct UseGuard {
    uses: Arc<LocalUses>,
    bases: Vec<usize>,
}

impl Drop for UseGuard {
    fn drop(&mut self) {
        let mut counts = self.uses.counts.lock();
        for base in &self.bases {
            if let Some(count) = counts.get_mut(base) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(base);
                }
            }
        }
        self.uses.ended.notify_all();
    }
}

/// A standalone transfer endpoint: its engine, listener and name, the memory it registered
/// and its asynchronous batches.
///
/// Thread-safety: every method takes `&self` and may be called from any thread. Dropping it
/// waits for submitted batches, unregisters and unmaps managed buffers, removes its entry
/// from the metadata service and shuts the engine down.
pub struct TransferEndpoint {
    engine: Arc<TransferEngine>,
    name: String,
    host: String,
    port: u16,
    metadata: Option<MetadataClient>,
    uses: Arc<LocalUses>,
    managed: ManagedBuffers,
    batches: Option<AsyncBatches>,
    /// How long an unregistration waits for this process's transfers using the range.
    unregister_wait: Duration,
}

impl TransferEndpoint {
    /// Binds a listener on the host of `local_hostname` (a free port in
    /// `[MC_MIN_RPC_PORT, MC_MAX_RPC_PORT]`), starts the engine and, with a metadata service,
    /// publishes the segment. The segment name is `host:port` in P2P-handshake mode (IPv6 in
    /// brackets) and `local_hostname` verbatim with a metadata service.
    ///
    /// Errors: `INVALID_PARAMS` for an empty hostname, an unresolvable host, a protocol other
    /// than tcp/rdma or an unserved metadata server; `INTERNAL_ERROR` when no port is free;
    /// `TRANSFER_FAIL` when RDMA is forced (`MC_FORCE_HCA`) and no device opens; the metadata
    /// service's errors.
    pub fn start(config: &EndpointConfig) -> Result<TransferEndpoint> {
        let metadata = naming::metadata(&config.metadata_server, config.metadata_type.as_deref())?;
        let (host, _) = naming::split_host(&config.local_hostname);
        if host.is_empty() {
            return fail(ErrorCode::InvalidParams, "local_hostname is empty");
        }
        let rdma = rdma_devices(&config.protocol, &config.device_name)?;
        let listener = naming::bind_in_range(&host)?;
        let port = match listener.local_addr() {
            Ok(addr) => addr.port(),
            Err(e) => return fail(ErrorCode::InternalError, format!("listener address: {e}")),
        };
        let client = match &metadata {
            Metadata::P2pHandshake => None,
            Metadata::Http(url) => Some(MetadataClient::new(url)?),
            Metadata::Etcd(endpoints) => {
                let timeout = Duration::from_millis(env::RPC_TIMEOUT_MS.get());
                let etcd = Etcd::connect(&etcd::endpoints(endpoints), timeout)?;
                let cluster_id = env::METADATA_CLUSTER_ID.get();
                Some(MetadataClient::on(Arc::new(etcd), cluster_id.as_deref()))
            }
        };
        let (name, resolver): (_, Arc<dyn SegmentResolver>) = match &client {
            None => (naming::endpoint_name(&host, port), Arc::new(DirectResolver)),
            Some(client) => (
                config.local_hostname.trim().to_string(),
                Arc::new(MetadataResolver::new(client.share())),
            ),
        };
        let engine = TransferEngine::new(EngineConfig {
            local_name: name.clone(),
            listener: Some(listener),
            resolver,
            memcpy_enabled: true,
            rdma,
        })?;
        let timeout = Duration::from_secs(env::TE_TRANSFER_TIMEOUT_S.get());
        let endpoint = TransferEndpoint {
            engine,
            name,
            host,
            port,
            metadata: client,
            uses: Arc::default(),
            managed: ManagedBuffers::new(Duration::from_millis(env::TRANSFER_TIMEOUT_MS.get())),
            batches: Some(AsyncBatches::start(timeout)?),
            unregister_wait: Duration::from_millis(env::TRANSFER_TIMEOUT_MS.get()),
        };
        endpoint.publish()?;
        Ok(endpoint)
    }

    /// The name peers address this endpoint by (`target_hostname` of their transfers).
    pub fn segment_name(&self) -> &str {
        &self.name
    }

    /// The port the endpoint listens on (upstream's `get_rpc_port`).
    pub fn rpc_port(&self) -> u16 {
        self.port
    }

    /// Whether remote transfers go by RDMA.
    pub fn uses_rdma(&self) -> bool {
        self.engine.uses_rdma()
    }

    /// The engine's transfer counters (bytes by path: TCP, RDMA, local).
    pub fn metrics(&self) -> crate::transfer::TransferMetrics {
        self.engine.metrics()
    }

    /// Registers `[addr, addr+len)` for transfers: as their local side, and for peers to read
    /// and write. With a metadata service the segment's buffer list is published again.
    ///
    /// # Safety
    /// The range is valid, readable and writable memory until it is unregistered.
    ///
    /// Errors: `INVALID_PARAMS` for address 0, length 0, a wrapping range or overlap with a
    /// registered range; the engine's RDMA errors; the metadata service's.
    pub unsafe fn register(&self, addr: usize, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_all(&[(addr, len)]) }
    }

    /// Registers every `(addr, len)`, all or none: ranges overlapping each other or a
    /// registered range are refused before any is registered. Errors and safety as
    /// [`register`](Self::register).
    ///
    /// # Safety
    /// As [`register`](Self::register), for every range.
    pub unsafe fn register_all(&self, ranges: &[(usize, usize)]) -> Result<()> {
        let mut sorted: Vec<(usize, usize)> = ranges.to_vec();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            if pair[0].0.saturating_add(pair[0].1) > pair[1].0 {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "ranges {:#x}+{} and {:#x} overlap",
                        pair[0].0, pair[0].1, pair[1].0
                    ),
                );
            }
        }
        for (index, &(addr, len)) in ranges.iter().enumerate() {
            if let Err(code) = self.engine.register(addr, len, true) {
                let message = last_error_message();
                for &(done, _) in &ranges[..index] {
                    let _ = self.engine.unregister(done);
                }
                crate::error::set_last_error_message(message);
                return Err(code);
            }
        }
        if let Err(code) = self.publish() {
            let message = last_error_message();
            for &(addr, _) in ranges {
                let _ = self.engine.unregister(addr);
            }
            crate::error::set_last_error_message(message);
            return Err(code);
        }
        Ok(())
    }

    /// Unregisters the range that starts at `addr`, once this process's transfers using it
    /// ended. A peer's transfer the data server admitted before may still land (stop peers
    /// first, as with upstream).
    ///
    /// Errors: `INVALID_PARAMS` when no registered range starts at `addr` or it is a managed
    /// buffer's; `TRY_AGAIN` when transfers still use it after `MC_TRANSFER_TIMEOUT_MS`; the
    /// metadata service's.
    pub fn unregister(&self, addr: usize) -> Result<()> {
        if self.managed.owns_pool(addr) {
            return fail(
                ErrorCode::InvalidParams,
                format!("{addr:#x} is managed memory: free it with free_managed_buffer"),
            );
        }
        self.unregister_quietly(addr)?;
        self.publish()
    }

    /// [`unregister`](Self::unregister) for each address; every one is tried, the first
    /// error is returned.
    pub fn unregister_all(&self, addrs: &[usize]) -> Result<()> {
        let mut first = None;
        for &addr in addrs {
            if let Err(code) = self.unregister(addr) {
                first.get_or_insert((code, last_error_message()));
            }
        }
        match first {
            Some((code, message)) => {
                crate::error::set_last_error_message(message);
                Err(code)
            }
            None => Ok(()),
        }
    }

    /// Waits for this process's transfers using the range at `addr`, then unregisters it.
    fn unregister_quietly(&self, addr: usize) -> Result<()> {
        let deadline = Instant::now() + self.unregister_wait;
        let mut counts = self.uses.counts.lock();
        while counts.contains_key(&addr) {
            if self
                .uses
                .ended
                .wait_until(&mut counts, deadline)
                .timed_out()
            {
                return fail(
                    ErrorCode::TryAgain,
                    format!("transfers still use the range at {addr:#x}"),
                );
            }
        }
        self.engine.unregister(addr)
    }

    /// A registered buffer of `len` bytes that the endpoint owns (upstream's
    /// `allocate_managed_buffer`); its address. Errors: `INVALID_PARAMS` for 0 bytes;
    /// `INTERNAL_ERROR` without memory; registration and metadata errors.
    pub fn allocate_managed(&self, len: u64) -> Result<usize> {
        let (addr, new_pool) = self.managed.allocate(&self.engine, len)?;
        if new_pool {
            if let Err(code) = self.publish() {
                let message = last_error_message();
                let _ = self.free_managed(addr, len);
                crate::error::set_last_error_message(message);
                return Err(code);
            }
        }
        Ok(addr)
    }

    /// Gives back a managed buffer (`len`: the length it was allocated with). Its bytes are
    /// reused (a large buffer's own mapping unmapped) only after the data server's request
    /// deadline (`MC_TRANSFER_TIMEOUT_MS`): a peer's write admitted before may still land.
    /// Errors: `INVALID_PARAMS` for an address or length that is not such a buffer's;
    /// for a large buffer, `TRY_AGAIN` as [`unregister`](Self::unregister) (nothing freed:
    /// free it again later) and the metadata service's errors.
    pub fn free_managed(&self, addr: usize, len: u64) -> Result<()> {
        let Some(pool) = self.managed.dedicated_pool(addr, len)? else {
            return self.managed.free(addr, len);
        };
        self.unregister_quietly(pool)?;
        self.managed.free(addr, len)?;
        self.publish()
    }

    /// The lowest address segment `segment_name` serves (upstream's
    /// `get_first_buffer_address`), asked of the peer (found through the metadata service when
    /// there is one). Errors: `SEGMENT_NOT_FOUND` when it serves no buffer; as
    /// [`TransferEngine::peer_ranges`].
    pub fn first_buffer_address(&self, segment_name: &str) -> Result<u64> {
        let segment = segment_name.trim_start_matches('/');
        let ranges = self.engine.peer_ranges(segment)?;
        match ranges.first() {
            Some((base, _)) => Ok(*base),
            None => fail(
                ErrorCode::SegmentNotFound,
                format!("{segment} serves no buffer"),
            ),
        }
    }

    /// Moves every part between this process and segment `target` and waits.
    ///
    /// # Safety
    /// No other thread frees or unmaps the local ranges while this runs (they are
    /// registered, so they are valid memory when it starts).
    ///
    /// Errors: `INVALID_PARAMS` for an empty target or a local range not inside memory
    /// registered with this endpoint (nothing moves then); the engine's errors of the first
    /// failed part (`TRANSFER_FAIL` for a remote range the peer did not register, an
    /// unknown or unreachable segment).
    pub unsafe fn transfer(
        &self,
        target: &str,
        op: TransferOp,
        parts: &[TransferPart],
    ) -> Result<()> {
        let target = target.trim_start_matches('/');
        let guard = self.use_ranges(target, parts)?;
        // SAFETY: the local ranges are registered and stay so (the guard) until this returns.
        let outcome = unsafe { run(&self.engine, target, op, parts) };
        drop(guard);
        outcome
    }

    /// Starts moving every part on a background thread; the batch id (≥ 1) for
    /// [`batch_state`](Self::batch_state) and [`wait_batches`](Self::wait_batches).
    ///
    /// # Safety
    /// The local ranges stay valid until the batch ended (they cannot be unregistered
    /// before: an unregistration waits for it).
    ///
    /// Errors: as [`transfer`](Self::transfer) for the checks made before it starts.
    pub unsafe fn submit(
        &self,
        target: &str,
        op: TransferOp,
        parts: Vec<TransferPart>,
    ) -> Result<u64> {
        let target = target.trim_start_matches('/').to_string();
        let guard = self.use_ranges(&target, &parts)?;
        let engine = Arc::clone(&self.engine);
        let bytes = parts.iter().fold(0u64, |sum, p| sum.saturating_add(p.len));
        let work = Box::new(move || {
            // SAFETY: the caller keeps the ranges valid until the batch ends; the guard keeps
            // them registered.
            let outcome = unsafe { run(&engine, &target, op, &parts) };
            drop(guard);
            outcome
        });
        match &self.batches {
            Some(batches) => batches.submit(bytes, work),
            None => fail(ErrorCode::InternalError, "the endpoint is closing"),
        }
    }

    /// Where batch `id` stands (freed when it ended). Errors: `INVALID_PARAMS` for an id
    /// that is not a live batch.
    pub fn batch_state(&self, id: u64) -> Result<BatchState> {
        match &self.batches {
            Some(batches) => batches.check(id),
            None => fail(ErrorCode::InternalError, "the endpoint is closing"),
        }
    }

    /// Waits for every batch of `ids`; frees them all. Errors: `INVALID_PARAMS` for an id
    /// that is not a live batch; the first failed batch's error; `TRANSFER_TIMEOUT` for one
    /// past its deadline.
    pub fn wait_batches(&self, ids: &[u64]) -> Result<()> {
        match &self.batches {
            Some(batches) => batches.wait_all(ids),
            None => fail(ErrorCode::InternalError, "the endpoint is closing"),
        }
    }

    /// Whether `[addr, addr+len)` overlaps memory registered with this endpoint.
    pub fn overlaps_registered(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len);
        self.engine.region_containing(addr).is_some()
            || self
                .engine
                .remote_ranges()
                .iter()
                .any(|&(base, _)| (addr..end).contains(&(base as usize)))
    }

    /// Whether a range registered with this endpoint starts at `addr`.
    pub fn is_registered_base(&self, addr: usize) -> bool {
        self.engine
            .region_containing(addr)
            .is_some_and(|region| region.base == addr)
    }

    /// Copies `bytes` to `addr` of this process (upstream's `write_bytes_to_buffer`), host or
    /// device memory. Errors: `INVALID_PARAMS` when the range is not inside registered memory;
    /// `TRANSFER_FAIL` when the device runtime refuses the copy.
    pub fn write_local(&self, addr: usize, bytes: &[u8]) -> Result<()> {
        let part = TransferPart {
            local: addr,
            remote: 0,
            len: bytes.len() as u64,
        };
        let _guard = self.use_ranges("-", &[part])?;
        // SAFETY: the range lies inside registered memory (valid by the registrant's
        // contract), held registered by the guard; `bytes` is a distinct Rust slice.
        let copied = unsafe { memcpy_safe(addr as *mut u8, bytes.as_ptr(), bytes.len()) };
        copied
            .map(drop)
            .or_else(|e| fail(ErrorCode::TransferFail, e))
    }

    /// `len` bytes at `addr` of this process (upstream's `read_bytes_from_buffer`), host or
    /// device memory. Errors as [`write_local`](Self::write_local).
    pub fn read_local(&self, addr: usize, len: usize) -> Result<Vec<u8>> {
        let part = TransferPart {
            local: addr,
            remote: 0,
            len: len as u64,
        };
        let _guard = self.use_ranges("-", &[part])?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write_local`; `out` is ours, `len` bytes.
        let copied = unsafe { memcpy_safe(out.as_mut_ptr(), addr as *const u8, len) };
        copied
            .map(|_| out)
            .or_else(|e| fail(ErrorCode::TransferFail, e))
    }

    /// Sends notification `(name, message)` to segment `target` and waits for its
    /// acknowledgement (upstream's `TransferNotify`, sent after the transfer it goes with).
    /// Errors: as [`TransferEngine::notify`].
    pub fn notify(&self, target: &str, name: &str, message: &str) -> Result<()> {
        self.engine
            .notify(target.trim_start_matches('/'), name, message)
    }

    /// The notifications peers sent since the last call, oldest first (upstream's
    /// `get_notifies`).
    pub fn take_notifications(&self) -> Vec<(String, String)> {
        self.engine.take_notifications()
    }

    /// Whether segment `segment_name` answers a segment query (upstream's `send_probe`).
    /// Errors: as [`TransferEngine::peer_ranges`].
    pub fn probe(&self, segment_name: &str) -> Result<()> {
        self.engine
            .peer_ranges(segment_name.trim_start_matches('/'))
            .map(drop)
    }

    /// Checks the parts (target named, local ranges registered) and marks their ranges in use.
    fn use_ranges(&self, target: &str, parts: &[TransferPart]) -> Result<UseGuard> {
        if target.is_empty() {
            return fail(ErrorCode::InvalidParams, "target_hostname is empty");
        }
        let mut counts = self.uses.counts.lock();
        let mut bases = Vec::new();
        for part in parts.iter().filter(|p| p.len > 0) {
            let region = self.engine.region_containing(part.local);
            let inside = region.filter(|r| {
                let offset = (part.local - r.base) as u64;
                offset
                    .checked_add(part.len)
                    .is_some_and(|end| end <= r.len as u64)
            });
            let Some(region) = inside else {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "local buffer {:#x}+{} is not inside memory registered with this engine",
                        part.local, part.len
                    ),
                );
            };
            if !bases.contains(&region.base) {
                bases.push(region.base);
            }
        }
        for base in &bases {
            *counts.entry(*base).or_insert(0) += 1;
        }
        Ok(UseGuard {
            uses: Arc::clone(&self.uses),
            bases,
        })
    }

    /// Publishes the segment (host, port, buffers) to the metadata service, if any.
    fn publish(&self) -> Result<()> {
        let Some(metadata) = &self.metadata else {
            return Ok(());
        };
        let buffers = self.engine.remote_ranges().into_iter();
        let descriptor = SegmentDescriptor {
            host: self.host.clone(),
            rpc_port: self.port,
            tcp_data_port: self.port,
            buffers: buffers
                .map(|(addr, length)| BufferEntry {
                    name: "*".into(),
                    addr,
                    length,
                })
                .collect(),
        };
        metadata.publish_segment(&self.name, &descriptor)
    }
}

impl Drop for TransferEndpoint {
    fn drop(&mut self) {
        drop(self.batches.take());
        if let Some(metadata) = &self.metadata {
            if metadata.remove_segment(&self.name).is_err() {
                tracing::warn!(segment = %self.name, detail = %last_error_message(), "cannot remove the segment from the metadata service");
            }
        }
        // No peer reaches the managed memory once the engine's server is down.
        self.engine.shutdown();
        self.managed.release_all(&self.engine);
    }
}

/// The RDMA devices `protocol` asks for: `None` for TCP (`"tcp"`, `MC_FORCE_TCP`, or `"rdma"`
/// where no device opens and `MC_FORCE_HCA` is off, with a warning).
fn rdma_devices(protocol: &str, device_name: &str) -> Result<Option<RdmaDevices>> {
    match protocol.trim().to_ascii_lowercase().as_str() {
        "tcp" => Ok(None),
        "rdma" if env::FORCE_TCP.flag() => Ok(None),
        "rdma" => match RdmaDevices::open(device_name) {
            Ok(devices) => Ok(Some(devices)),
            Err(code) if env::FORCE_HCA.flag() => Err(code),
            Err(_) => {
                tracing::warn!(detail = %last_error_message(), "no RDMA device: the transfer engine uses TCP");
                Ok(None)
            }
        },
        other => fail(
            ErrorCode::InvalidParams,
            format!("protocol {other:?} is not served here; use \"tcp\" or \"rdma\""),
        ),
    }
}

/// Runs `parts` on `engine` against `target`; the first failed part's error.
///
/// # Safety
/// As [`TransferEngine::transfer`] for the local ranges.
unsafe fn run(
    engine: &TransferEngine,
    target: &str,
    op: TransferOp,
    parts: &[TransferPart],
) -> Result<()> {
    let requests: Vec<TransferRequest<'_>> = parts
        .iter()
        .map(|part| TransferRequest {
            op,
            local_addr: part.local,
            len: part.len,
            endpoint: target,
            remote_addr: part.remote,
            epoch: 0,
            send_by: None,
        })
        .collect();
    // SAFETY: forwarded from the caller.
    let outcomes = unsafe { engine.transfer(&requests) };
    match outcomes.into_iter().find_map(|o| o.err()) {
        // The engine recorded the failed part's message.
        Some(code) => Err(code),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
