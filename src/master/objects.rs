//! Object metadata and the sharded object table.
//!
//! Thread-safety: 1024 `parking_lot::Mutex` shards selected by key hash. At most one shard
//! lock is held at a time (see the lock order in `service.rs`).

use super::cache_leases::Holder;
use super::journal::{ObjectRecord, ReplicaRecord};
use super::stamp::Stamp;
use crate::alloc::Allocation;
use crate::spin::deadline;
use crate::types::{
    BufferDescriptor, ClientId, DiskRecordRef, QueryResult, ReplicaDescriptor, ReplicaStatus,
    ReplicateConfig, SoftPinAction, WriteToken, LOCAL_DISK_PROTOCOL,
};
use parking_lot::{Mutex, MutexGuard};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Number of metadata shards (Mooncake's `kNumShards`).
pub(crate) const NUM_SHARDS: usize = 1024;

/// A place in the table's scan order (shard, then slot): where a stopped scan stopped. The
/// default is the table's start. Plain value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScanPosition {
    shard: usize,
    slot: u32,
}

/// Slots a scan visits per hold of a shard's lock (see [`ObjectTable::scan_in_slices`]): a
/// slice of removals takes well under a millisecond.
pub(crate) const SCAN_SLICE: u32 = 256;

pub(crate) use super::replicas::{Range, Replica};

/// An object's memory replicas: one inline (the common case), more on the heap.
pub(crate) type Replicas = smallvec::SmallVec<[Replica; 1]>;

/// Where a committed value's disk copy is: the tier (its directory's identity, stable across
/// owner restarts) and the generation its record was written for. Plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DiskLocation {
    /// The tier holding the record.
    pub tier: crate::types::Uuid,
    /// The object generation of the record.
    pub generation: u64,
}

/// A committed value's disk copy: where it is, and this object's hold on the record (the
/// record is deleted once the object, its pins and any lease-bound removal let go).
#[derive(Clone)]
pub(crate) struct DiskCopyRef {
    /// Where the record is.
    pub at: DiskLocation,
    /// The object's claim on it.
    pub hold: Arc<super::disk_tiers::DiskHold>,
    /// The tier mount that made or last confirmed it (`DiskTiers::mount_number`; 0: none
    /// since this master started): a mount forgets the copies its pages did not confirm.
    pub mount: u64,
    /// Reads that found the object on disk only since its last promotion was queued
    /// (`promotion_on_hit`).
    pub hits: u32,
}

/// Where an object is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Replicas PROCESSING since `started`; unreadable.
    Writing { started: Instant },
    /// Replicas COMPLETE; readable.
    Complete,
}

/// What few objects have: a soft pin, a disk copy, a disk task, location-cache holders.
/// Boxed in [`ObjectMeta::extra`] only while one of them is set.
#[derive(Default)]
pub(crate) struct ObjectExtra {
    /// Soft pin length to apply when the write completes.
    pending_soft_pin: Option<Duration>,
    soft_pin_deadline: Option<Instant>,
    /// The committed value's record in its owner's disk tier (then `replicas` is empty: a
    /// demotion drops the memory replicas once the record is committed).
    disk: Option<DiskCopyRef>,
    /// The disk task copying the committed value to disk (or back), if one is in flight
    /// (the object is then not evictable; a new write ends it).
    demoting: Option<u64>,
    /// Clients that may serve this object's replica list from their location cache, and
    /// until when (`docs/location-cache.md`).
    cache_holders: Vec<Holder>,
}

impl ObjectExtra {
    fn is_empty(&self) -> bool {
        self.pending_soft_pin.is_none()
            && self.soft_pin_deadline.is_none()
            && self.disk.is_none()
            && self.demoting.is_none()
            && self.cache_holders.is_empty()
    }
}

/// Metadata of one key. Kept small (the master holds one per object, tens of millions):
/// times as [`Stamp`]s, the rare parts boxed in [`ObjectExtra`].
pub(crate) struct ObjectMeta {
    /// Generation, unique over the master's life (a key may be re-created).
    pub id: u64,
    pub size: u64,
    /// Client of the latest put/upsert start.
    pub writer: ClientId,
    /// Token of the latest put/upsert start: only its end or revoke acts on the object.
    pub write: WriteToken,
    /// When the write in progress started; `None`: complete (readable).
    write_started: Option<Stamp>,
    pub replicas: Replicas,
    lease_deadline: Option<Stamp>,
    /// Last read (or completion): the LRU key of eviction.
    last_access: Stamp,
    /// Pins held on this generation.
    pub pins: u32,
    pub hard_pinned: bool,
    /// Whether the journal holds this object as committed (a `Commit` not followed by a
    /// `Remove`): taking it out of the table, or rewriting it, must journal its removal.
    pub journaled: bool,
    /// The write in progress was started while location caches had to be revoked (or
    /// might have: the master's start grace): it may end only once they are.
    pub revoking: bool,
    extra: Option<Box<ObjectExtra>>,
}

impl ObjectMeta {
    /// A new object being written by `writer` (write `write`, whose generation also becomes
    /// the object's id) into `replicas`.
    pub(crate) fn new(
        write: WriteToken,
        size: u64,
        writer: ClientId,
        replicas: Replicas,
        config: &ReplicateConfig,
        default_soft_pin: Duration,
        now: Instant,
    ) -> ObjectMeta {
        let mut meta = ObjectMeta {
            id: write.0,
            size,
            writer,
            write,
            write_started: Some(Stamp::of(now)),
            replicas,
            lease_deadline: None,
            last_access: Stamp::of(now),
            pins: 0,
            hard_pinned: config.with_hard_pin,
            journaled: false,
            revoking: false,
            extra: None,
        };
        meta.apply_soft_pin_action(config, default_soft_pin);
        meta
    }

    /// A committed object restored from the journal (journaled, unleased, accessed `now`).
    pub(crate) fn restored(
        id: u64,
        size: u64,
        replicas: Replicas,
        hard_pinned: bool,
        (soft_pin_deadline, disk): (Option<Instant>, Option<DiskCopyRef>),
        now: Instant,
    ) -> ObjectMeta {
        let mut meta = ObjectMeta {
            id,
            size,
            writer: ClientId::default(),
            write: WriteToken(id),
            write_started: None,
            replicas,
            lease_deadline: None,
            last_access: Stamp::of(now),
            pins: 0,
            hard_pinned,
            journaled: true,
            revoking: false,
            extra: None,
        };
        if soft_pin_deadline.is_some() {
            meta.extra_mut().soft_pin_deadline = soft_pin_deadline;
        }
        if let Some(disk) = disk {
            meta.set_disk(disk);
        }
        meta
    }

    fn extra(&self) -> Option<&ObjectExtra> {
        self.extra.as_deref()
    }

    /// The rare parts, boxed now if they were not.
    fn extra_mut(&mut self) -> &mut ObjectExtra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// Drops the box of the rare parts once none is set.
    fn trim_extra(&mut self) {
        if self.extra.as_ref().is_some_and(|extra| extra.is_empty()) {
            self.extra = None;
        }
    }

    /// The committed value's disk copy, if it has one.
    pub(crate) fn disk(&self) -> Option<&DiskCopyRef> {
        self.extra()?.disk.as_ref()
    }

    pub(crate) fn disk_mut(&mut self) -> Option<&mut DiskCopyRef> {
        self.extra.as_mut()?.disk.as_mut()
    }

    pub(crate) fn set_disk(&mut self, copy: DiskCopyRef) {
        self.extra_mut().disk = Some(copy);
    }

    /// Forgets the disk copy; returns it.
    pub(crate) fn take_disk(&mut self) -> Option<DiskCopyRef> {
        let copy = self.extra.as_mut()?.disk.take();
        self.trim_extra();
        copy
    }

    /// The disk task in flight for this object, if any.
    pub(crate) fn demoting(&self) -> Option<u64> {
        self.extra()?.demoting
    }

    pub(crate) fn set_demoting(&mut self, task: Option<u64>) {
        match task {
            Some(_) => self.extra_mut().demoting = task,
            None => {
                if let Some(extra) = self.extra.as_mut() {
                    extra.demoting = None;
                }
                self.trim_extra();
            }
        }
    }

    /// Whether some client may serve this object from its location cache.
    pub(crate) fn has_cache_holders(&self) -> bool {
        self.extra()
            .is_some_and(|extra| !extra.cache_holders.is_empty())
    }

    /// The location-cache holders, to add one.
    pub(crate) fn cache_holders_mut(&mut self) -> &mut Vec<Holder> {
        &mut self.extra_mut().cache_holders
    }

    /// Forgets the location-cache holders; returns them.
    pub(crate) fn take_cache_holders(&mut self) -> Vec<Holder> {
        let holders = self
            .extra
            .as_mut()
            .map(|e| std::mem::take(&mut e.cache_holders));
        self.trim_extra();
        holders.unwrap_or_default()
    }

    /// The read lease's end, if one was granted (it may have ended).
    pub(crate) fn lease_deadline(&self) -> Option<Instant> {
        self.lease_deadline.map(Stamp::instant)
    }

    /// The last read (or completion).
    pub(crate) fn last_access(&self) -> Instant {
        self.last_access.instant()
    }

    /// Where the object is in its life.
    pub(crate) fn phase(&self) -> Phase {
        match self.write_started {
            Some(started) => Phase::Writing {
                started: started.instant(),
            },
            None => Phase::Complete,
        }
    }

    /// Applies the write's soft pin action: ENABLE arms a pin that starts when readable,
    /// DISABLE clears it, PRESERVE keeps the current state.
    pub(crate) fn apply_soft_pin_action(&mut self, config: &ReplicateConfig, default: Duration) {
        match config.soft_pin_action {
            SoftPinAction::Enable => {
                self.extra_mut().pending_soft_pin = Some(
                    config
                        .soft_pin_ttl_ms
                        .map_or(default, Duration::from_millis),
                );
            }
            SoftPinAction::Disable => {
                if let Some(extra) = self.extra.as_mut() {
                    extra.pending_soft_pin = None;
                    extra.soft_pin_deadline = None;
                }
                self.trim_extra();
            }
            SoftPinAction::Preserve => {}
        }
    }

    /// Starts a new write `write` by `writer` (upsert): PROCESSING again, lease dropped.
    pub(crate) fn restart_write(&mut self, writer: ClientId, write: WriteToken, now: Instant) {
        self.writer = writer;
        self.write = write;
        self.write_started = Some(Stamp::of(now));
        self.lease_deadline = None;
        self.set_demoting(None);
    }

    /// Makes the object readable; the soft pin, if armed, starts now.
    pub(crate) fn complete(&mut self, now: Instant) {
        self.write_started = None;
        self.last_access = Stamp::of(now);
        if let Some(extra) = self.extra.as_mut() {
            if let Some(ttl) = extra.pending_soft_pin.take() {
                extra.soft_pin_deadline = Some(deadline(now, ttl));
            }
        }
    }

    /// When the current write started, if one is in progress.
    pub(crate) fn write_started(&self) -> Option<Instant> {
        self.write_started.map(Stamp::instant)
    }

    /// Whether a read lease is running at `now`.
    pub(crate) fn has_lease(&self, now: Instant) -> bool {
        self.lease_deadline
            .is_some_and(|deadline| deadline > Stamp::of(now))
    }

    /// Whether the soft pin is running at `now`.
    pub(crate) fn is_soft_pinned(&self, now: Instant) -> bool {
        let deadline = self.extra().and_then(|extra| extra.soft_pin_deadline);
        deadline.is_some_and(|deadline| deadline > now)
    }

    /// All replicas, as PROCESSING descriptors (answer to a write start).
    pub(crate) fn processing_descriptors(&self) -> Vec<ReplicaDescriptor> {
        let all = self.replicas.iter();
        all.map(|r| r.descriptor(self.size, ReplicaStatus::Processing))
            .collect()
    }

    /// Whether [`Self::readable`] is not empty, without collecting it (the eviction scan asks
    /// this of every object).
    pub(crate) fn is_readable_in_memory(&self) -> bool {
        self.write_started.is_none() && self.replicas.iter().any(|r| r.allocation().is_live())
    }

    /// The readable replicas (COMPLETE, segment mounted); empty while being written.
    pub(crate) fn readable(&self) -> Vec<&Replica> {
        if self.write_started.is_some() {
            return Vec::new();
        }
        let live = self.replicas.iter().filter(|r| r.allocation().is_live());
        live.collect()
    }

    /// The LOCAL_DISK descriptor of the committed value of `key`, if it is on disk and its
    /// tier is mounted by `owner`, whose read service is at `endpoint`.
    fn disk_descriptor(
        &self,
        key: &str,
        mounted: Option<(ClientId, String)>,
    ) -> Option<ReplicaDescriptor> {
        let location = self.disk_at().filter(|_| self.write_started.is_none())?;
        let (owner, endpoint) = mounted?;
        Some(ReplicaDescriptor {
            id: 0,
            buffer: BufferDescriptor {
                size: self.size,
                buffer_address: 0,
                protocol: LOCAL_DISK_PROTOCOL.to_string(),
                transport_endpoint: endpoint,
                epoch: 0,
            },
            status: ReplicaStatus::Complete,
            disk: Some(DiskRecordRef {
                key: key.to_string(),
                owner,
                generation: location.generation,
            }),
        })
    }

    /// Grants or extends the read lease to `max(old, now + ttl)` and records the access.
    /// Returns the query answer for `key` (this object's key), or `None` if nothing is
    /// readable (no lease granted). `mounted_tier` names the owner of a disk tier and its
    /// read service (`None`: not mounted).
    pub(crate) fn read(
        &mut self,
        key: &str,
        now: Instant,
        ttl: Duration,
        mounted_tier: impl FnOnce(crate::types::Uuid) -> Option<(ClientId, String)>,
    ) -> Option<QueryResult> {
        let mut replicas: Vec<ReplicaDescriptor> = self
            .readable()
            .into_iter()
            .map(|r| r.descriptor(self.size, ReplicaStatus::Complete))
            .collect();
        let on_disk = self.disk_at().and_then(|d| mounted_tier(d.tier));
        replicas.extend(self.disk_descriptor(key, on_disk));
        if replicas.is_empty() {
            return None;
        }
        let until = deadline(now, ttl);
        let until = Stamp::of(until);
        self.lease_deadline = Some(self.lease_deadline.map_or(until, |d| d.max(until)));
        self.last_access = Stamp::of(now);
        Some(QueryResult {
            size: self.size,
            replicas,
            lease_ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            cache_ttl_ms: 0,
        })
    }

    /// Where the committed value's disk copy is, if it has one.
    pub(crate) fn disk_at(&self) -> Option<DiskLocation> {
        self.disk().map(|copy| copy.at)
    }

    /// Handles of their own on the replicas' ranges (for a pin).
    pub(crate) fn share_allocations(&mut self) -> Vec<Arc<Allocation>> {
        self.replicas.iter_mut().map(|r| r.range.share()).collect()
    }

    /// The first readable replica's segment and descriptor, and a handle of its own on its
    /// range (the source of a disk task).
    pub(crate) fn share_first_readable(
        &mut self,
    ) -> Option<(crate::types::SegmentId, BufferDescriptor, Arc<Allocation>)> {
        if self.write_started.is_some() {
            return None;
        }
        let size = self.size;
        let replica = self
            .replicas
            .iter_mut()
            .find(|r| r.allocation().is_live())?;
        Some((
            replica.segment(),
            replica.buffer(size),
            replica.range.share(),
        ))
    }

    /// A pin of this generation was released: the ranges no one else holds are owned by
    /// their replicas again.
    pub(crate) fn unpin(&mut self) {
        self.pins = self.pins.saturating_sub(1);
        if self.pins == 0 {
            self.reclaim_ranges();
        }
    }

    /// The replicas own the ranges no one else holds again (see [`Range::reclaim`]).
    pub(crate) fn reclaim_ranges(&mut self) {
        self.replicas.iter_mut().for_each(|r| r.range.reclaim());
    }

    /// Gives up the replicas, returning their ranges.
    pub(crate) fn take_allocations(&mut self) -> Vec<Range> {
        self.replicas.drain(..).map(|r| r.range).collect()
    }

    /// Removes the replicas whose mount is gone (segment unmounted, or remounted with a new
    /// epoch) and returns their allocations. Replicas of a recovered segment waiting for its
    /// owner (dormant) stay.
    pub(crate) fn take_dead_replicas(&mut self) -> Vec<Range> {
        let mut dead = Vec::new();
        for replica in std::mem::take(&mut self.replicas) {
            match replica.allocation().is_live() || replica.allocation().is_dormant() {
                true => self.replicas.push(replica),
                false => dead.push(replica.range),
            }
        }
        dead
    }

    /// The journal's description of this (complete) object at `now`.
    pub(crate) fn record(&self, now: Instant) -> ObjectRecord {
        let soft_pin = self
            .extra()
            .and_then(|extra| extra.soft_pin_deadline)
            .map(|d| d.saturating_duration_since(now));
        ObjectRecord {
            id: self.id,
            size: self.size,
            hard_pinned: self.hard_pinned,
            soft_pin_ms: soft_pin.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            replicas: self
                .replicas
                .iter()
                .map(|r| ReplicaRecord {
                    id: r.id,
                    segment: r.segment(),
                    epoch: r.place.epoch,
                    offset: r.allocation().offset(),
                    size: r.allocation().size(),
                })
                .collect(),
        }
    }

    /// Allocated bytes of the replicas.
    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.replicas.iter().map(|r| r.allocation().size()).sum()
    }
}

pub(crate) use super::table::Shard;

/// The object table.
pub(crate) struct ObjectTable {
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
    /// Per shard: the journal LSN of the last removal of one of its committed objects (set
    /// under the shard's lock). A write of a key waits until it is safe before it is granted,
    /// so no acknowledged write can be followed, after a failover, by a removed older value.
    removals: Vec<AtomicU64>,
}

impl Default for ObjectTable {
    fn default() -> Self {
        let hasher = RandomState::new();
        let shard = || Mutex::new(Shard::with_hasher(hasher.clone()));
        ObjectTable {
            shards: (0..NUM_SHARDS).map(|_| shard()).collect(),
            hasher,
            removals: (0..NUM_SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ObjectTable {
    /// The shard of `key`: bits 32.. of its hash (a shard's index uses the low bits for the
    /// bucket and the top 7 as the tag, which would all be alike within a shard otherwise).
    fn index(&self, key: &str) -> usize {
        ((self.hasher.hash_one(key) >> 32) % NUM_SHARDS as u64) as usize
    }

    /// Locks the shard owning `key`.
    pub(crate) fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        self.shards[self.index(key)].lock()
    }

    /// Records that a committed object of `key`'s shard was journaled removed at `lsn`.
    pub(crate) fn note_removal(&self, key: &str, lsn: u64) {
        self.removals[self.index(key)].fetch_max(lsn, Ordering::AcqRel);
    }

    /// The LSN of the last journaled removal in `key`'s shard (0: none).
    pub(crate) fn last_removal(&self, key: &str) -> u64 {
        self.removals[self.index(key)].load(Ordering::Acquire)
    }

    /// Every shard, one at a time (each lock released before the next is taken).
    pub(crate) fn shards(&self) -> impl Iterator<Item = MutexGuard<'_, Shard>> {
        self.shards.iter().map(|shard| shard.lock())
    }

    /// Visits every shard in slices of at most [`SCAN_SLICE`] slots, each under the shard's
    /// lock for that slice alone (`visit(shard, slots)`), so that a scan of a large table
    /// never holds a shard long: other calls on it wait for one slice at most. Objects
    /// inserted or removed during the scan may or may not be visited; the others are, once.
    /// What `visit` returns is dropped after the slice's lock is released.
    pub(crate) fn scan_in_slices<R>(
        &self,
        visit: impl FnMut(&mut Shard, std::ops::Range<u32>) -> R,
    ) {
        self.scan_in_slices_around(ScanPosition::default(), || false, visit);
    }

    /// As [`Self::scan_in_slices`], once around the table from `from` (to the table's end,
    /// then from its start back to `from`; slots never move, so a position stays valid while
    /// the table grows and shrinks), stopping after the first slice at whose end there is
    /// more to visit and `stop()` says so. `None` when it went all the way around; else
    /// where it stopped.
    pub(crate) fn scan_in_slices_around<R>(
        &self,
        from: ScanPosition,
        stop: impl Fn() -> bool,
        mut visit: impl FnMut(&mut Shard, std::ops::Range<u32>) -> R,
    ) -> Option<ScanPosition> {
        let count = self.shards.len();
        let from = match from.shard < count {
            true => from,
            false => ScanPosition::default(),
        };
        // Steps 0..count visit whole shards from `from.shard` on (the first from
        // `from.slot`); step `count` visits the first shard's slots before `from.slot`.
        let steps = count + usize::from(from.slot > 0);
        for step in 0..steps {
            let index = (from.shard + step) % count;
            let (mut at, until) = match step {
                0 => (from.slot, u32::MAX),
                s if s == count => (0, from.slot),
                _ => (0, u32::MAX),
            };
            loop {
                let mut guard = self.shards[index].lock();
                let limit = until.min(guard.slots());
                if at >= limit {
                    break;
                }
                let end = at.saturating_add(SCAN_SLICE).min(limit);
                let after_unlock = visit(&mut guard, at..end);
                drop(guard);
                drop(after_unlock);
                at = end;
                let more = at < limit || step + 1 < steps;
                if more && stop() {
                    return Some(ScanPosition {
                        shard: index,
                        slot: at,
                    });
                }
            }
        }
        None
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.shards().map(|shard| shard.len()).sum()
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// The master holds one record per object: its size is the master's memory per object
    /// (with the key's 32 bytes and about 10 of index; `mc_bench --master-scale`).
    #[test]
    fn an_object_record_stays_compact() {
        use std::mem::size_of;
        assert_eq!(size_of::<Replica>(), 48);
        assert_eq!(size_of::<Replicas>(), 56, "one replica inline");
        assert!(
            size_of::<ObjectMeta>() <= 136,
            "{}",
            size_of::<ObjectMeta>()
        );
    }
}
