//! This client's SSD tier (`docs/ssd-tier.md`), owner side and reader side.
//!
//! Owner: [`OwnDiskTier`] opens the directory ([`DiskStore`]: one self-describing record per
//! object, `flock`ed against a second process), serves reads of its records to other clients
//! ([`DiskReadInterface`], an RPC service on an OS-chosen port of the data host), and runs
//! one worker thread that mounts the tier at the master (reporting what it holds; the master
//! says what to keep), then long-polls the master for work whenever fewer than
//! [`DEMOTION_PARALLELISM`] tasks wait, and queues it for a pool of as many threads
//! ([`WorkQueue`]: deletions ahead of demotions; the pool keeps running while the worker
//! polls): a demotion copies a complete memory replica out of this client's own segment into
//! a record and reports it (the master then releases the memory; completions are reported in
//! groups as they come), a deletion drops a removed or superseded record. A record found
//! corrupt or missing is reported lost, so the master forgets that replica.
//!
//! Reader: [`DiskReaders`] reads the record a LOCAL_DISK descriptor names, straight from the
//! store when this client owns it, else from its owner's service; the bytes are exactly the
//! record's verified payload, or an error — never empty bytes with success.
//!
//! Ownership and threads: the client core owns both; the worker holds the source of
//! demotions weakly and stops when it is gone or at [`OwnDiskTier::shutdown`]. All methods
//! take `&self` and are thread-safe.

use super::work_queue::WorkQueue;
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterApi;
use crate::rpc::{RpcClient, RpcServer, Timeouts};
use crate::storage::{AlignedBuf, DiskStore, DiskStoreOptions};
use crate::types::{
    BufferDescriptor, ClientId, DiskMount, DiskMountPage, DiskObject, DiskRecordRef, DiskReport,
    DiskTask, Uuid,
};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// The disk read service's wire items (the macro declares them `pub`; they stay crate-private
/// here).
#[allow(unreachable_pub)]
mod wire {
    use crate::error::Result;
    use crate::rpc::interface::rpc_interface;

    rpc_interface! {
        /// The disk read service interface ([`crate::rpc::Interface`] marker).
        interface DiskReadInterface = "mc-disk-read";
        /// What the owner of an SSD tier serves to readers holding a LOCAL_DISK descriptor.
        trait DiskReadApi;
        request DiskReadRequest;
        response DiskReadResponse;
        /// A [`DiskReadApi`] that forwards every call through a [`crate::rpc::Call`] transport.
        remote RemoteDiskRead;
        /// Bytes `[offset, offset + len)` of the verified record of `key` at `generation`
        /// (`len` ≤ [`MAX_READ_CHUNK`]). Errors: `OBJECT_NOT_FOUND` (no such record: removed or
        /// superseded), `CHECKSUM_MISMATCH` / `FILE_NOT_FOUND` (the record was lost; the owner
        /// tells the master), `FILE_READ_FAIL`, `INVALID_PARAMS` (range past the value).
        fn read_disk_record(key: String, generation: u64, offset: u64, len: u64) -> Result<Vec<u8>>;
    }
}
use wire::{DiskReadApi, DiskReadInterface, RemoteDiskRead};

/// Largest range one `read_disk_record` call returns (well below the RPC frame limit).
pub(crate) const MAX_READ_CHUNK: u64 = 32 << 20;
/// Records reported per call when a tier mounts.
const MOUNT_PAGE: usize = 8192;
/// Threads of the disk read service.
const READ_THREADS: usize = 4;
/// Demotions (or deletions) run at once: the disk's queue depth for them (and the most tasks
/// waiting to start before the worker asks the master for more).
const DEMOTION_PARALLELISM: usize = 16;
thread_local! {
    /// Set on the tier worker's thread and its demotion threads.
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Pause after a failed master call before the worker tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// File in the tier's directory naming it across restarts (see [`DiskMount::disk`]).
const TIER_ID_FILE: &str = "TIER_ID";

/// Where a demotion copies from: this client's own segment. Implemented by the client core.
pub(crate) trait DemotionSource: Send + Sync {
    /// Copies the complete replica `replica` (in this client's current segment mount) into
    /// `into` (`replica.size` bytes). Errors: `STALE_SEGMENT_EPOCH` when the replica is not
    /// in the current mount; `INVALID_PARAMS` when it is not in our segment.
    fn copy_replica(&self, replica: &BufferDescriptor, into: &mut [u8]) -> Result<()>;

    /// Copies `from` (`replica.size` bytes) into the replica `replica` of this client's
    /// current segment mount (a promotion's new range, which no one reads yet). Errors as
    /// [`DemotionSource::copy_replica`].
    fn fill_replica(&self, replica: &BufferDescriptor, from: &[u8]) -> Result<()>;
}

/// The SSD tier's settings. Plain value.
#[derive(Clone, Debug)]
pub(crate) struct DiskTierSettings {
    /// The directory.
    pub dir: String,
    /// Record bytes the tier may hold (0: the filesystem's free space).
    pub capacity: u64,
}

impl DiskTierSettings {
    /// `dir` with the capacity of `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`.
    pub(crate) fn from_env(dir: &str) -> DiskTierSettings {
        DiskTierSettings {
            dir: dir.to_string(),
            capacity: crate::env::OFFLOAD_TOTAL_SIZE_LIMIT_BYTES.get(),
        }
    }
}

/// This client's tier: the store and its read service, and the reports waiting for the worker.
struct TierCore {
    store: DiskStore,
    disk: Uuid,
    /// Lost records not yet reported to the master.
    lost: Mutex<Vec<DiskReport>>,
}

impl TierCore {
    /// The verified record of `key` at `generation`; a record found corrupt, missing (the
    /// master named it, so it should be here) or unreadable (an I/O error) is queued as lost
    /// for the master, which forgets that exact generation only.
    fn read(&self, key: &str, generation: u64) -> Result<crate::storage::ReadRecord> {
        let read = self.store.read(key, generation);
        if let Err(
            ErrorCode::ChecksumMismatch
            | ErrorCode::FileNotFound
            | ErrorCode::ObjectNotFound
            | ErrorCode::FileReadFail,
        ) = read
        {
            self.lost.lock().push(DiskReport::Lost {
                key: key.to_string(),
                generation,
            });
        }
        read
    }
}

/// The read service's view of the tier: weak, so a closed tier releases its directory (and
/// lock) at once, whatever the service's threads still hold.
struct ServedTier(Weak<TierCore>);

impl DiskReadApi for ServedTier {
    fn read_disk_record(
        &self,
        key: String,
        generation: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        if len > MAX_READ_CHUNK {
            return fail(
                ErrorCode::InvalidParams,
                format!("read of {len} bytes is too large"),
            );
        }
        let Some(tier) = self.0.upgrade() else {
            return fail(ErrorCode::ObjectNotFound, "the SSD tier is closed");
        };
        let record = tier.read(&key, generation)?;
        let bytes = record.bytes();
        match offset.checked_add(len) {
            Some(end) if end <= bytes.len() as u64 => {
                Ok(bytes[offset as usize..end as usize].to_vec())
            }
            _ => fail(
                ErrorCode::InvalidParams,
                format!(
                    "range [{offset}, +{len}) past the {}-byte value of {key}",
                    bytes.len()
                ),
            ),
        }
    }
}

/// The owner side of this client's SSD tier. Dropping it stops the worker and the service.
pub(crate) struct OwnDiskTier {
    core: Arc<TierCore>,
    server: RpcServer,
    endpoint: String,
    stop: Arc<AtomicBool>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The master and client id the worker mounted the tier for (unmounted at shutdown).
    mounted: Mutex<Option<(Arc<dyn MasterApi>, ClientId)>>,
}

impl OwnDiskTier {
    /// Opens the tier in `settings.dir` and starts its read service on `host` (an OS-chosen
    /// port). Errors: the store's (`FILE_LOCK_FAIL` naming the other process when the
    /// directory is in use); `RPC_FAIL` when the service cannot bind.
    pub(crate) fn open(settings: &DiskTierSettings, host: &str) -> Result<OwnDiskTier> {
        let store = DiskStore::open(DiskStoreOptions {
            dir: settings.dir.clone().into(),
            capacity: settings.capacity,
        })?;
        let disk = tier_id(Path::new(&settings.dir))?;
        let core = Arc::new(TierCore {
            store,
            disk,
            lost: Mutex::new(Vec::new()),
        });
        let bind: SocketAddr = match format!("{host}:0").parse() {
            Ok(addr) => addr,
            Err(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let api: Arc<dyn DiskReadApi> = Arc::new(ServedTier(Arc::downgrade(&core)));
        let server = RpcServer::serve::<DiskReadInterface>(bind, api, READ_THREADS)?;
        let endpoint = format!("{host}:{}", server.local_addr().port());
        tracing::info!(dir = %settings.dir, %endpoint, records = core.store.stats().objects, "SSD tier opened");
        Ok(OwnDiskTier {
            core,
            server,
            endpoint,
            stop: Arc::new(AtomicBool::new(false)),
            worker: Mutex::new(None),
            mounted: Mutex::new(None),
        })
    }

    /// Starts the worker: mounts the tier at `master` as `client` and serves its work.
    pub(crate) fn start(
        &self,
        master: Arc<dyn MasterApi>,
        client: ClientId,
        source: Weak<dyn DemotionSource>,
    ) -> Result<()> {
        let master_for_unmount = Arc::clone(&master);
        let worker = Worker {
            core: Arc::clone(&self.core),
            master,
            client,
            endpoint: self.endpoint.clone(),
            source,
            stop: Arc::clone(&self.stop),
        };
        let handle = std::thread::Builder::new()
            .name("mc-disk-tier".into())
            .spawn(move || worker.run())
            .or_else(|e| {
                fail(
                    ErrorCode::InternalError,
                    format!("cannot start the SSD tier worker: {e}"),
                )
            })?;
        *self.worker.lock() = Some(handle);
        *self.mounted.lock() = Some((master_for_unmount, client));
        Ok(())
    }

    /// Stops the worker and the read service, and unmounts the tier at the master (its
    /// objects wait there, unreadable, for a restart on the directory). Idempotent. Called
    /// from the worker itself (the client's last reference dropped by a demotion), it does
    /// not wait for the worker, which stops after its round.
    pub(crate) fn shutdown(&self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        let handle = self.worker.lock().take();
        if let Some(handle) = handle.filter(|_| !IN_WORKER.with(Cell::get)) {
            let _ = handle.join();
        }
        if let Some((master, client)) = self.mounted.lock().take() {
            if let Err(e) = master.unmount_disk(client) {
                tracing::warn!(error = %e, "could not unmount the SSD tier at the master");
            }
        }
        self.server.shutdown();
    }

    /// The store's counters.
    pub(crate) fn stats(&self) -> crate::storage::DiskStats {
        self.core.store.stats()
    }
}

impl Drop for OwnDiskTier {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The identity of the tier in `dir`: read from [`TIER_ID_FILE`], or created there (the
/// directory is locked by the open store). Errors: `FILE_WRITE_FAIL`.
fn tier_id(dir: &Path) -> Result<Uuid> {
    let path = dir.join(TIER_ID_FILE);
    let parse = |text: &str| {
        let (hi, lo) = text.trim().split_once('-')?;
        let id = Uuid {
            hi: u64::from_str_radix(hi, 16).ok()?,
            lo: u64::from_str_radix(lo, 16).ok()?,
        };
        (id != Uuid::default()).then_some(id)
    };
    if let Some(id) = std::fs::read_to_string(&path)
        .ok()
        .as_deref()
        .and_then(parse)
    {
        return Ok(id);
    }
    let id = Uuid::random();
    write_durably(&path, &format!("{id}\n"))?;
    Ok(id)
}

/// Writes `text` to `path` and syncs it. Errors: `FILE_WRITE_FAIL`.
fn write_durably(path: &Path, text: &str) -> Result<()> {
    let written = std::fs::write(path, text).and_then(|()| std::fs::File::open(path)?.sync_all());
    written.or_else(|e| {
        fail(
            ErrorCode::FileWriteFail,
            format!("cannot write {}: {e}", path.display()),
        )
    })
}

/// The worker thread's state.
struct Worker {
    core: Arc<TierCore>,
    master: Arc<dyn MasterApi>,
    client: ClientId,
    endpoint: String,
    source: Weak<dyn DemotionSource>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    fn run(self) {
        IN_WORKER.with(|flag| flag.set(true));
        let queue = WorkQueue::new();
        std::thread::scope(|scope| {
            for n in 0..DEMOTION_PARALLELISM {
                let spawned = std::thread::Builder::new()
                    .name(format!("mc-disk-io-{n}"))
                    .spawn_scoped(scope, || {
                        IN_WORKER.with(|flag| flag.set(true));
                        let run = |staging: &mut Option<AlignedBuf>, task: &DiskTask| {
                            self.run_task(staging, task)
                        };
                        queue.serve(run, |done| self.report_demoted(done));
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, threads = n, "SSD tier: fewer disk threads");
                    break;
                }
            }
            self.poll(&queue);
            queue.close();
        });
    }

    /// Mounts the tier and queues the master's tasks, until the tier stops or the client
    /// is gone.
    fn poll(&self, queue: &WorkQueue<DiskTask, bool>) {
        let (mut mounted, mut attempt) = (false, 0);
        while !self.stop.load(Ordering::Acquire) && self.source.strong_count() > 0 {
            if !mounted {
                attempt += 1;
                match self.mount(attempt) {
                    Ok(()) => mounted = true,
                    Err(_) => {
                        std::thread::sleep(RETRY_PAUSE);
                        continue;
                    }
                }
            }
            self.report_lost();
            if !queue.wait_for_room(DEMOTION_PARALLELISM, RETRY_PAUSE) {
                continue;
            }
            match self.master.disk_tasks(self.client) {
                Ok(tasks) => {
                    let (deletions, demotions) = tasks
                        .into_iter()
                        .partition(|task| matches!(task, DiskTask::Delete { .. }));
                    queue.push(deletions, demotions);
                }
                Err(ErrorCode::ClientNotFound) => mounted = false,
                Err(_) => std::thread::sleep(RETRY_PAUSE),
            }
        }
    }

    /// Mounts the tier: reports what it holds, [`MOUNT_PAGE`] records per call, and deletes
    /// what the master refuses.
    fn mount(&self, attempt: u64) -> Result<()> {
        let held: Vec<DiskObject> = self
            .core
            .store
            .objects()
            .into_iter()
            .map(|o| DiskObject {
                key: o.key,
                generation: o.generation,
                size: o.len,
            })
            .collect();
        let stats = self.core.store.stats();
        let mount = DiskMount {
            disk: self.core.disk,
            endpoint: self.endpoint.clone(),
            capacity: self.core.store.room()?,
            used: stats.used_bytes,
        };
        let pages: Vec<&[DiskObject]> = match held.is_empty() {
            true => vec![&[]],
            false => held.chunks(MOUNT_PAGE).collect(),
        };
        let (mut dropped, mut number) = (0, 0);
        for (i, page) in pages.iter().enumerate() {
            let request = DiskMountPage {
                first: i == 0,
                mount: number,
                attempt,
                last: i + 1 == pages.len(),
                held: page.to_vec(),
            };
            let answer = self
                .master
                .mount_disk(self.client, mount.clone(), request)?;
            number = answer.mount;
            let refused = page.iter().zip(&answer.kept).filter(|(_, kept)| !**kept);
            for (object, _) in refused {
                let removed = self.core.store.remove(&object.key, object.generation);
                dropped += removed.unwrap_or(false) as usize;
            }
        }
        tracing::info!(held = held.len(), dropped, "SSD tier mounted at the master");
        Ok(())
    }

    /// Sends the lost-record reports queued by reads (kept for the next try on failure).
    fn report_lost(&self) {
        let lost = std::mem::take(&mut *self.core.lost.lock());
        if lost.is_empty() {
            return;
        }
        if self.master.disk_report(self.client, lost.clone()).is_err() {
            self.core.lost.lock().extend(lost);
        }
    }

    /// Runs one task on a disk thread (with its staging buffer): a deletion drops the
    /// record; a demotion writes it; a promotion loads it into its new memory range. Returns
    /// whether the record was written (demotion) or loaded (promotion).
    fn run_task(&self, staging: &mut Option<AlignedBuf>, task: &DiskTask) -> bool {
        match task {
            DiskTask::Delete { key, generation } => {
                let _ = self.core.store.remove(key, *generation);
                false
            }
            DiskTask::Demote {
                key,
                generation,
                replica,
                ..
            } => self.demote(staging, key, *generation, replica).is_ok(),
            DiskTask::Promote {
                key,
                generation,
                replica,
                ..
            } => self.promote(key, *generation, replica).is_ok(),
        }
    }

    /// Reports the demotions and promotions among `done` (task, whether it was done) in one
    /// call; a demotion's record the master did not accept is removed again.
    fn report_demoted(&self, done: Vec<(DiskTask, bool)>) {
        // (the report, whether a refusal removes its record: a demotion's that was written)
        let reported: Vec<(DiskReport, bool)> = done
            .into_iter()
            .filter_map(|(task, written)| {
                let (task, key, generation, demotion) = match task {
                    DiskTask::Demote {
                        task,
                        key,
                        generation,
                        ..
                    } => (task, key, generation, true),
                    DiskTask::Promote {
                        task,
                        key,
                        generation,
                        ..
                    } => (task, key, generation, false),
                    DiskTask::Delete { .. } => return None,
                };
                let report = DiskReport::Demoted {
                    task,
                    key,
                    generation,
                    written,
                };
                Some((report, demotion && written))
            })
            .collect();
        if reported.is_empty() {
            return;
        }
        let reports = reported.iter().map(|(report, _)| report.clone()).collect();
        // Without an answer the record stays: the next mount's reconciliation keeps it if
        // the master accepted it, and drops it otherwise.
        let Ok(accepted) = self.master.disk_report(self.client, reports) else {
            return;
        };
        for (k, (report, removable)) in reported.iter().enumerate() {
            if let (
                DiskReport::Demoted {
                    key, generation, ..
                },
                true,
            ) = (report, removable)
            {
                if accepted.get(k) != Some(&true) {
                    let _ = self.core.store.remove(key, *generation);
                }
            }
        }
    }

    /// Loads the verified record of `key` at `generation` into `replica`, a new range of our
    /// segment. Errors: the record's (see [`TierCore::read`]: a lost record is reported);
    /// the source's.
    fn promote(&self, key: &str, generation: u64, replica: &BufferDescriptor) -> Result<()> {
        let Some(source) = self.source.upgrade() else {
            return fail(ErrorCode::InvalidParams, "the client is gone");
        };
        let record = self.core.read(key, generation)?;
        source.fill_replica(replica, record.bytes())
    }

    /// Copies `replica` of `key` out of our segment into `staging` (replaced by a larger
    /// buffer when it is too small) and writes its record durably.
    fn demote(
        &self,
        staging: &mut Option<AlignedBuf>,
        key: &str,
        generation: u64,
        replica: &BufferDescriptor,
    ) -> Result<()> {
        let Some(source) = self.source.upgrade() else {
            return fail(ErrorCode::InvalidParams, "the client is gone");
        };
        let len = usize::try_from(replica.size)
            .or_else(|_| fail(ErrorCode::InvalidParams, "replica too large"))?;
        if staging.as_ref().is_none_or(|buf| buf.capacity() < len) {
            *staging = Some(AlignedBuf::new(len)?);
        }
        let staging = staging.as_mut().expect("set above");
        source.copy_replica(replica, &mut staging.as_mut_slice()[..len])?;
        staging.zero_tail(len);
        self.core
            .store
            .write(key, generation, staging, replica.size)
    }
}

/// Reads LOCAL_DISK replicas for this client: from its own tier, or its owner's service.
pub(crate) struct DiskReaders {
    own: Option<(ClientId, Arc<TierCore>)>,
    peers: Mutex<HashMap<String, Arc<RemoteDiskRead<RpcClient<DiskReadInterface>>>>>,
    timeouts: Timeouts,
}

impl DiskReaders {
    /// Readers for client `me`, whose own tier (if any) is `own`.
    pub(crate) fn new(me: ClientId, own: Option<&OwnDiskTier>) -> DiskReaders {
        DiskReaders {
            own: own.map(|tier| (me, Arc::clone(&tier.core))),
            peers: Mutex::new(HashMap::new()),
            timeouts: Timeouts::from_env(),
        }
    }

    /// Reads object bytes `[offset, end)` of the record `record` names, served at `endpoint`,
    /// handing them to `deliver` in order as (object offset, bytes) pieces that cover the
    /// range exactly. Errors: see [`DiskReadApi::read_disk_record`] (`INVALID_PARAMS` for a
    /// range past the value); `RPC_FAIL` / `RPC_TIMEOUT` reaching the owner; `TRANSFER_FAIL`
    /// for a short answer; `deliver`'s own.
    pub(crate) fn read(
        &self,
        record: &DiskRecordRef,
        endpoint: &str,
        (offset, end): (u64, u64),
        deliver: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        if let Some((me, core)) = &self.own {
            if *me == record.owner {
                let read = core.read(&record.key, record.generation)?;
                let bytes = read.bytes();
                if offset > end || end > bytes.len() as u64 {
                    return fail(ErrorCode::InvalidParams, "range past the value");
                }
                return deliver(offset, &bytes[offset as usize..end as usize]);
            }
        }
        let peer = self.peer(endpoint);
        let mut at = offset;
        while at < end {
            let chunk = (end - at).min(MAX_READ_CHUNK);
            let bytes = peer.read_disk_record(record.key.clone(), record.generation, at, chunk)?;
            if bytes.len() as u64 != chunk {
                return fail(ErrorCode::TransferFail, "short disk read from the owner");
            }
            deliver(at, &bytes)?;
            at += chunk;
        }
        Ok(())
    }

    fn peer(&self, endpoint: &str) -> Arc<RemoteDiskRead<RpcClient<DiskReadInterface>>> {
        let mut peers = self.peers.lock();
        let peer = peers
            .entry(endpoint.to_string())
            .or_insert_with(|| Arc::new(RemoteDiskRead(RpcClient::new(endpoint, self.timeouts))));
        Arc::clone(peer)
    }
}
