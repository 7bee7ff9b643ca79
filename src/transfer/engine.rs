//! [`TransferEngine`]: the public face of the transfer layer. It owns the registry, the
//! optional TCP server, the connection pool and the worker pool, and turns
//! [`TransferRequest`]s into local copies or TCP slices.

use super::batch::{split, Executor, Io, Job, Route};
use super::metrics::{add, bump, CopyPaths, Metrics, Path, PathCounters, TransferMetrics};
use super::rdma::{RdmaDeviceBytes, RdmaDevices, RdmaTransport};
use super::registry::{MemoryRegion, MountHold, Registry, MAX_EPOCH};
use super::resolver::SegmentResolver;
use super::same_host::{Exporter, MappedPeer, PeerMaps};
use super::settings::Settings;
use super::staging::{Staging, STAGE_CHUNK};
use super::tcp::control::{self, Inbox};
use super::tcp::pool::ConnectionPool;
use super::tcp::server::Server;
use super::transport::Opcode;
use super::transport::Slice;
use crate::auth::KeyRing;
use crate::device::{self, MemoryKind};
use crate::error::{fail, last_error_message, ErrorCode, Result};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Something that carries out transfers on this engine's behalf (a dummy client's link to its
/// real client, see [`crate::standalone`]). Once set ([`TransferEngine::set_delegate`]), every
/// [`TransferEngine::transfer`] call goes to it instead of the engine's own transports.
pub trait TransferDelegate: Send + Sync {
    /// Carries out `requests`; one result per request, in order. Errors as
    /// [`TransferEngine::transfer`].
    ///
    /// # Safety
    /// As [`TransferEngine::transfer`].
    unsafe fn transfer(&self, requests: &[TransferRequest<'_>]) -> Vec<Result<()>>;
}

/// How to build a [`TransferEngine`].
pub struct EngineConfig {
    /// This process's segment name (its `local_hostname`, e.g. `"127.0.0.1:12345"`).
    /// Requests whose endpoint equals it are local (see [`TransferEngine::is_local`]).
    pub local_name: String,
    /// `Some`: serve remote access over TCP on this already-bound listener (the engine takes
    /// ownership and closes it at shutdown). `None`: no server (embedded mode).
    pub listener: Option<std::net::TcpListener>,
    /// Maps a segment name to the data socket address of its server.
    pub resolver: Arc<dyn SegmentResolver>,
    /// Requests to our own endpoint are local copies; when `false` they go through TCP to
    /// ourselves (Mooncake's `MC_STORE_MEMCPY`).
    pub memcpy_enabled: bool,
    /// `Some`: remote requests go by one-sided RDMA on these devices (`protocol = "rdma"`;
    /// one device converts with `.into()`): every registered range is also registered with
    /// each NIC, slices are striped across them, and the TCP server answers RDMA
    /// handshakes. `None`: TCP.
    pub rdma: Option<RdmaDevices>,
}

/// Direction of a transfer, seen from this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOp {
    /// Remote (or own registered) memory → local buffer.
    Read,
    /// Local buffer → remote (or own registered) memory.
    Write,
}

/// One transfer between a local buffer and a registered address of segment `endpoint`.
#[derive(Clone, Copy, Debug)]
pub struct TransferRequest<'a> {
    /// Direction.
    pub op: TransferOp,
    /// Local buffer (need not be registered).
    pub local_addr: usize,
    /// Number of bytes; 0 completes at once with no I/O.
    pub len: u64,
    /// Segment name of the process that owns `remote_addr`.
    pub endpoint: &'a str,
    /// Absolute virtual address in the `endpoint` process.
    pub remote_addr: u64,
    /// The segment epoch the replica descriptor named (at most [`MAX_EPOCH`]); `0` = none,
    /// unchecked (buffers that are not segments, P2P tier buffers, Mooncake peers). When
    /// non-zero, the registered range holding `remote_addr` must carry exactly this epoch
    /// (see [`TransferEngine::set_region_epoch`]) or the request fails with
    /// `STALE_SEGMENT_EPOCH` and no byte of it is moved after the remount (slices sent
    /// before it may have moved).
    pub epoch: u64,
    /// No part of the request is started after this instant: a slice not yet sent by then
    /// fails with `STALE_WRITE_TOKEN` (a writer's grant or lease ended: the space may belong to
    /// another key by now). `None`: no limit.
    pub send_by: Option<Instant>,
}

/// Moves bytes between this process's buffers and registered memory of this or other
/// processes.
///
/// Thread-safe: share it by `Arc` and call it from any number of threads. Dropping the last
/// `Arc` shuts it down. Threads: the server runtime (2, only with a listener) and
/// `MC_TCP_LANES_PER_PEER - 1` (at least 1) transfer workers.
pub struct TransferEngine {
    local_name: String,
    memcpy_enabled: bool,
    resolver: Arc<dyn SegmentResolver>,
    settings: Settings,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    paths: PathCounters,
    pool: Arc<ConnectionPool>,
    rdma: Option<Arc<RdmaTransport>>,
    executor: Executor,
    server: Option<Server>,
    delegate: OnceLock<Arc<dyn TransferDelegate>>,
    /// Same-host peers' segments this engine maps (see `same_host`).
    peers: PeerMaps,
    /// Serves our segment to same-host peers (only with a listener and `MC_SAME_HOST=1`).
    exporter: Option<Exporter>,
    /// The cluster key this engine's connections prove, if any.
    cluster_key: Option<Arc<KeyRing>>,
    /// Notifications peers sent to our server.
    inbox: Arc<Inbox>,
}

impl TransferEngine {
    /// Starts an engine: the worker threads and, with a listener, the TCP server. Tunables
    /// come from `MC_TRANSFER_TIMEOUT_MS` and `MC_TCP_LANES_PER_PEER`.
    ///
    /// Errors: `TRANSFER_FAIL` when a thread, the runtime or the listener cannot be set up.
    pub fn new(config: EngineConfig) -> Result<Arc<TransferEngine>> {
        let key = crate::auth::process_key()?;
        TransferEngine::start(config, key)
    }

    /// As [`new`](Self::new), with `key` as the cluster key of every connection of this
    /// engine (its server's and its own) instead of the process's. Errors as `new`.
    pub fn with_cluster_key(
        config: EngineConfig,
        key: Arc<KeyRing>,
    ) -> Result<Arc<TransferEngine>> {
        TransferEngine::start(config, Some(key))
    }

    fn start(config: EngineConfig, key: Option<Arc<KeyRing>>) -> Result<Arc<TransferEngine>> {
        let settings = Settings::from_env();
        let registry = Arc::new(Registry::default());
        let metrics = Arc::new(Metrics::default());
        let pool = Arc::new(ConnectionPool::new(
            settings,
            Arc::clone(&metrics),
            key.clone(),
        ));
        let workers = settings.lanes.saturating_sub(1).max(1);
        let rdma = config.rdma.map(|devices| {
            Arc::new(RdmaTransport::new(
                devices,
                settings.io_timeout,
                Arc::clone(&metrics),
                key.clone(),
            ))
        });
        let io = Io {
            rdma: rdma.clone(),
            pool: Arc::clone(&pool),
            staging: Arc::new(Staging::new(Arc::clone(&metrics))),
            registry: Arc::clone(&registry),
            metrics: Arc::clone(&metrics),
        };
        let executor = match Executor::new(workers, settings.lanes, io) {
            Ok(executor) => executor,
            Err(e) => {
                return fail(
                    ErrorCode::TransferFail,
                    format_args!("cannot start transfer workers: {e}"),
                )
            }
        };
        let inbox = Arc::new(Inbox::default());
        let server = match config.listener {
            Some(listener) => {
                let started = Server::start(
                    listener,
                    Arc::clone(&registry),
                    rdma.clone(),
                    Arc::clone(&metrics),
                    settings,
                    key.clone(),
                    Arc::clone(&inbox),
                );
                if started.is_err() {
                    executor.stop();
                }
                Some(started?)
            }
            None => None,
        };
        let exporter = match (&server, settings.same_host) {
            (Some(_), true) => Exporter::start(
                &config.local_name,
                settings.same_host_handshake,
                key.clone(),
            )
            .map_err(|_| {
                tracing::warn!(
                    detail = %crate::error::last_error_message(),
                    "same-host peers will use TCP to reach this segment"
                )
            })
            .ok(),
            _ => None,
        };
        let peers = PeerMaps::new(
            settings.same_host,
            settings.same_host_retry,
            settings.same_host_handshake,
            Arc::clone(&metrics),
            key.clone(),
        );
        Ok(Arc::new(TransferEngine {
            local_name: config.local_name,
            memcpy_enabled: config.memcpy_enabled,
            resolver: config.resolver,
            settings,
            registry,
            metrics,
            paths: PathCounters::default(),
            pool,
            rdma,
            executor,
            server,
            delegate: OnceLock::new(),
            peers,
            exporter,
            cluster_key: key,
            inbox,
        }))
    }

    /// Hands every later [`transfer`](Self::transfer) to `delegate` (set once, before the
    /// engine is used). Errors: `INVALID_PARAMS` when a delegate is already set.
    pub fn set_delegate(&self, delegate: Arc<dyn TransferDelegate>) -> Result<()> {
        self.delegate.set(delegate).or_else(|_| {
            fail(
                ErrorCode::InvalidParams,
                "the engine already has a delegate",
            )
        })
    }

    /// This process's segment name.
    pub fn local_name(&self) -> &str {
        &self.local_name
    }

    /// The address the TCP server listens on (`None` in embedded mode).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(Server::local_addr)
    }

    /// Registers `[addr, addr+len)`. `remote_accessible` lets peers read and write it over
    /// TCP (mounted segments); otherwise only this process uses it. The engine never frees
    /// the memory; the caller keeps it valid until [`unregister`](Self::unregister) and must
    /// make sure no peer is still transferring into it then.
    ///
    /// Errors: `INVALID_PARAMS` for `addr` 0, `len` 0, a range that wraps around, or overlap
    /// with a registered range.
    /// With RDMA the range is also registered with the NIC (an error then undoes the
    /// registration: `TRANSFER_FAIL` when the device refuses a remotely accessible range; a
    /// local one the device refuses is kept without an MR and goes through bounce buffers).
    pub fn register(&self, addr: usize, len: usize, remote_accessible: bool) -> Result<()> {
        self.registry.register(addr, len, remote_accessible)?;
        let Some(rdma) = &self.rdma else {
            return Ok(());
        };
        match rdma.register(addr, len, remote_accessible) {
            Ok(()) => Ok(()),
            Err(_) if !remote_accessible => {
                tracing::debug!(
                    "{}; it is used through bounce buffers",
                    last_error_message()
                );
                Ok(())
            }
            Err(code) => {
                let message = last_error_message();
                let _ = self.registry.unregister(addr);
                fail(code, message)
            }
        }
    }

    /// Unregisters the range starting at `addr`.
    ///
    /// Errors: `INVALID_PARAMS` when no registered range starts at `addr`.
    /// With RDMA its MR is deregistered first, so the NIC refuses its rkey from then on.
    pub fn unregister(&self, addr: usize) -> Result<()> {
        if let Some(rdma) = &self.rdma {
            rdma.unregister(addr);
        }
        self.registry.unregister(addr)
    }

    /// Sets the segment epoch of the registered range starting at `base` (`0` after
    /// [`register`](Self::register)). From now on requests that name an epoch for this range
    /// (local ones and, through the server, remote ones) are served only if it is `epoch`;
    /// a request already admitted may still finish. Call it on every (re)mount, before the
    /// master hands out descriptors that carry the epoch.
    ///
    /// Errors: `INVALID_PARAMS` when no registered range starts at `base` or `epoch` is over
    /// [`MAX_EPOCH`].
    ///
    /// With RDMA the range is re-registered with the NIC under a new rkey (the old MR is
    /// deregistered first), so peers that still hold the old rkey are refused by the NIC.
    pub fn set_region_epoch(&self, base: usize, epoch: u64) -> Result<()> {
        self.registry.set_epoch(base, epoch, Duration::ZERO)?;
        match &self.rdma {
            Some(rdma) => rdma.set_epoch(base, epoch, false),
            None => Ok(()),
        }
    }

    /// [`set_region_epoch`](Self::set_region_epoch) with `replace_pages` run after the engine
    /// refuses the old epoch and before the range is re-registered with the NIC: a remount that
    /// gives the segment fresh pages (see [`crate::device::MappedRegion::renew_shared`]) must
    /// register the *new* pages, or RDMA peers would read and write the old ones. Errors: as
    /// `set_region_epoch`, and `replace_pages`'. The range is re-registered even when
    /// `replace_pages` failed (it may have replaced the pages before failing), so the NIC
    /// never serves the previous pages or the previous rkey under the new epoch.
    ///
    /// With RDMA the new MRs are registered before the old ones go, and the old ones (which
    /// pin only the replaced pages) are kept through `MC_RDMA_MR_QUARANTINE_MS`, so no rkey a
    /// stale writer may hold is reissued for the new pages.
    ///
    /// Nothing changes while a [`hold_mount`](Self::hold_mount) of the current mount is
    /// alive: the call waits up to `wait` for the holds to end, then fails `TRY_AGAIN`
    /// (counted in `remounts_deferred`; `replace_pages` did not run, call again later).
    pub fn set_region_epoch_with(
        &self,
        base: usize,
        epoch: u64,
        wait: Duration,
        replace_pages: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if let Err(e) = self.registry.set_epoch(base, epoch, wait) {
            if e == ErrorCode::TryAgain {
                bump(&self.metrics.remounts_deferred);
            }
            return Err(e);
        }
        let replaced = replace_pages();
        let registered = match &self.rdma {
            Some(rdma) => rdma.set_epoch(base, epoch, true),
            None => Ok(()),
        };
        replaced.and(registered)
    }

    /// Offers mount `epoch` of our segment `[base, base+len)`, whose pages are the memfd
    /// `file`, to same-host peers (a no-op without a listener or with `MC_SAME_HOST=0`).
    /// Call after [`set_region_epoch`](Self::set_region_epoch) and before the master hands out
    /// descriptors naming `epoch`. Every remount must give the segment a fresh file (see
    /// [`crate::device::MappedRegion::renew_shared`]) between
    /// [`retire_segment_export`](Self::retire_segment_export) and this call.
    ///
    /// Errors: `INTERNAL_ERROR` when the descriptor cannot be duplicated (nothing exported;
    /// peers use TCP).
    pub fn export_segment(
        &self,
        base: usize,
        len: usize,
        epoch: u64,
        file: std::os::fd::BorrowedFd<'_>,
    ) -> Result<()> {
        match &self.exporter {
            Some(exporter) => exporter.publish(base as u64, len as u64, epoch, file),
            None => Ok(()),
        }
    }

    /// Withdraws the exported mount before a remount: a same-host peer's copy that has not
    /// finished by now fails `STALE_SEGMENT_EPOCH`, and peers hand-shake again (and until the
    /// next [`export_segment`](Self::export_segment), use TCP). A no-op when nothing is
    /// exported.
    pub fn retire_segment_export(&self) {
        if let Some(exporter) = &self.exporter {
            exporter.retire();
        }
    }

    /// Holds the mount `epoch` of our registered memory `[addr, addr+len)` for work that
    /// touches it outside the engine (a copy queued on a caller's stream): until the hold is
    /// dropped the range's epoch does not change, so a remount neither replaces its pages nor
    /// unregisters them under that work (see [`set_region_epoch_with`](Self::set_region_epoch_with)).
    /// Counted in `segment_holds` while alive.
    ///
    /// `None` (no error recorded: the caller decides) when the range is not inside one
    /// registered range whose current epoch is `epoch` (the descriptor names an earlier
    /// mount) or that mount is being remounted: its pages must not be copied directly.
    pub(crate) fn hold_mount(&self, addr: usize, len: usize, epoch: u64) -> Option<MountHold> {
        self.registry.hold(addr as u64, len as u64, epoch).ok()
    }

    /// `(base, len)` of every range peers may address (registered remotely accessible), in
    /// address order.
    pub fn remote_ranges(&self) -> Vec<(u64, u64)> {
        self.registry.remote_ranges()
    }

    /// Asks the data server of segment `endpoint` which ranges it serves: `(base, len)` in
    /// address order. Our own segment is answered here.
    ///
    /// Errors: the resolver's when the endpoint does not resolve; `TRANSFER_FAIL` when the
    /// peer cannot be reached
    /// within `MC_TRANSFER_TIMEOUT_MS`, or refuses the query (a Mooncake C++ peer);
    /// `AUTH_FAILED` when the peer refused this engine's cluster key.
    pub fn peer_ranges(&self, endpoint: &str) -> Result<Vec<(u64, u64)>> {
        if endpoint == self.local_name {
            return Ok(self.remote_ranges());
        }
        let peer = self.resolver.resolve(endpoint)?;
        let key = self.cluster_key.as_deref();
        control::query(peer, key, self.settings.io_timeout)
    }

    /// Sends notification `(name, message)` to the data server of segment `endpoint` and
    /// waits for its acknowledgement; our own segment's is kept here.
    ///
    /// Errors: as [`peer_ranges`](Self::peer_ranges); `INVALID_PARAMS` for more than 1 MiB.
    pub fn notify(&self, endpoint: &str, name: &str, message: &str) -> Result<()> {
        if endpoint == self.local_name {
            return match self.inbox.push(name.to_string(), message.to_string()) {
                true => Ok(()),
                false => fail(
                    ErrorCode::InvalidParams,
                    "notification too large, or our inbox is full",
                ),
            };
        }
        let peer = self.resolver.resolve(endpoint)?;
        let key = self.cluster_key.as_deref();
        control::notify(peer, key, self.settings.io_timeout, name, message)
    }

    /// The notifications peers sent to this engine's server since the last call, oldest first
    /// (at most 4096 and 64 MiB are kept: beyond, new ones are refused to their senders).
    pub fn take_notifications(&self) -> Vec<(String, String)> {
        self.inbox.take()
    }

    /// The registered range containing `addr`, if any.
    pub fn region_containing(&self, addr: usize) -> Option<MemoryRegion> {
        self.registry.containing(addr)
    }

    /// Whether requests to `endpoint` are local copies: the name equals ours and the memcpy
    /// path is enabled. Two processes on one host are not local to each other.
    pub fn is_local(&self, endpoint: &str) -> bool {
        self.memcpy_enabled && endpoint == self.local_name
    }

    /// Runs every request and blocks until all have finished; one result per request, in
    /// order. A single-slice request runs on the calling thread; larger ones are split into
    /// up to `MC_TCP_LANES_PER_PEER` slices run in parallel on separate connections.
    ///
    /// The local buffer may be device memory (see [`crate::device`]): local requests then
    /// copy with the driver, and remote ones go in slices of at most 4 MiB through pinned
    /// bounce buffers, or, over RDMA inside a range registered by GPUDirect, straight
    /// to the NIC. Each completed request is counted on its path ([`Self::copy_paths`]).
    ///
    /// Errors per request (detail via `last_error_message` on this thread, for the last
    /// failed request): `STALE_SEGMENT_EPOCH` when the request names an epoch (≠ 0) that is
    /// not the current one of its target range, here (local) or at the peer; nothing was
    /// copied then. `TRANSFER_FAIL` when a local request's remote range is not inside one of
    /// our registered ranges or overlaps the local range, when the epoch is over
    /// [`MAX_EPOCH`], when the endpoint does not resolve, when the peer refuses, fails or
    /// times out (`MC_TRANSFER_TIMEOUT_MS` per socket operation; a connection that failed
    /// or timed out is closed abortively), or after [`shutdown`](Self::shutdown) for remote
    /// endpoints. A request split into slices reports the error of one of its failed slices.
    /// When that error is a connection-level failure (connect refused, reset, timeout, early
    /// close; not a refusal by the peer) the endpoint's cached address is dropped
    /// ([`SegmentResolver::invalidate`]), so the next request looks it up again.
    ///
    /// # Safety
    /// For every request, `[local_addr, local_addr+len)` is valid memory (host or device)
    /// for the operation (readable for Write, writable for Read) until this returns;
    /// requests must not overlap each other's local ranges for Read.
    pub unsafe fn transfer(&self, requests: &[TransferRequest<'_>]) -> Vec<Result<()>> {
        if let Some(delegate) = self.delegate.get() {
            // SAFETY: forwarded from the caller.
            return unsafe { delegate.transfer(requests) };
        }
        let mut planned: Vec<std::result::Result<Option<Path>, String>> =
            Vec::with_capacity(requests.len());
        let mut jobs = Vec::with_capacity(requests.len());
        // Keeps the mappings that mapped jobs point into alive until the batch ends.
        let mut mapped = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            planned.push(self.plan(index, request, &mut jobs, &mut mapped));
        }
        // SAFETY: forwarded from the caller; planned jobs stay inside the requests' ranges,
        // and `mapped` outlives the run.
        let executed = unsafe { self.executor.run(jobs, requests.len()) };
        drop(mapped);
        requests
            .iter()
            .zip(planned.into_iter().zip(executed))
            .map(|(request, (plan, run))| match (plan, run.error) {
                (Err(message), _) => {
                    bump(&self.metrics.failed_requests);
                    fail(ErrorCode::TransferFail, message)
                }
                (Ok(_), Some(error)) => {
                    bump(&self.metrics.failed_requests);
                    if error.unreachable {
                        self.resolver.invalidate(request.endpoint);
                    }
                    fail(error.code, error.message)
                }
                (Ok(path), None) => {
                    self.count_success(request, path, run.copied);
                    Ok(())
                }
            })
            .collect()
    }

    /// A snapshot of the per-path counters (the zero-copy table).
    pub fn copy_paths(&self) -> CopyPaths {
        self.paths.snapshot()
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> TransferMetrics {
        TransferMetrics {
            segment_holds: self.registry.holds(),
            ..self.metrics.snapshot()
        }
    }

    /// Whether remote transfers go by RDMA (`protocol = "rdma"`), so registered local memory
    /// is read and written by the NIC without a bounce copy.
    pub fn uses_rdma(&self) -> bool {
        self.rdma.is_some()
    }

    /// The bytes this engine moved by RDMA through each of its devices, in the order
    /// `device_name` named them (empty without RDMA). A snapshot; thread-safe.
    pub fn rdma_device_bytes(&self) -> Vec<RdmaDeviceBytes> {
        self.rdma
            .as_ref()
            .map_or_else(Vec::new, |rdma| rdma.device_bytes())
    }

    /// Stops the server (closing its listener and connections), closes pooled connections
    /// and lets the workers exit. Later transfers to remote endpoints fail with
    /// `TRANSFER_FAIL`; local copies keep working. Idempotent.
    pub fn shutdown(&self) {
        if let Some(server) = &self.server {
            server.shutdown();
        }
        self.pool.close();
        if let Some(rdma) = &self.rdma {
            rdma.close();
        }
        self.executor.stop();
        if let Some(exporter) = &self.exporter {
            exporter.stop();
        }
        self.peers.clear();
    }

    /// Checks `request`, appends its jobs (none for zero length) and says which path it
    /// takes.
    fn plan(
        &self,
        index: usize,
        request: &TransferRequest<'_>,
        jobs: &mut Vec<Job>,
        mapped: &mut Vec<Arc<MappedPeer>>,
    ) -> std::result::Result<Option<Path>, String> {
        if request.len == 0 {
            return Ok(None);
        }
        let op = match request.op {
            TransferOp::Read => Opcode::Read,
            TransferOp::Write => Opcode::Write,
        };
        let refuse = |problem: &str| {
            format!(
                "{op:?} of {} bytes at {:#x} on {:?}: {problem}",
                request.len, request.remote_addr, request.endpoint
            )
        };
        let len = usize::try_from(request.len)
            .ok()
            .filter(|len| request.local_addr != 0 && request.local_addr.checked_add(*len).is_some())
            .ok_or_else(|| refuse("invalid local buffer"))?;
        if request.remote_addr.checked_add(request.len).is_none() {
            return Err(refuse("remote range wraps around"));
        }
        if request.epoch > MAX_EPOCH {
            return Err(refuse("segment epoch wider than 56 bits"));
        }
        let local = request.local_addr as *mut u8;
        // The request as one job, for the routes that copy it in one go.
        let whole = |route| Job {
            request: index,
            route,
            slice: Slice {
                op,
                local,
                len,
                remote: request.remote_addr,
                epoch: request.epoch,
            },
            staged: false,
            send_by: request.send_by,
        };
        let on_device = matches!(
            device::runtime().classify(request.local_addr),
            MemoryKind::Device(_)
        );
        if self.is_local(request.endpoint) {
            if self
                .registry
                .within(request.remote_addr, request.len)
                .is_none()
            {
                return Err(refuse("not inside one registered range of this process"));
            }
            let (a, b) = (request.local_addr as u64, request.remote_addr);
            if a < b + request.len && b < a + request.len {
                return Err(refuse("overlaps the local buffer"));
            }
            jobs.push(whole(Route::Local));
            return Ok(Some(match (request.op, on_device) {
                (TransferOp::Write, false) => Path::HostToLocalSegment,
                (TransferOp::Write, true) => Path::DeviceToLocalSegment,
                (TransferOp::Read, false) => Path::LocalSegmentToHost,
                (TransferOp::Read, true) => Path::LocalSegmentToDevice,
            }));
        }
        let same_host = (request.endpoint != self.local_name)
            .then(|| {
                self.peers.lookup(
                    request.endpoint,
                    request.epoch,
                    request.remote_addr,
                    request.len,
                )
            })
            .flatten();
        if let Some(peer) = same_host {
            jobs.push(whole(Route::Mapped(peer.target())));
            mapped.push(peer);
            return Ok(Some(match (request.op, on_device) {
                (TransferOp::Write, false) => Path::HostToPeerSegment,
                (TransferOp::Write, true) => Path::DeviceToPeerSegment,
                (TransferOp::Read, false) => Path::PeerSegmentToHost,
                (TransferOp::Read, true) => Path::PeerSegmentToDevice,
            }));
        }
        let peer = self
            .resolver
            .resolve(request.endpoint)
            .map_err(|code| refuse(&format!("cannot resolve the endpoint ({code})")))?;
        for (offset, part) in split(request.len, self.settings.lanes) {
            // Device memory is staged through bounces of STAGE_CHUNK bytes (over RDMA, a
            // GPUDirect-registered range uses the same slices without the bounce).
            let chunk = if on_device { STAGE_CHUNK as u64 } else { part };
            let mut done = 0;
            while done < part {
                let len = chunk.min(part - done);
                let at = offset + done;
                jobs.push(Job {
                    request: index,
                    route: match self.rdma {
                        Some(_) => Route::Rdma(peer),
                        None => Route::Remote(peer),
                    },
                    slice: Slice {
                        op,
                        // In range: at < len and local + len did not overflow.
                        local: local.wrapping_add(at as usize),
                        len: len as usize,
                        remote: request.remote_addr + at,
                        epoch: request.epoch,
                    },
                    staged: on_device,
                    send_by: request.send_by,
                });
                done += len;
            }
        }
        let registered = || self.registry.within(request.local_addr as u64, request.len);
        Ok(Some(match (request.op, on_device) {
            (TransferOp::Write, true) => Path::DeviceToRemote,
            (TransferOp::Write, false) if registered().is_some() => Path::RegisteredToRemote,
            (TransferOp::Write, false) => Path::UnregisteredToRemote,
            (TransferOp::Read, true) => Path::RemoteToDevice,
            (TransferOp::Read, false) => Path::RemoteToHost,
        }))
    }

    fn count_success(&self, request: &TransferRequest<'_>, path: Option<Path>, copied: u64) {
        let Some(path) = path else {
            return;
        };
        self.paths.record(path, request.len, copied);
        let m = &self.metrics;
        let (count, bytes) = match (self.is_local(request.endpoint), request.op) {
            (true, _) => (&m.local_copies, &m.local_copy_bytes),
            (false, TransferOp::Read) if path.is_same_host() => {
                (&m.same_host_reads, &m.same_host_read_bytes)
            }
            (false, TransferOp::Write) if path.is_same_host() => {
                (&m.same_host_writes, &m.same_host_write_bytes)
            }
            // Counted per slice by the RDMA transport (`rdma_*`).
            (false, _) if self.rdma.is_some() => return,
            (false, TransferOp::Read) => (&m.tcp_reads, &m.tcp_read_bytes),
            (false, TransferOp::Write) => (&m.tcp_writes, &m.tcp_write_bytes),
        };
        add(count, bytes, request.len);
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
