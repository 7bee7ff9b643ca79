//! [`RdmaTransport`]: this process's memory registrations on its devices, its pool of
//! connected queue pairs per (local device, peer), and running one slice as one-sided
//! READ/WRITE on one of the devices (slices are striped across the devices round-robin).
//!
//! Integrity rule (with one-sided verbs the owner is not involved per operation): every
//! registered range has its own MR, and a (re)mount re-registers it ([`Self::set_epoch`])
//! and unregistering deregisters it, so an rkey handed out before is refused by the NIC
//! (remote access error) once the range was unmounted or remounted: no byte lands through a
//! stale rkey. Epochs named by requests are checked against the region table the peer sent
//! in the handshake; a mismatch fetches a fresh table (a new connection) once, and then fails
//! with `STALE_SEGMENT_EPOCH`.

use super::bounce::{Bounces, BOUNCE_LEN};
use super::device::{RdmaDevice, Registration};
use super::devices::RdmaDevices;
use super::handshake::{self, RemoteRegion, REQUEST_LEN};
use super::qp::{QpSettings, QueuePair, WorkRequest};
use crate::auth::{self, KeyRing};
use crate::env;
use crate::error::{fail, last_error_message, ErrorCode, Result};
use crate::transfer::copy::copy_bytes;
use crate::transfer::metrics::{add, bump, Metrics};
use crate::transfer::staging::Staging;
use crate::transfer::transport::Opcode;
use crate::transfer::transport::{Slice, SliceError};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most idle connections kept per peer.
const MAX_IDLE_PER_PEER: usize = 32;

/// A registered range of this process: one registration per device, in device order.
struct LocalRegion {
    len: usize,
    remote_accessible: bool,
    epoch: u64,
    registrations: Vec<Arc<Registration>>,
}

/// One device of the transport: its bounce pool and the bytes moved through it.
struct Nic {
    device: Arc<RdmaDevice>,
    bounces: Bounces,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
}

/// The bytes this process moved by RDMA through one of its devices (work requests it
/// posted: READ for gets, WRITE for puts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaDeviceBytes {
    /// The device name (e.g. `rxe0`).
    pub device: String,
    /// Bytes read from peers (RDMA READ) through it.
    pub read_bytes: u64,
    /// Bytes written to peers (RDMA WRITE) through it.
    pub write_bytes: u64,
}

/// A connected QP to one peer, its TCP control connection (which keeps the peer's QP
/// alive), the peer's region table (rkeys on the peer device the QP is connected to) and
/// the index of our device the QP is on.
struct Connection {
    qp: QueuePair,
    control: TcpStream,
    regions: Vec<RemoteRegion>,
    nic: usize,
}

/// Whether the peer closed the control connection `control` (it shut down or died). One
/// non-blocking peek (`MSG_PEEK | MSG_DONTWAIT`): the socket's own blocking mode is left
/// alone, and a reused connection costs one system call per slice.
fn peer_closed(control: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a live socket of ours; `byte` is valid for one byte and outlives the call.
    let got = unsafe {
        libc::recv(
            control.as_raw_fd(),
            std::ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match got {
        0 => true,
        n if n > 0 => false,
        // Nothing to read (or a signal interrupted the peek): still open.
        _ => !matches!(
            std::io::Error::last_os_error().kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

/// Why a run of work requests did not complete.
enum RunError {
    /// The writer's `send_by` passed before every request was posted; the QP is fine.
    Late,
    /// A request failed, timed out or could not be prepared.
    Failed(String),
}

impl From<String> for RunError {
    fn from(problem: String) -> Self {
        RunError::Failed(problem)
    }
}

impl Connection {
    /// [`QueuePair::run`], giving up early when the peer closed the control connection;
    /// nothing is posted at or after `send_by`. The first failure, if any.
    ///
    /// # Safety
    /// As [`QueuePair::run`].
    unsafe fn run(
        &mut self,
        requests: &[WorkRequest],
        deadline: Instant,
        send_by: Option<Instant>,
    ) -> std::result::Result<(), RunError> {
        let control = &self.control;
        let alive = || !peer_closed(control);
        // SAFETY: forwarded from the caller.
        let results = unsafe { self.qp.run(requests, deadline, send_by, &alive) };
        match results.into_iter().find_map(std::result::Result::err) {
            None => Ok(()),
            // Only requests left unposted at `send_by` fail without breaking the QP.
            Some(_) if !self.qp.is_broken() => Err(RunError::Late),
            Some(problem) => Err(RunError::Failed(problem)),
        }
    }
}

/// What a region lookup in a peer's table found.
enum Lookup {
    Found(RemoteRegion),
    Missing,
    Stale(u64),
}

fn lookup(regions: &[RemoteRegion], addr: u64, len: u64, epoch: u64) -> Lookup {
    match regions.iter().find(|r| r.contains(addr, len)) {
        None => Lookup::Missing,
        Some(r) if epoch != 0 && r.epoch != epoch => Lookup::Stale(r.epoch),
        Some(r) => Lookup::Found(*r),
    }
}

/// The RDMA side of a transfer engine. Thread-safe; shared by `Arc` between the engine's
/// workers and its server.
pub(crate) struct RdmaTransport {
    /// Never empty ([`RdmaDevices`] has at least one device).
    nics: Vec<Nic>,
    /// Which device the next slice goes through (round-robin).
    next_nic: AtomicUsize,
    qp_settings: QpSettings,
    slice_size: usize,
    timeout: Duration,
    /// How long a remount keeps the previous mount's MRs (`MC_RDMA_MR_QUARANTINE_MS`).
    mr_quarantine: Duration,
    regions: RwLock<BTreeMap<usize, LocalRegion>>,
    /// Idle connections per (peer, index of our device).
    idle: Mutex<HashMap<(SocketAddr, usize), Vec<Connection>>>,
    /// Set by [`Self::close`]: no connection is made or pooled after it.
    closed: AtomicBool,
    metrics: Arc<Metrics>,
    /// The key each control connection proves before the RDMA handshake, if any.
    cluster_key: Option<Arc<KeyRing>>,
}

impl RdmaTransport {
    /// A transport on `devices`; `timeout` bounds every handshake read and every batch of
    /// work requests; with `cluster_key`, each control connection proves it first.
    pub(crate) fn new(
        devices: RdmaDevices,
        timeout: Duration,
        metrics: Arc<Metrics>,
        cluster_key: Option<Arc<KeyRing>>,
    ) -> Self {
        // MC_SLICE_SIZE: bytes per work request (4096..=1 GiB, default 64 KiB).
        let slice_size = crate::env::SLICE_SIZE.get() as usize;
        let nics = devices
            .devices()
            .iter()
            .map(|device| Nic {
                device: Arc::clone(device),
                bounces: Bounces::new(Arc::clone(device)),
                read_bytes: AtomicU64::new(0),
                write_bytes: AtomicU64::new(0),
            })
            .collect();
        RdmaTransport {
            nics,
            next_nic: AtomicUsize::new(0),
            qp_settings: QpSettings::from_env(),
            slice_size,
            timeout,
            mr_quarantine: Duration::from_millis(env::RDMA_MR_QUARANTINE_MS.get()),
            regions: RwLock::new(BTreeMap::new()),
            idle: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            metrics,
            cluster_key,
        }
    }

    /// This transport with a remount quarantine of `quarantine` for its old MRs.
    #[cfg(test)]
    pub(super) fn with_mr_quarantine(mut self, quarantine: Duration) -> Self {
        self.mr_quarantine = quarantine;
        self
    }

    /// The bytes moved through each device, in device order.
    pub(crate) fn device_bytes(&self) -> Vec<RdmaDeviceBytes> {
        self.nics
            .iter()
            .map(|nic| RdmaDeviceBytes {
                device: nic.device.name().to_string(),
                read_bytes: nic.read_bytes.load(Ordering::Relaxed),
                write_bytes: nic.write_bytes.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// `[addr, addr+len)` registered on every device (all or none), for peers' access too
    /// when `remote_accessible`; device memory by GPUDirect ([`super::gpudirect`]).
    fn register_everywhere(
        &self,
        addr: usize,
        len: usize,
        remote_accessible: bool,
    ) -> Result<Vec<Arc<Registration>>> {
        let on_device = crate::device::runtime().is_device(addr);
        self.nics
            .iter()
            .map(|nic| match on_device {
                true => super::gpudirect::register(&nic.device, addr, len, remote_accessible),
                false => nic.device.register(addr, len, remote_accessible),
            })
            .map(|registration| registration.map(Arc::new))
            .collect()
    }

    /// Registers `[addr, addr+len)` with every device (epoch 0).
    ///
    /// Errors: `TRANSFER_FAIL` when a device refuses the registration (then it is registered
    /// on none).
    pub(crate) fn register(&self, addr: usize, len: usize, remote_accessible: bool) -> Result<()> {
        let registrations = self.register_everywhere(addr, len, remote_accessible)?;
        self.regions.write().insert(
            addr,
            LocalRegion {
                len,
                remote_accessible,
                epoch: 0,
                registrations,
            },
        );
        Ok(())
    }

    /// Deregisters the range starting at `addr` (nothing if it has no MR): its rkey is
    /// refused by the NIC from now on. A transfer of ours still using it as local memory keeps
    /// it registered until that transfer ends.
    pub(crate) fn unregister(&self, addr: usize) {
        self.regions.write().remove(&addr);
    }

    /// Re-registers the range starting at `base` under new rkeys (on every device) and records
    /// `epoch`. Peers learn the new rkeys at their next handshake.
    ///
    /// `pages_replaced`: the range got fresh pages since the old MRs were registered (a
    /// remount). Then the new MRs are registered while the old ones exist, and the old ones
    /// are kept (pinning only the previous, orphaned pages) through
    /// `MC_RDMA_MR_QUARANTINE_MS` (see `retire`): no rkey of the old mount is reissued while
    /// a stale writer may hold it, and its WRITEs land in pages this process no longer uses
    /// (a stale reader reads the old mount's bytes). Otherwise the old
    /// MRs cover the very pages the new ones do and are deregistered first: the NIC refuses
    /// their rkeys from now on (a reissued rkey would reach the same pages as the old one).
    ///
    /// Errors: `TRANSFER_FAIL` when the range is not registered here or a device refuses (then
    /// the range has no MR until the next `set_epoch` registers it again; the old MRs are
    /// retired all the same).
    pub(crate) fn set_epoch(&self, base: usize, epoch: u64, pages_replaced: bool) -> Result<()> {
        let mut regions = self.regions.write();
        let Some(region) = regions.remove(&base) else {
            return fail(
                ErrorCode::TransferFail,
                format_args!("no RDMA registration starts at {base:#x}"),
            );
        };
        let (len, remote_accessible) = (region.len, region.remote_accessible);
        let quarantine = match pages_replaced {
            true => self.mr_quarantine,
            false => Duration::ZERO,
        };
        let replaced = super::retire::replace(
            region.registrations,
            || self.register_everywhere(base, len, remote_accessible),
            quarantine,
        );
        // A refused registration leaves the range known but unregistered (no rkey is handed
        // out for it), so the next remount registers it again.
        let registrations = replaced.as_ref().map_or(Vec::new(), Vec::clone);
        regions.insert(
            base,
            LocalRegion {
                len,
                remote_accessible,
                epoch,
                registrations,
            },
        );
        replaced.map(drop)
    }

    /// The table a handshake reply for a QP on device `nic` carries: every remotely
    /// accessible region, with its rkey on that device.
    pub(super) fn remote_table(&self, nic: usize) -> Vec<RemoteRegion> {
        self.regions
            .read()
            .iter()
            .filter(|(_, r)| r.remote_accessible)
            .filter_map(|(base, r)| {
                Some(RemoteRegion {
                    base: *base as u64,
                    len: r.len as u64,
                    rkey: r.registrations.get(nic)?.rkey(),
                    epoch: r.epoch,
                })
            })
            .collect()
    }

    /// The registration on device `nic` holding all of `[addr, addr+len)`, if any.
    fn local_registration(&self, addr: usize, len: usize, nic: usize) -> Option<Arc<Registration>> {
        let regions = self.regions.read();
        let (base, region) = regions.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        if end > base.saturating_add(region.len) {
            return None;
        }
        region.registrations.get(nic).cloned()
    }

    /// Server side of a handshake: a new QP on the device the request asks for (its index
    /// modulo our device count) connected to the initiator's endpoint, and the reply bytes.
    /// The caller keeps the QP until the control connection closes.
    ///
    /// Errors: `TRANSFER_FAIL` when the QP cannot be created or connected.
    pub(crate) fn accept(&self, request: &[u8; REQUEST_LEN]) -> Result<(QueuePair, Vec<u8>)> {
        let (theirs, wanted) = handshake::decode_request(request);
        let nic = wanted as usize % self.nics.len();
        let mut qp = QueuePair::new(&self.nics[nic].device, self.qp_settings)?;
        qp.connect(&theirs)?;
        bump(&self.metrics.rdma_served_connections);
        let reply = handshake::encode_reply(&qp.endpoint(), &self.remote_table(nic));
        Ok((qp, reply))
    }

    /// A new connection to `peer` from our device `nic` to the peer's device of the same
    /// index (modulo its count): TCP control connection, QP, handshake.
    fn connect(&self, peer: SocketAddr, nic: usize) -> std::result::Result<Connection, SliceError> {
        let unreachable = |message: String| SliceError {
            code: ErrorCode::TransferFail,
            message,
            unreachable: true,
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(unreachable(format!(
                "RDMA to {peer}: the transfer engine is shut down"
            )));
        }
        let mut control = TcpStream::connect_timeout(&peer, self.timeout)
            .map_err(|e| unreachable(format!("RDMA control connection to {peer}: {e}")))?;
        let _ = control.set_nodelay(true);
        control
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| control.set_write_timeout(Some(self.timeout)))
            .map_err(|e| unreachable(format!("RDMA control connection to {peer}: {e}")))?;
        if let Some(key) = &self.cluster_key {
            auth::client_blocking(&mut control, key, auth::ROLE_DATA).map_err(|_| SliceError {
                code: ErrorCode::AuthFailed,
                message: format!(
                    "RDMA control connection to {peer}: {}",
                    last_error_message()
                ),
                unreachable: false,
            })?;
        }
        let mut qp = QueuePair::new(&self.nics[nic].device, self.qp_settings)
            .map_err(|_| SliceError::from(last_error_message()))?;
        let wanted = u32::try_from(nic).unwrap_or(u32::MAX);
        let (theirs, regions) =
            handshake::exchange(&mut control, &qp.endpoint(), wanted).map_err(|e| SliceError {
                code: ErrorCode::TransferFail,
                message: format!("RDMA handshake with {peer}: {e}"),
                unreachable: !e.contains("refused"),
            })?;
        qp.connect(&theirs)
            .map_err(|_| SliceError::from(last_error_message()))?;
        bump(&self.metrics.rdma_connections);
        Ok(Connection {
            qp,
            control,
            regions,
            nic,
        })
    }

    /// An idle healthy connection to `peer` from device `nic` (`true`: reused), or a new one.
    fn take(
        &self,
        peer: SocketAddr,
        nic: usize,
    ) -> std::result::Result<(Connection, bool), SliceError> {
        loop {
            let reused = self.idle.lock().get_mut(&(peer, nic)).and_then(Vec::pop);
            match reused {
                Some(conn) if peer_closed(&conn.control) => continue,
                Some(conn) => return Ok((conn, true)),
                None => return self.connect(peer, nic).map(|conn| (conn, false)),
            }
        }
    }

    fn give_back(&self, peer: SocketAddr, conn: Connection) {
        if conn.qp.is_broken() {
            return;
        }
        let mut idle = self.idle.lock();
        // Checked under the lock, so nothing is pooled after `close` cleared the map.
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let list = idle.entry((peer, conn.nic)).or_default();
        if list.len() < MAX_IDLE_PER_PEER {
            list.push(conn);
        }
    }

    /// Drops every pooled connection (their peers' QPs go with the control connections);
    /// later slices fail `TRANSFER_FAIL` without connecting. Slices already running finish
    /// on their connections, which are then dropped.
    pub(crate) fn close(&self) {
        let mut idle = self.idle.lock();
        self.closed.store(true, Ordering::SeqCst);
        idle.clear();
    }

    /// Runs one slice to `peer` as RDMA READ/WRITE work requests on the next device in
    /// round-robin order; the bytes copied locally (through bounces) on success. Local memory
    /// inside a registration is used directly, device memory too (GPUDirect, counted in
    /// `rdma_gpudirect_bytes`; after a READ its device is told to flush the NIC's writes).
    /// Other memory goes through bounces; `staged`: it is device memory (copied with the
    /// device runtime through `staging`).
    ///
    /// Errors: `STALE_SEGMENT_EPOCH` when the slice names an epoch the peer's region does not
    /// have (after one refresh); `STALE_WRITE_TOKEN` when `send_by` passes (while connecting
    /// or mid-slice) before every work request was posted: none is posted after it, those
    /// posted before complete, and the connection stays usable; `TRANSFER_FAIL` when the
    /// range is not inside one remotely accessible region of the peer, the peer cannot be
    /// reached, the transport is closed, or a work request fails (remote access error for a
    /// stale rkey, retries exceeded for a dead peer, timeout): the QP is then dropped and the
    /// next call connects a new one.
    ///
    /// # Safety
    /// `slice.local` is valid for `slice.len` bytes for the operation until this returns.
    pub(crate) unsafe fn execute(
        &self,
        peer: SocketAddr,
        slice: &Slice,
        staged: bool,
        staging: &Staging,
        send_by: Option<Instant>,
    ) -> std::result::Result<u64, SliceError> {
        // Formatted only for an error: the success path allocates no message.
        let what = || {
            format!(
                "RDMA {:?} of {} bytes at {:#x} on {peer}",
                slice.op, slice.len, slice.remote
            )
        };
        let nic = self.next_nic.fetch_add(1, Ordering::Relaxed) % self.nics.len();
        let (mut conn, reused) = self.take(peer, nic)?;
        let len = slice.len as u64;
        let mut found = lookup(&conn.regions, slice.remote, len, slice.epoch);
        if reused && !matches!(found, Lookup::Found(_)) {
            // The table may predate a (re)mount: ask again on a new connection.
            drop(conn);
            conn = self.connect(peer, nic)?;
            found = lookup(&conn.regions, slice.remote, len, slice.epoch);
        }
        let region = match found {
            Lookup::Found(region) => region,
            Lookup::Missing => {
                self.give_back(peer, conn);
                return Err(SliceError::from(format!(
                    "{}: not inside one remotely accessible registered range of the peer",
                    what()
                )));
            }
            Lookup::Stale(current) => {
                self.give_back(peer, conn);
                bump(&self.metrics.stale_epoch_rejections);
                return Err(SliceError {
                    code: ErrorCode::StaleSegmentEpoch,
                    message: format!(
                        "{}: segment epoch {:#x} is not the current one ({current:#x})",
                        what(),
                        slice.epoch
                    ),
                    unreachable: false,
                });
            }
        };
        let registered = self.local_registration(slice.local as usize, slice.len, nic);
        let deadline = Instant::now() + self.timeout;
        let limits = Limits { deadline, send_by };
        let result = match registered {
            // SAFETY: forwarded from the caller; the registration is held across the run.
            Some(registration) => unsafe {
                self.run_direct(&mut conn, slice, &region, &registration, limits, staged)
            },
            // SAFETY: forwarded from the caller.
            None => unsafe { self.run_bounced(&mut conn, slice, &region, staged, staging, limits) },
        };
        self.give_back(peer, conn);
        result.map_err(|error| match error {
            RunError::Late => {
                bump(&self.metrics.late_sends_refused);
                SliceError {
                    code: ErrorCode::StaleWriteToken,
                    message: format!(
                        "{}: stopped before all of it was posted: its writer's grant ended",
                        what()
                    ),
                    unreachable: false,
                }
            }
            RunError::Failed(problem) => SliceError::from(format!("{}: {problem}", what())),
        })
    }

    /// Work requests of at most `slice_size` bytes covering `len` bytes from `local` (key
    /// `lkey`) against `remote` in `region`.
    fn requests(
        &self,
        read: bool,
        local: u64,
        lkey: u32,
        len: usize,
        remote: u64,
        region: &RemoteRegion,
    ) -> Vec<WorkRequest> {
        (0..len)
            .step_by(self.slice_size)
            .map(|at| WorkRequest {
                read,
                local: local + at as u64,
                lkey,
                len: self.slice_size.min(len - at) as u32,
                remote: remote + at as u64,
                rkey: region.rkey,
            })
            .collect()
    }

    /// Zero-copy: the work requests name the caller's registered memory; counted.
    /// `on_device`: it is device memory registered by GPUDirect. Then, before a WRITE, the
    /// call waits for device work ordered before it that may still write the source (as the
    /// staged path's synchronous driver copy did); after a READ it flushes the NIC's writes
    /// before later device work, and only then counts the slice (a failed flush fails it).
    ///
    /// # Safety
    /// As [`Self::execute`]; `registration` (on `conn`'s device) covers the local range.
    unsafe fn run_direct(
        &self,
        conn: &mut Connection,
        slice: &Slice,
        region: &RemoteRegion,
        registration: &Registration,
        limits: Limits,
        on_device: bool,
    ) -> std::result::Result<u64, RunError> {
        let runtime = crate::device::runtime();
        let read = slice.op == Opcode::Read;
        if on_device && !read {
            runtime
                .wait_for_writers(slice.local as usize)
                .map_err(|e| format!("GPUDirect write: waiting for device work failed: {e}"))?;
        }
        let requests = self.requests(
            read,
            slice.local as u64,
            registration.lkey(),
            slice.len,
            slice.remote,
            region,
        );
        // SAFETY: forwarded; registered memory valid until this returns.
        unsafe { conn.run(&requests, limits.deadline, limits.send_by) }?;
        if on_device && read {
            let device = runtime.classify(slice.local as usize).device().unwrap_or(0);
            runtime
                .flush_nic_writes(device)
                .map_err(|e| format!("GPUDirect read landed, but the flush failed: {e}"))?;
        }
        self.count(conn.nic, read, slice.len);
        if on_device {
            self.metrics
                .rdma_gpudirect_bytes
                .fetch_add(slice.len as u64, Ordering::Relaxed);
        }
        Ok(0)
    }

    /// Through registered bounces of `conn`'s device, [`BOUNCE_LEN`] bytes at a time; the
    /// bytes copied.
    ///
    /// # Safety
    /// As [`Self::execute`].
    unsafe fn run_bounced(
        &self,
        conn: &mut Connection,
        slice: &Slice,
        region: &RemoteRegion,
        staged: bool,
        staging: &Staging,
        limits: Limits,
    ) -> std::result::Result<u64, RunError> {
        let read = slice.op == Opcode::Read;
        let bounce = self.nics[conn.nic].bounces.take()?;
        let copy = |dst: *mut u8, src: *const u8, len: usize| -> std::result::Result<(), String> {
            // SAFETY: both ranges are valid (caller memory and our bounce), disjoint.
            unsafe {
                if staged {
                    staging.copy(dst, src, len)
                } else {
                    copy_bytes(dst, src, len).map(|_| ())
                }
            }?;
            add(
                &self.metrics.rdma_bounce_copies,
                &self.metrics.rdma_bounce_bytes,
                len as u64,
            );
            Ok(())
        };
        let mut done = 0;
        while done < slice.len {
            let len = BOUNCE_LEN.min(slice.len - done);
            let local = slice.local.wrapping_add(done);
            if !read {
                copy(bounce.ptr(), local, len)?;
            }
            let requests = self.requests(
                read,
                bounce.ptr() as u64,
                bounce.lkey(),
                len,
                slice.remote + done as u64,
                region,
            );
            // SAFETY: the bounce is registered and ours until it is dropped.
            unsafe { conn.run(&requests, limits.deadline, limits.send_by) }?;
            if read {
                copy(local, bounce.ptr(), len)?;
            }
            done += len;
        }
        self.count(conn.nic, read, slice.len);
        Ok(slice.len as u64)
    }

    /// Counts `len` bytes moved through device `nic`.
    fn count(&self, nic: usize, read: bool, len: usize) {
        let m = &self.metrics;
        let nic = &self.nics[nic];
        match read {
            true => {
                add(&m.rdma_read_slices, &m.rdma_read_bytes, len as u64);
                nic.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
            }
            false => {
                add(&m.rdma_write_slices, &m.rdma_write_bytes, len as u64);
                nic.write_bytes.fetch_add(len as u64, Ordering::Relaxed);
            }
        }
    }
}

/// When a slice's run must end, and after when nothing more may be posted.
#[derive(Clone, Copy)]
struct Limits {
    deadline: Instant,
    send_by: Option<Instant>,
}
