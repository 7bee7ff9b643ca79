//! The owner side ([`DataManager`]): the TieredBackend, the PendingWriteRecord and
//! PinnedKeyRecord tables, and the stage operations the client RPC service runs.
//!
//! Three stages, and locks only in the first and last: *prepare* (PreWrite / PinKey: lock
//! the key's record shard, clean an expired record, check, reserve or pin, unlock),
//! *transfer* (no lock: the accessor's engine for FORWARD, ours for REVERSE), *complete*
//! (WriteCommit / WriteRevoke / UnPinKey: lock, clean an expired record, check the operation
//! id and lease, commit or drop, unlock). Registration of committed keys with the master is
//! an RPC and runs after the lock is released.
//!
//! Quarantine before reuse (issue 11): the space of a PreWrite that expired or was revoked
//! is held for `MC_P2P_QUARANTINE_MS` (default twice the transfer timeout) past the earlier of its
//! lease deadline and its end, since the accessor's write may still land in it; a committed
//! value removed while readers hold its pin is held until that pin's deadline (the last
//! reader's lease). Pins are bounded: a removed key is hidden at once (PinKey answers
//! `OBJECT_NOT_FOUND`), so no renewal extends a value's life past its removal.
//!
//! Lock order: pin or pending record shard → committed-table shard → quarantine → allocator
//! (leaves). Dropping a record releases its handle, which takes only the allocator's leaf
//! lock.

use super::api::{ReadGrant, RemoteBufferDesc, RemoteRead, RemoteWrite, WriteGrant};
use super::counters::{bump, Counters, P2pCounters};
use super::quarantine::Quarantine;
use super::records::{Leased, RecordTable};
use super::registration::Registration;
use super::tiered::{AllocationHandle, TieredBackend};
use crate::error::{fail, ErrorCode, Result};
use crate::master::MasterApi;
use crate::spin::deadline;
use crate::transfer::{copy, TransferEngine, TransferOp, TransferRequest};
use crate::types::ClientId;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a commit asks again while the master is in its route grace.
const GRACE_RETRY: Duration = Duration::from_millis(50);

/// Test hook: milliseconds the owner sleeps at the start of a REVERSE transfer stage (after
/// the prepare stage released its locks), to show that stages of one key overlap.
pub const DEBUG_TRANSFER_DELAY_ENV: &str = crate::env::P2P_DEBUG_TRANSFER_DELAY_MS.name;

/// One reserved, not yet visible write of a key.
struct PendingWrite {
    op: u64,
    deadline: Instant,
    handle: AllocationHandle,
}

/// The pin of a key's committed value, shared by its concurrent readers; `deadline` is the
/// latest reader's lease. It lives only while the value is committed: removing the key moves
/// its value into the quarantine until `deadline`.
struct PinRecord {
    op: u64,
    deadline: Instant,
    handle: AllocationHandle,
    /// Readers granted and not released by UnPinKey.
    holders: u64,
}

macro_rules! leased {
    ($($record:ty),*) => {$(
        impl Leased for $record {
            fn deadline(&self) -> Instant {
                self.deadline
            }
            fn set_deadline(&mut self, deadline: Instant) {
                self.deadline = deadline;
            }
        }
    )*};
}
leased!(PendingWrite, PinRecord);

/// How a DataManager is built.
pub(crate) struct OwnerParts {
    pub(crate) backend: TieredBackend,
    pub(crate) engine: Arc<TransferEngine>,
    pub(crate) master: Arc<dyn MasterApi>,
    pub(crate) id: ClientId,
    pub(crate) lease: Duration,
    pub(crate) shards: usize,
    pub(crate) counters: Arc<Counters>,
    /// How long space a stale transfer may still write is held before reuse.
    pub(crate) quarantine: Duration,
}

/// The owner's data and records. Thread-safe; shared by `Arc` between the RPC service, the
/// scan thread and the local client.
pub(crate) struct DataManager {
    backend: TieredBackend,
    pending: RecordTable<PendingWrite>,
    pins: RecordTable<PinRecord>,
    engine: Arc<TransferEngine>,
    master: Arc<dyn MasterApi>,
    id: ClientId,
    lease: Duration,
    next_op: AtomicU64,
    counters: Arc<Counters>,
    stage_delay: Duration,
    quarantine: Duration,
    held: Quarantine<AllocationHandle>,
    /// Whether the master still routes our keys to us; reads are refused while it may not.
    registration: Registration,
    /// Keys whose route is being published (commit) or withdrawn (remove) at the master:
    /// no PreWrite of them until that answer is in, so a late withdrawal can never strip
    /// a newer value of its route.
    routing: Mutex<HashSet<String>>,
    /// Commits and removals hold it shared from their first master call to their local
    /// change; a reclaim ([`DataManager::reclaim`]) holds it exclusively from its snapshot of
    /// our keys to its drops. So a commit whose route the master took just before expiring
    /// us is in the snapshot (its claim is reclaimed), never made visible after a reclaim
    /// that left it out (the master would route it nowhere while we serve it).
    publishing: parking_lot::RwLock<()>,
    /// Test hook: a commit sleeps this long between the master's answer and the local commit.
    commit_delay: Duration,
}

/// Holds a key in [`DataManager::routing`] until dropped.
struct RoutingGuard<'a> {
    keys: &'a Mutex<HashSet<String>>,
    key: String,
}

impl Drop for RoutingGuard<'_> {
    fn drop(&mut self) {
        self.keys.lock().remove(&self.key);
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return fail(ErrorCode::InvalidParams, "empty key");
    }
    Ok(())
}

impl DataManager {
    pub(crate) fn new(parts: OwnerParts) -> DataManager {
        let delay_ms = crate::env::P2P_DEBUG_TRANSFER_DELAY_MS.get();
        DataManager {
            backend: parts.backend,
            pending: RecordTable::new(parts.shards),
            pins: RecordTable::new(parts.shards),
            engine: parts.engine,
            master: parts.master,
            id: parts.id,
            lease: parts.lease,
            next_op: AtomicU64::new(fastrand::u64(1..1 << 32)),
            counters: parts.counters,
            stage_delay: Duration::from_millis(delay_ms),
            quarantine: parts.quarantine,
            held: Quarantine::default(),
            registration: Registration::new(),
            routing: Mutex::new(HashSet::new()),
            publishing: parking_lot::RwLock::new(()),
            commit_delay: Duration::ZERO,
        }
    }

    /// Test hook: see [`DataManager::commit_delay`](Self).
    #[cfg(test)]
    pub(crate) fn with_commit_delay(mut self, delay: Duration) -> DataManager {
        self.commit_delay = delay;
        self
    }

    /// Test hook: the REVERSE transfer stage sleeps `delay` first (as
    /// [`DEBUG_TRANSFER_DELAY_ENV`], without touching the process environment).
    #[cfg(test)]
    pub(crate) fn with_stage_delay(mut self, delay: Duration) -> DataManager {
        self.stage_delay = delay;
        self
    }

    fn descriptor(&self, handle: &AllocationHandle) -> RemoteBufferDesc {
        RemoteBufferDesc {
            endpoint: self.engine.local_name().to_string(),
            addr: handle.addr() as u64,
            len: handle.len(),
        }
    }

    fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// Ends a pending write that was not committed (expired, revoked, failed): its space is
    /// held until the quarantine after the earlier of its lease deadline and `now` has
    /// passed, since the accessor's write may still be landing in it.
    fn retire_write(&self, record: PendingWrite, now: Instant) {
        self.held.hold(
            record.handle,
            deadline(record.deadline.min(now), self.quarantine),
        );
    }

    /// Ends the pin of a removed or replaced value: the value is held until the last
    /// reader's lease (`deadline`) has passed. A reader finishing later discards its bytes
    /// (`LEASE_EXPIRED` on the accessor), and reads never write, so no further quarantine.
    fn retire_pin(&self, record: PinRecord) {
        self.held.hold(record.handle, record.deadline);
    }

    /// Prepare stage of a write: one PendingWriteRecord per key. Returns the grant and a
    /// handle the caller may hold during its own transfer.
    fn reserve(&self, key: &str, size: u64) -> Result<(WriteGrant, AllocationHandle)> {
        check_key(key)?;
        let now = Instant::now();
        let mut shard = self.pending.shard(key);
        if let Some(expired) = shard.take_expired(key, now) {
            bump(&self.counters.pending_reclaimed_in_stage);
            self.retire_write(expired, now);
        }
        if shard.get_mut(key).is_some() || self.routing.lock().contains(key) {
            return fail(
                ErrorCode::ObjectReplicaBusy,
                format!("another PreWrite or a removal of key {key} is in progress; retry later"),
            );
        }
        if self.backend.contains(key) {
            return fail(
                ErrorCode::ObjectAlreadyExists,
                format!("key {key} already exists"),
            );
        }
        self.held.release_due(now);
        let handle = self.backend.allocate(size)?;
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        shard.insert(
            key,
            PendingWrite {
                op,
                deadline: deadline(now, self.lease),
                handle: Arc::clone(&handle),
            },
        );
        drop(shard);
        bump(&self.counters.pending_created);
        let grant = WriteGrant {
            buffer: self.descriptor(&handle),
            write_operation_id: op,
            lease_ms: self.lease_ms(),
        };
        Ok((grant, handle))
    }

    /// Complete stage shared by commit and revoke: removes `key`'s pending record after
    /// checking that it is live and belongs to `op`.
    ///
    /// Errors: `LEASE_EXPIRED` when the record expired or is gone; `STALE_WRITE_TOKEN` when
    /// `op` no longer names the key's current PreWrite (nothing changes).
    fn take_pending(&self, key: &str, op: u64) -> Result<PendingWrite> {
        let now = Instant::now();
        let mut shard = self.pending.shard(key);
        if let Some(expired) = shard.take_expired(key, now) {
            bump(&self.counters.pending_reclaimed_in_stage);
            self.retire_write(expired, now);
            return fail(
                ErrorCode::LeaseExpired,
                format!("the pending write of {key} expired"),
            );
        }
        match shard.get_mut(key) {
            None => fail(
                ErrorCode::LeaseExpired,
                format!("no pending write of {key} (expired, revoked or never started)"),
            ),
            Some(record) if record.op != op => {
                bump(&self.counters.stale_operations_rejected);
                fail(
                    ErrorCode::StaleWriteToken,
                    format!(
                        "stale write_operation_id {op} for {key} (current {})",
                        record.op
                    ),
                )
            }
            Some(_) => shard.remove(key).ok_or(ErrorCode::InternalError),
        }
    }

    /// Marks `key` as having its route changed at the master until the guard drops.
    /// Errors: `OBJECT_REPLICA_BUSY` when it already is.
    fn route_change(&self, key: &str) -> Result<RoutingGuard<'_>> {
        if !self.routing.lock().insert(key.to_string()) {
            return fail(
                ErrorCode::ObjectReplicaBusy,
                format!("the route of {key} is being changed; retry later"),
            );
        }
        Ok(RoutingGuard {
            keys: &self.routing,
            key: key.to_string(),
        })
    }

    /// Asks the master to route `key` (`size` bytes) to us. While a freshly started master
    /// takes no new routes (its route grace, answered `OBJECT_REPLICA_BUSY`) this retries
    /// every [`GRACE_RETRY`], for at most [`super::MASTER_ROUTE_GRACE`] plus one retry (a
    /// master with a longer grace refuses earlier commits with that code).
    fn publish_route(&self, key: &str, size: u64) -> Result<()> {
        let deadline = Instant::now() + super::MASTER_ROUTE_GRACE + GRACE_RETRY;
        loop {
            let answer = self
                .master
                .p2p_add_keys(self.id, vec![key.to_string()], vec![size])
                .and_then(|mut answers| answers.pop().unwrap_or(Err(ErrorCode::InternalError)));
            match answer {
                Err(ErrorCode::ObjectReplicaBusy) if Instant::now() < deadline => {
                    std::thread::sleep(GRACE_RETRY)
                }
                answer => return answer,
            }
        }
    }

    /// The master routes the key to us first; only then is the value visible here, so no
    /// reader ever gets a value whose route the master refused.
    fn commit(&self, key: &str, op: u64) -> Result<()> {
        let _publishing = self.publishing.read();
        let _routing = self.route_change(key)?;
        let record = self.take_pending(key, op)?;
        let size = record.handle.len();
        let published = self.publish_route(key, size);
        // The writer's transfer has ended (it asks to commit only then), so an uncommitted
        // value's space is freed at once, as a removed one's.
        if let Err(code) = published {
            drop(record);
            return fail(code, format!("master refused the route of {key}"));
        }
        if !self.commit_delay.is_zero() {
            std::thread::sleep(self.commit_delay);
        }
        if let Err(code) = self.backend.commit(key, record.handle) {
            if let Err(e) = self.master.p2p_remove_keys(self.id, vec![key.to_string()]) {
                tracing::warn!(%e, key, "could not withdraw the route of an uncommitted key");
            }
            return Err(code);
        }
        bump(&self.counters.pending_committed);
        Ok(())
    }

    fn revoke(&self, key: &str, op: u64) -> Result<()> {
        let record = self.take_pending(key, op)?;
        self.retire_write(record, Instant::now());
        bump(&self.counters.pending_revoked);
        Ok(())
    }

    fn pin(&self, key: &str) -> Result<ReadGrant> {
        check_key(key)?;
        self.registration.check_serving()?;
        let now = Instant::now();
        let mut shard = self.pins.shard(key);
        if shard.take_expired(key, now).is_some() {
            bump(&self.counters.pins_reclaimed_in_stage);
        }
        let Some(handle) = self.backend.get(key) else {
            return fail(ErrorCode::ObjectNotFound, format!("no key {key}"));
        };
        match shard.get_mut(key) {
            Some(record) if Arc::ptr_eq(&record.handle, &handle) => {
                record.holders += 1;
                let op = record.op;
                shard.renew(key, deadline(now, self.lease));
                drop(shard);
                bump(&self.counters.pins_renewed);
                return Ok(self.read_grant(&handle, op));
            }
            Some(_) => {
                if let Some(old) = shard.remove(key) {
                    self.retire_pin(old);
                }
            }
            None => {}
        }
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        shard.insert(
            key,
            PinRecord {
                op,
                deadline: deadline(now, self.lease),
                handle: Arc::clone(&handle),
                holders: 1,
            },
        );
        drop(shard);
        bump(&self.counters.pins_created);
        Ok(self.read_grant(&handle, op))
    }

    fn read_grant(&self, handle: &AllocationHandle, op: u64) -> ReadGrant {
        ReadGrant {
            buffer: self.descriptor(handle),
            read_operation_id: op,
            lease_ms: self.lease_ms(),
        }
    }

    fn unpin(&self, key: &str, op: u64) -> Result<()> {
        let mut shard = self.pins.shard(key);
        if shard.take_expired(key, Instant::now()).is_some() {
            bump(&self.counters.pins_reclaimed_in_stage);
            return fail(ErrorCode::LeaseExpired, format!("the pin of {key} expired"));
        }
        let record = match shard.get_mut(key) {
            None => return fail(ErrorCode::LeaseExpired, format!("no pin of {key}")),
            Some(record) if record.op != op => {
                bump(&self.counters.stale_operations_rejected);
                return fail(
                    ErrorCode::InvalidRead,
                    format!(
                        "stale read_operation_id {op} for {key} (current {})",
                        record.op
                    ),
                );
            }
            Some(record) => record,
        };
        record.holders = record.holders.saturating_sub(1);
        if record.holders == 0 {
            drop(shard.remove(key));
        }
        drop(shard);
        bump(&self.counters.pins_released);
        Ok(())
    }

    /// The instants after which no transfer of `valid_for_ms[i]` may start, counted from
    /// `received`, when we read the request (see [`RemoteRead::valid_for_ms`]: the
    /// accessor may reuse its buffer once it gave up, so a late start could move another
    /// key's bytes).
    fn start_limits(received: Instant, valid_for_ms: impl Iterator<Item = u64>) -> Vec<Instant> {
        valid_for_ms
            .map(|ms| deadline(received, Duration::from_millis(ms)))
            .collect()
    }

    /// Refuses an item whose accessor has given up (`now` ≥ `start_by`).
    ///
    /// Errors: `STALE_WRITE_TOKEN`, counted in `reverse_late_refused`.
    fn check_start(&self, start_by: Instant) -> Result<()> {
        if Instant::now() < start_by {
            return Ok(());
        }
        bump(&self.counters.reverse_late_refused);
        fail(
            ErrorCode::StaleWriteToken,
            "the accessor's REVERSE deadline passed before the transfer started",
        )
    }

    /// Runs `requests` with our engine after the test delay (no lock is held here). A
    /// request past its `send_by` fails with `STALE_WRITE_TOKEN` unsent and is counted in
    /// `reverse_late_refused`.
    fn transfer_stage(&self, requests: &[TransferRequest<'_>]) -> Vec<Result<()>> {
        if !self.stage_delay.is_zero() {
            std::thread::sleep(self.stage_delay);
        }
        // SAFETY: every local range is a tier allocation whose handle the caller holds for
        // the duration of the call (so it stays allocated and mapped), `len` bytes long;
        // READ targets are distinct fresh allocations, so they do not overlap.
        let outcomes = unsafe { self.engine.transfer(requests) };
        for outcome in &outcomes {
            if *outcome == Err(ErrorCode::StaleWriteToken) {
                bump(&self.counters.reverse_late_refused);
            }
        }
        outcomes
    }

    fn pull_values(&self, items: Vec<RemoteWrite>, received: Instant) -> Vec<Result<()>> {
        let start_by = Self::start_limits(received, items.iter().map(|i| i.valid_for_ms));
        let reserved: Vec<Result<(WriteGrant, AllocationHandle)>> = items
            .iter()
            .zip(&start_by)
            .map(|(item, &by)| {
                self.check_start(by)?;
                self.reserve(&item.key, item.source.len)
            })
            .collect();
        let mut requests = Vec::new();
        let mut index = Vec::new();
        for (i, (item, reservation)) in items.iter().zip(&reserved).enumerate() {
            if let Ok((_, handle)) = reservation {
                index.push(i);
                requests.push(TransferRequest {
                    op: TransferOp::Read,
                    local_addr: handle.addr(),
                    len: handle.len(),
                    endpoint: &item.source.endpoint,
                    remote_addr: item.source.addr,
                    epoch: 0,
                    send_by: Some(start_by[i]),
                });
            }
        }
        let mut moved: Vec<Option<Result<()>>> = vec![None; items.len()];
        for (i, outcome) in index.into_iter().zip(self.transfer_stage(&requests)) {
            moved[i] = Some(outcome);
        }
        items
            .iter()
            .zip(reserved)
            .zip(moved)
            .map(|((item, reservation), moved)| {
                let (grant, _held) = reservation?;
                let op = grant.write_operation_id;
                match moved.unwrap_or(Err(ErrorCode::InternalError)) {
                    Ok(()) => {
                        self.commit(&item.key, op)?;
                        bump(&self.counters.reverse_writes_served);
                        Ok(())
                    }
                    Err(code) => {
                        let _ = self.revoke(&item.key, op);
                        Err(code)
                    }
                }
            })
            .collect()
    }

    /// The committed value `item` asks for.
    ///
    /// Errors: `OBJECT_NOT_FOUND`; `INVALID_PARAMS` when the target is too small.
    fn value_for(&self, item: &RemoteRead) -> Result<AllocationHandle> {
        self.registration.check_serving()?;
        match self.backend.get(&item.key) {
            None => fail(ErrorCode::ObjectNotFound, format!("no key {}", item.key)),
            Some(handle) if handle.len() > item.target.len => fail(
                ErrorCode::InvalidParams,
                format!(
                    "{} needs {} bytes, buffer has {}",
                    item.key,
                    handle.len(),
                    item.target.len
                ),
            ),
            Some(handle) => Ok(handle),
        }
    }

    fn push_values(&self, items: Vec<RemoteRead>, received: Instant) -> Vec<Result<u64>> {
        let start_by = Self::start_limits(received, items.iter().map(|i| i.valid_for_ms));
        let found: Vec<Result<AllocationHandle>> = items
            .iter()
            .zip(&start_by)
            .map(|(item, &by)| {
                self.check_start(by)?;
                self.value_for(item)
            })
            .collect();
        let mut requests = Vec::new();
        let mut index = Vec::new();
        for (i, (item, handle)) in items.iter().zip(&found).enumerate() {
            if let Ok(handle) = handle {
                index.push(i);
                requests.push(TransferRequest {
                    op: TransferOp::Write,
                    local_addr: handle.addr(),
                    len: handle.len(),
                    endpoint: &item.target.endpoint,
                    remote_addr: item.target.addr,
                    epoch: 0,
                    send_by: Some(start_by[i]),
                });
            }
        }
        let mut results: Vec<Result<u64>> = found
            .iter()
            .map(|h| h.as_ref().map(|h| h.len()).map_err(|e| *e))
            .collect();
        for (i, outcome) in index.into_iter().zip(self.transfer_stage(&requests)) {
            match outcome {
                Ok(()) => bump(&self.counters.reverse_reads_served),
                Err(code) => results[i] = Err(code),
            }
        }
        results
    }

    /// Same-process put: reserve, copy, commit.
    ///
    /// Errors: as PreWrite and WriteCommit.
    pub(crate) fn put_local(&self, key: &str, value: &[u8]) -> Result<()> {
        let (grant, handle) = self.reserve(key, value.len() as u64)?;
        // SAFETY: `handle` is a fresh allocation of `value.len()` bytes we hold; the source
        // is the caller's slice; they cannot overlap.
        unsafe { copy::copy_or_fail(handle.addr() as *mut u8, value.as_ptr(), value.len()) }?;
        self.commit(key, grant.write_operation_id)
    }

    /// Same-process get into `buffer`; returns the value size.
    ///
    /// Errors: `OBJECT_NOT_FOUND`; `INVALID_PARAMS` when `buffer` is too small.
    pub(crate) fn get_local(&self, key: &str, buffer: &mut [u8]) -> Result<u64> {
        self.registration.check_serving()?;
        let Some(handle) = self.backend.get(key) else {
            return fail(ErrorCode::ObjectNotFound, format!("no key {key}"));
        };
        let len = handle.len() as usize;
        if len > buffer.len() {
            return fail(
                ErrorCode::InvalidParams,
                format!("{key} needs {len} bytes, buffer has {}", buffer.len()),
            );
        }
        // SAFETY: the handle keeps `len` bytes allocated and mapped; the target is the
        // caller's exclusive slice of at least `len` bytes.
        unsafe { copy::copy_or_fail(buffer.as_mut_ptr(), handle.addr() as *const u8, len) }?;
        Ok(len as u64)
    }

    /// Every committed key with its size.
    pub(crate) fn keys(&self) -> Vec<(String, u64)> {
        self.backend.keys()
    }

    /// One round of the background scan: reclaims expired records of both tables (expired
    /// writes into the quarantine) and frees quarantined space whose deadline has passed.
    pub(crate) fn scan(&self) {
        let now = Instant::now();
        let writes = self.pending.scan(now);
        let pins = self.pins.scan(now);
        self.counters
            .pending_reclaimed_by_scan
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        self.counters
            .pins_reclaimed_by_scan
            .fetch_add(pins.len() as u64, Ordering::Relaxed);
        for record in writes {
            self.retire_write(record, now);
        }
        drop(pins);
        self.held.release_due(now);
    }

    /// Counters with the owner's gauges filled in.
    pub(crate) fn fill_gauges(&self, counters: &mut P2pCounters) {
        counters.pending_records = self.pending.len() as u64;
        counters.pin_records = self.pins.len() as u64;
        counters.tier_bytes_used = self.backend.used_bytes();
        counters.quarantined_allocations = self.held.len() as u64;
    }

    /// Hides `key` at once, for REVERSE and FORWARD alike; a pin of its value moves into the
    /// quarantine until its readers' leases end.
    /// Removes `key` if it is held with `size` bytes; whether it was.
    fn remove_one_of_size(&self, key: &str, size: u64) -> bool {
        let mut pins = self.pins.shard(key);
        let Some(value) = self.backend.remove_if(key, |handle| handle.len() == size) else {
            return false;
        };
        if let Some(record) = pins.remove(key) {
            self.retire_pin(record);
        }
        drop(pins);
        drop(value);
        true
    }

    fn remove_one(&self, key: &str) -> Result<()> {
        let mut pins = self.pins.shard(key);
        let Some(value) = self.backend.remove(key) else {
            return fail(ErrorCode::ObjectNotFound, format!("no key {key}"));
        };
        if let Some(record) = pins.remove(key) {
            self.retire_pin(record);
        }
        drop(pins);
        drop(value);
        Ok(())
    }

    /// This owner's standing with the master (the ping thread updates it).
    pub(crate) fn registration(&self) -> &Registration {
        &self.registration
    }

    /// Reclaims every key we hold from the master after it forgot us (`view`: see
    /// [`MasterApi::p2p_reclaim_keys`]) and drops those it refused; returns how many went.
    /// Waits for commits and removals in progress (see [`DataManager::publishing`](Self)).
    ///
    /// Errors: the call's, or `INTERNAL_ERROR` for an answer of the wrong length (nothing is
    /// dropped; the caller retries).
    pub(crate) fn reclaim(&self, view: u64) -> Result<usize> {
        let _publishing = self.publishing.write();
        let held = self.keys();
        let (keys, sizes): (Vec<String>, Vec<u64>) = held.iter().cloned().unzip();
        let answers = self.master.p2p_reclaim_keys(self.id, view, keys, sizes)?;
        if answers.len() != held.len() {
            return fail(
                ErrorCode::InternalError,
                format!(
                    "{} answers to a reclaim of {} keys",
                    answers.len(),
                    held.len()
                ),
            );
        }
        Ok(self.drop_refused(&held, &answers))
    }

    /// After reclaiming `held` (key, size): drops every key whose route the master refused
    /// (`answers[i]` an error: it was written, taken or removed while we were gone), so no
    /// reader with an old route gets its old value; a key now held with another size was
    /// written again meanwhile (and routed, or its commit decides) and stays. Returns how
    /// many went.
    fn drop_refused(&self, held: &[(String, u64)], answers: &[Result<()>]) -> usize {
        held.iter()
            .zip(answers)
            .filter(|(_, answer)| answer.is_err())
            .filter(|((key, size), _)| self.remove_one_of_size(key, *size))
            .count()
    }

    fn remove(&self, keys: Vec<String>) -> Vec<Result<()>> {
        let _publishing = self.publishing.read();
        // Each removed key stays marked until the master withdrew its route (no new write
        // of it may be routed before that withdrawal).
        let mut routing = Vec::with_capacity(keys.len());
        let results: Vec<Result<()>> = keys
            .iter()
            .map(|key| {
                routing.push(self.route_change(key)?);
                self.remove_one(key)
            })
            .collect();
        let removed: Vec<String> = keys
            .into_iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(k, _)| k)
            .collect();
        if !removed.is_empty() {
            if let Err(code) = self.master.p2p_remove_keys(self.id, removed) {
                tracing::warn!(%code, "could not remove routes at the master");
            }
        }
        results
    }
}

/// The client RPC service: every method runs on the RPC thread that read the request.
impl super::api::PeerApi for DataManager {
    fn write_remote_data(&self, items: Vec<RemoteWrite>) -> Result<Vec<Result<()>>> {
        Ok(self.pull_values(items, Instant::now()))
    }

    fn read_remote_data(&self, items: Vec<RemoteRead>) -> Result<Vec<Result<u64>>> {
        Ok(self.push_values(items, Instant::now()))
    }

    fn pre_write(&self, key: String, size: u64) -> Result<WriteGrant> {
        self.reserve(&key, size).map(|(grant, _)| grant)
    }

    fn write_commit(&self, key: String, write_operation_id: u64) -> Result<()> {
        self.commit(&key, write_operation_id)
    }

    fn write_revoke(&self, key: String, write_operation_id: u64) -> Result<()> {
        self.revoke(&key, write_operation_id)
    }

    fn pin_key(&self, key: String) -> Result<ReadGrant> {
        self.pin(&key)
    }

    fn un_pin_key(&self, key: String, read_operation_id: u64) -> Result<()> {
        self.unpin(&key, read_operation_id)
    }

    fn remove_data(&self, keys: Vec<String>) -> Result<Vec<Result<()>>> {
        Ok(self.remove(keys))
    }

    fn counters(&self) -> Result<P2pCounters> {
        let mut snapshot = self.counters.snapshot();
        self.fill_gauges(&mut snapshot);
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::{MasterConfig, MasterService};
    use crate::transfer::{DirectResolver, EngineConfig};
    use crate::types::{DeploymentMode, P2pOwner, Uuid};

    /// The master takes a commit's route, then expires the owner before the commit is
    /// visible; the owner re-registers and reclaims meanwhile. The reclaim must not leave the
    /// key out (its claim would be forgotten and the visible value routed nowhere, while
    /// readers with a cached route read it: the 30-minute chaos soak's violation).
    #[test]
    fn a_commit_racing_a_reclaim_keeps_its_route() {
        let master = MasterService::new(MasterConfig {
            deployment_mode: DeploymentMode::P2p,
            client_ttl_ms: Some(500),
            ..MasterConfig::default()
        });
        let engine = TransferEngine::new(EngineConfig {
            local_name: "reclaim-owner".into(),
            listener: None,
            resolver: Arc::new(DirectResolver),
            memcpy_enabled: true,
            rdma: None,
        })
        .unwrap();
        let id = Uuid::random();
        let me = P2pOwner {
            client: id,
            name: "reclaim-owner".into(),
            rpc_addr: "127.0.0.1:1".into(),
        };
        master.p2p_register_owner(me.clone()).unwrap();
        let view = master.ping(id).unwrap().view_version;
        let tiers = crate::p2p::config::TieredConfig::parse(
            r#"{"tiers":[{"type":"DRAM","capacity":1048576}]}"#,
        )
        .unwrap();
        let owner = Arc::new(
            DataManager::new(OwnerParts {
                backend: TieredBackend::new(&tiers, &engine, 4).unwrap(),
                engine: Arc::clone(&engine),
                master: master.clone(),
                id,
                lease: Duration::from_secs(5),
                shards: 4,
                counters: Arc::default(),
                quarantine: Duration::from_millis(100),
            })
            .with_commit_delay(Duration::from_millis(2500)),
        );
        let committing = {
            let owner = Arc::clone(&owner);
            std::thread::spawn(move || owner.put_local("k", &[7u8; 64]))
        };
        // The route is in; nobody pings, so the master expires the owner (TTL 500 ms).
        let expired = Instant::now() + Duration::from_secs(2);
        while Instant::now() < expired {
            let routes = master.p2p_get_routes(vec!["k".into()]).unwrap();
            if master.metrics().p2p_claimed_keys == 1 && routes[0].is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            master.metrics().p2p_claimed_keys,
            1,
            "the owner never expired"
        );
        master.p2p_register_owner(me).unwrap();
        let pinger = {
            let master = master.clone();
            std::thread::spawn(move || {
                for _ in 0..120 {
                    let _ = master.ping(id);
                    std::thread::sleep(Duration::from_millis(25));
                }
            })
        };
        assert_eq!(owner.reclaim(view), Ok(0));
        assert_eq!(committing.join().unwrap(), Ok(()));
        let routes = master.p2p_get_routes(vec!["k".into()]).unwrap();
        assert_eq!(
            routes[0].as_ref().map(|r| r.owner.client),
            Ok(id),
            "the owner holds a committed value the master routes nowhere"
        );
        pinger.join().unwrap();
    }
}
