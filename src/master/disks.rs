//! The SSD tier at the master (`docs/ssd-tier.md`): owners mount their disk tiers and say
//! what they hold, eviction demotes objects to their owner's tier instead of dropping them,
//! owners report committed records (the memory replica is then released) and lost ones (the
//! master forgets them), and removals queue the deletion of the disk copy.
//!
//! Who knows what a tier holds: the master. Every record went through it (a demotion it
//! accepted), and with a journal it knows them across its restarts (`Record::DiskCommit`).
//! At a mount the owner keeps exactly the records the master lists on that tier and deletes
//! the rest; the master forgets the copies the owner lacks. Locks: one object shard at a
//! time, then the tier registry (`service.rs` order).

use super::disk_tiers::{record_bytes, Demote, Demotion, DiskWork, TRIM_SCAN};
use super::metrics::Counters;
use super::objects::{DiskCopyRef, DiskLocation, ObjectMeta, Shard};
use super::service::MasterService;
use crate::error::{fail, ErrorCode, Result};
use crate::types::{
    ClientId, DeploymentMode, DiskMount, DiskMountAnswer, DiskMountPage, DiskObject, DiskReport,
    DiskTask, Uuid,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What [`MasterService::evict_from_disk`] did with one disk object.
enum DiskEviction {
    Evicted,
    /// Evictable once its read lease ends.
    Leased,
    /// Pinned, hard-pinned, being written or demoted, back in memory, or gone.
    Kept,
}

/// How long an owner's poll for disk work waits when none is queued.
pub(super) const DISK_POLL: Duration = Duration::from_millis(100);

impl MasterService {
    /// [`super::MasterApi::mount_disk`].
    pub(super) fn mount_disk_tier(
        &self,
        client: ClientId,
        mount: DiskMount,
        page: DiskMountPage,
    ) -> Result<DiskMountAnswer> {
        self.require_mode(DeploymentMode::Centralized)?;
        // Only a client the master knows: one it expired (or a restarted master) must first
        // learn so at its next ping and remount its segment; registering it here would answer
        // that ping Ok and leave the segment unmounted.
        if self.clients.ping(client, Instant::now()).is_none() {
            return fail(
                ErrorCode::ClientNotFound,
                format!("{client} is not registered; it mounts its segment first"),
            );
        }
        let tier = mount.disk;
        let number = match page.first {
            true => self.disks.mount(client, &mount, page.attempt)?,
            false => {
                self.disks.continue_mount(client, tier, page.mount)?;
                page.mount
            }
        };
        let kept: Vec<bool> = page
            .held
            .iter()
            .map(|object| self.confirm_held(tier, number, object))
            .collect();
        let confirmed = page.held.iter().zip(&kept).filter(|(_, kept)| **kept);
        self.disks
            .confirm(tier, confirmed.map(|(o, _)| record_bytes(o.size)).sum());
        let dropped = kept.iter().filter(|k| !**k).count();
        Counters::add(&self.counters.disk_objects_refused, dropped as u64);
        if page.last && self.end_mount(tier, number) {
            tracing::info!(%client, %tier, "disk tier mounted");
        }
        Ok(DiskMountAnswer {
            mount: number,
            kept,
        })
    }

    /// Whether the owner keeps `object` on `tier`: the master lists it there (same key,
    /// generation and size; the copy is then marked confirmed by mount `number`), or a
    /// [`super::disk_tiers::DiskHold`] still holds it (a pin or a lease-bound removal of a
    /// value removed or overwritten since: its reader still reads it). Any other record is
    /// never adopted: it may hold a value removed or overwritten since, or the bytes of a
    /// refused demotion.
    fn confirm_held(&self, tier: Uuid, number: u64, object: &DiskObject) -> bool {
        let listed = DiskLocation {
            tier,
            generation: object.generation,
        };
        let mut shard = self.objects.shard(&object.key);
        let meta = shard.get_mut(&object.key);
        let copy = meta
            .filter(|meta| meta.size == object.size)
            .and_then(|meta| meta.disk_mut())
            .filter(|copy| copy.at == listed);
        match copy {
            Some(copy) => {
                // A late page of an older mount never unmarks what a newer one confirmed.
                copy.mount = copy.mount.max(number);
                true
            }
            None => {
                drop(shard);
                self.disks.is_held(tier, object.generation)
            }
        }
    }

    /// Ends mount `number` of `tier` after its last page: the copies no page of it (or of a
    /// later mount, or a demotion since it began) confirmed are forgotten. Nothing happens
    /// when a later mount replaced it meanwhile (a page processed after its owner gave up).
    /// Returns whether it ended the mount.
    fn end_mount(&self, tier: Uuid, number: u64) -> bool {
        if self.disks.mount_number(tier) != number {
            return false;
        }
        self.forget_unlisted(tier, |copy| copy.mount >= number);
        self.disks.finish_mount(tier, number);
        true
    }

    /// Drops the disk copies the master lists on `tier` that `keep` refuses (the owner lacks
    /// them, or the tier is given up); objects left with no replica disappear.
    pub(super) fn forget_unlisted(&self, tier: Uuid, keep: impl Fn(&DiskCopyRef) -> bool) {
        let now = Instant::now();
        self.objects.scan_in_slices(|shard, slots| {
            let lost: Vec<String> = shard
                .slice_mut(slots)
                .filter_map(|(key, meta)| {
                    let copy = meta.disk().filter(|d| d.at.tier == tier)?;
                    let gone = !keep(copy);
                    gone.then(|| {
                        meta.take_disk();
                        key.to_string()
                    })
                })
                .collect();
            for key in lost {
                self.drop_if_unreadable(shard, &key, now);
            }
        });
    }

    /// `key` lost its disk copy: takes it out of the table if it has no replica left, else
    /// journals it as in memory only.
    fn drop_if_unreadable(&self, shard: &mut Shard, key: &str, now: Instant) {
        let Some(meta) = shard.get_mut(key) else {
            return;
        };
        if !meta.replicas.is_empty() || meta.disk().is_some() {
            self.journal_commit(key, meta, now);
            return;
        }
        if let Some(mut meta) = self.take_object(shard, key) {
            self.retire(&mut meta, now);
        }
    }

    /// [`super::MasterApi::disk_tasks`].
    pub(super) fn disk_tasks_of(&self, client: ClientId) -> Result<Vec<DiskTask>> {
        self.disks.take_tasks(client, DISK_POLL)
    }

    /// [`super::MasterApi::disk_report`].
    pub(super) fn apply_disk_reports(
        &self,
        client: ClientId,
        reports: Vec<DiskReport>,
    ) -> Result<Vec<bool>> {
        let now = Instant::now();
        Ok(reports
            .into_iter()
            .map(|report| match report {
                DiskReport::Demoted {
                    task,
                    key,
                    generation,
                    written,
                } => match self.disks.finish_demotion(client, task, written) {
                    Some(demotion) => self.end_demotion(demotion, task, written, now),
                    None => {
                        Counters::add(&self.counters.demotions_refused, 1);
                        // A task given up (timed out) whose record a later task of the same
                        // (key, generation) wrote and had accepted: the owner keeps it.
                        written && self.is_disk_copy(client, &key, generation)
                    }
                },
                DiskReport::Lost { key, generation } => {
                    self.forget_lost(client, &key, generation, now);
                    true
                }
            })
            .collect())
    }

    /// Whether `key`'s disk copy is the record at `generation` on `client`'s tier.
    fn is_disk_copy(&self, client: ClientId, key: &str, generation: u64) -> bool {
        let Some(tier) = self.disks.tier_of(client) else {
            return false;
        };
        let shard = self.objects.shard(key);
        let at = shard.get(key).and_then(|meta| meta.disk_at());
        at == Some(DiskLocation { tier, generation })
    }

    /// Ends demotion `task`: with its record `written`, the object moves to disk (its memory
    /// replicas are released once their read lease ends); without, the object is evicted as
    /// it would have been without a tier. Returns whether the record is accepted.
    fn end_demotion(&self, demotion: Demotion, task: u64, written: bool, now: Instant) -> bool {
        let key = &demotion.key.clone();
        let mut shard = self.objects.shard(key);
        let current = shard.get_mut(key).filter(|meta| {
            meta.demoting() == Some(task)
                && meta.write.0 == demotion.generation
                && meta.write_started().is_none()
        });
        let Some(meta) = current else {
            drop(shard);
            Counters::add(&self.counters.demotions_refused, 1);
            // A promotion reserved no disk bytes; its range goes with `demotion`.
            if written && demotion.work != DiskWork::Promote {
                self.disks.give_back(demotion.tier, demotion.size);
            }
            return false;
        };
        meta.set_demoting(None);
        let counters = &self.counters;
        if demotion.work == DiskWork::Promote {
            return self.end_promotion(key, meta, demotion, written, now);
        }
        // The task's handle on its source goes: the replica owns its range again.
        let Demotion {
            tier,
            generation,
            work,
            range,
            ..
        } = demotion;
        drop(range);
        meta.reclaim_ranges();
        if !written {
            if work == DiskWork::Offload {
                // A write-through copy failed: the object stays in memory, demoted if evicted.
                Counters::add(&counters.offloads_failed, 1);
                return false;
            }
            Counters::add(&counters.demotions_failed, 1);
            if Self::is_evictable(meta, now) {
                if let Some(meta) = self.take_object(&mut shard, key) {
                    self.count_evicted(&meta);
                }
            }
            return false;
        }
        let at = DiskLocation { tier, generation };
        meta.set_disk(self.disk_copy(key, meta.size, at));
        if work == DiskWork::Offload {
            self.journal_commit(key, meta, now);
            Counters::add(&counters.offloads_committed, 1);
            return true;
        }
        let bytes = self.release_memory(key, meta, now);
        Counters::add(&counters.demotions_committed, 1);
        Counters::add(&counters.evicted_bytes, bytes);
        true
    }

    /// Frees the memory replicas of `key`, which has a committed disk copy (`meta.disk`):
    /// the object stays, on disk only. Returns the bytes freed. Journaled before the memory
    /// is let go (the ranges then wait at the free gate until it is durable): a restarted
    /// master finds the value on disk, never over reused ranges; readers holding a lease on
    /// a memory replica keep it until the lease ends.
    pub(super) fn release_memory(&self, key: &str, meta: &mut ObjectMeta, now: Instant) -> u64 {
        let until = meta.lease_deadline().unwrap_or(now);
        let memory = meta.take_allocations();
        self.journal_commit(key, meta, now);
        let bytes = memory.iter().map(|range| range.get().size()).sum();
        self.deferred.hold_until(until, now, memory);
        bytes
    }

    /// The owner lost its record of `key` at `generation`: the master forgets that replica.
    fn forget_lost(&self, owner: ClientId, key: &str, generation: u64, now: Instant) {
        let Some(tier) = self.disks.tier_of(owner) else {
            return;
        };
        let mut shard = self.objects.shard(key);
        let Some(meta) = shard.get_mut(key) else {
            return;
        };
        if meta.disk_at() == Some(DiskLocation { tier, generation }) {
            meta.take_disk();
            Counters::add(&self.counters.disk_replicas_lost, 1);
            tracing::warn!(key, %owner, "disk replica lost; the master forgets it");
            self.drop_if_unreadable(&mut shard, key, now);
        }
    }

    /// Ends promotion `demotion` of `key` (`meta`, its disk copy unchanged: the caller
    /// checked the task and generation): with the range `written`, it becomes the object's
    /// memory replica (journaled); otherwise, or when the object is no longer on disk only,
    /// the range is freed (the owner is done with it). Returns whether it was taken.
    fn end_promotion(
        &self,
        key: &str,
        meta: &mut ObjectMeta,
        promotion: Demotion,
        written: bool,
        now: Instant,
    ) -> bool {
        // The record read is the object's, and the range is still in its segment's current
        // mount (a remount drops it).
        let record = meta.disk_at().map(|at| at.generation);
        let place = self.segments.place_of(promotion.segment);
        let place = place.filter(|place| {
            let address = place.base.saturating_add(promotion.range.offset());
            (address, place.epoch) == (promotion.buffer.buffer_address, promotion.buffer.epoch)
        });
        let usable = meta.replicas.is_empty()
            && record == Some(promotion.generation)
            && promotion.range.is_live();
        let (true, true, Some(place)) = (written, usable, place) else {
            Counters::add(&self.counters.promotions_failed, 1);
            return false;
        };
        meta.replicas.push(super::objects::Replica {
            id: self.next_replica_id.next(),
            place,
            range: super::objects::Range::from_shared(promotion.range),
        });
        self.journal_commit(key, meta, now);
        Counters::add(&self.counters.promotions_committed, 1);
        true
    }

    /// Counts a read of `key` (`meta`) that found it on disk only; the read that reaches
    /// `promotion_admission_threshold` (with `promotion_on_hit`) queues its promotion: a range
    /// of the owner's segment, filled from the record by the owner. Nothing happens when the
    /// owner's segment has no room or its tier has its fill of tasks (counted as skipped).
    pub(super) fn count_disk_hit(&self, key: &str, meta: &mut ObjectMeta) {
        if !self.config.promotion_on_hit || !meta.replicas.is_empty() || meta.demoting().is_some() {
            return;
        }
        let Some(copy) = meta.disk_mut() else {
            return;
        };
        copy.hits = copy.hits.saturating_add(1);
        if copy.hits < self.config.promotion_admission_threshold.max(1) {
            return;
        }
        copy.hits = 0;
        let at = copy.at;
        let started = self.disks.resolve(at.tier).and_then(|(owner, _)| {
            let placed = self.segments.place_at_owner(owner, meta.size)?;
            let buffer = placed.buffer(meta.size);
            let target = (placed.place.segment, &buffer, Arc::new(placed.allocation));
            self.disks
                .start_promotion(owner, (key, at.generation), target)
        });
        match started {
            Some(task) => {
                meta.set_demoting(Some(task));
                Counters::add(&self.counters.promotions_started, 1);
            }
            None => Counters::add(&self.counters.promotions_skipped, 1),
        }
    }

    /// Starts the write-through copy of `key`, just written, to its owner's tier
    /// (`offload_at_put`); a tier that is busy or has no room skips it (counted): the
    /// object is demoted when evicted, as without write-through.
    pub(super) fn start_offload(&self, shard: &mut Shard, key: &str) {
        match self.start_demotion(shard, key, DiskWork::Offload) {
            Demote::Started(_) => Counters::add(&self.counters.offloads_started, 1),
            Demote::NoTier => {}
            Demote::Full | Demote::Trimming | Demote::Busy => {
                Counters::add(&self.counters.offloads_skipped, 1)
            }
        }
    }

    /// Starts demoting the object `key` (evictable, or just written for a write-through copy:
    /// `work` is [`DiskWork::Demote`] or [`DiskWork::Offload`]) to the disk tier of the owner
    /// of its first readable replica, if it has one with room; says what happened.
    pub(super) fn start_demotion(&self, shard: &mut Shard, key: &str, work: DiskWork) -> Demote {
        let Some(meta) = shard.get_mut(key) else {
            return Demote::NoTier;
        };
        let Some(segment) = meta.readable().first().map(|r| r.segment()) else {
            return Demote::NoTier;
        };
        let Some(owner) = self.segments.owner_of(segment) else {
            return Demote::NoTier;
        };
        let Some((segment, buffer, range)) = meta.share_first_readable() else {
            return Demote::NoTier;
        };
        let generation = meta.write.0;
        let source = (segment, &buffer, range);
        let outcome = self
            .disks
            .start_demotion(owner, (key, generation), source, work);
        let demoting = work == DiskWork::Demote;
        match outcome {
            Demote::Started(task) => {
                meta.set_demoting(Some(task));
                if demoting {
                    Counters::add(&self.counters.demotions_started, 1);
                }
            }
            Demote::Full if demoting => Counters::add(&self.counters.demotions_skipped, 1),
            Demote::Full | Demote::NoTier | Demote::Busy | Demote::Trimming => {}
        }
        if !matches!(outcome, Demote::Started(_)) {
            meta.reclaim_ranges();
        }
        outcome
    }

    /// Evicts the oldest objects of the tiers above their high watermark or short of room
    /// for a demotion (see [`super::disk_tiers::DiskTiers::over_watermark`]), skipping those
    /// leased, pinned, hard-pinned, being written or demoted, or still in memory.
    pub(super) fn trim_disk_tiers(&self, now: Instant) {
        for (tier, excess) in self.disks.over_watermark(now) {
            let (mut freed, mut leased) = (0, false);
            for candidate in self.disks.oldest(tier, TRIM_SCAN) {
                if freed >= excess {
                    break;
                }
                match self.evict_from_disk(tier, &candidate.key, candidate.generation, now) {
                    DiskEviction::Evicted => {
                        freed += record_bytes(candidate.size);
                        Counters::add(&self.counters.disk_evicted_objects, 1);
                        Counters::add(&self.counters.disk_evicted_bytes, candidate.size);
                    }
                    DiskEviction::Leased => leased = true,
                    DiskEviction::Kept => {}
                }
            }
            // Leases end by themselves: a tier short only of them waits a little.
            self.disks.trimmed(tier, freed > 0, leased, now);
        }
    }

    /// Drops `key`'s record on `tier` at `generation` if nothing reads or writes the object:
    /// with the object when that record is its only replica (the record is deleted once the
    /// removal's deferral ends, like any removed value's), else the disk copy alone (a
    /// write-through copy of an object still in memory); says what it did.
    fn evict_from_disk(
        &self,
        tier: Uuid,
        key: &str,
        generation: u64,
        now: Instant,
    ) -> DiskEviction {
        let mut shard = self.objects.shard(key);
        let Some(meta) = shard.get(key) else {
            return DiskEviction::Kept;
        };
        // In memory too (a write-through copy or a promotion): only the disk copy goes, also
        // of a hard-pinned object (the pin keeps its memory). Replicas that are not readable
        // (a segment waiting to be re-attached) keep the copy: it may be all that is left.
        let in_memory = meta.is_readable_in_memory();
        let evictable = meta.disk_at() == Some(DiskLocation { tier, generation })
            && meta.write_started().is_none()
            && (in_memory || (meta.replicas.is_empty() && !meta.hard_pinned))
            && meta.pins == 0
            && meta.demoting().is_none();
        if !evictable {
            return DiskEviction::Kept;
        }
        if meta.has_lease(now) {
            return DiskEviction::Leased;
        }
        if let Some(meta) = shard.get_mut(key).filter(|_| in_memory) {
            if let Some(copy) = meta.take_disk() {
                self.deferred.hold_disk_until(now, now, copy.hold);
            }
            self.journal_commit(key, meta, now);
            return DiskEviction::Evicted;
        }
        if let Some(mut meta) = self.take_object(&mut shard, key) {
            self.retire(&mut meta, now);
        }
        DiskEviction::Evicted
    }

    /// Gives up demotions not reported in time: their objects become evictable again.
    pub(super) fn expire_demotions(&self, now: Instant) {
        let expired = self.disks.expire_demotions(now);
        Counters::add(&self.counters.demotions_expired, expired.len() as u64);
        self.give_up_demotions(expired);
    }

    /// Ends `demotions` without a record: their objects stay in memory, evictable again.
    fn give_up_demotions(&self, demotions: Vec<Demotion>) {
        let now = Instant::now();
        for demotion in demotions {
            // A demotion's handle on its source goes now: the replica it copied owns its
            // range again (below).
            let promotion = demotion.work == DiskWork::Promote;
            let range = Some(demotion.range).filter(|_| promotion);
            let mut shard = self.objects.shard(&demotion.key);
            if let Some(meta) = shard.get_mut(&demotion.key) {
                if meta.demoting() == Some(demotion.task) {
                    meta.set_demoting(None);
                }
                meta.reclaim_ranges();
            }
            drop(shard);
            if let Some(range) = range {
                // Its owner may still be filling the range: reused only after the quarantine.
                let quiet = crate::spin::deadline(now, self.config.write_quarantine());
                let range = super::objects::Range::Shared(range);
                self.deferred.hold_until(quiet, now, vec![range]);
            }
        }
    }

    /// `client`'s SSD tier closes (a teardown, or the client expired): it waits for the owner
    /// to come back (a restart on the same directory) for `reattach_grace_ms`, as a recovered
    /// segment would; its objects stay, unreadable meanwhile; its demotions are given up.
    pub(super) fn close_disk_tier(&self, client: ClientId) {
        let grace = Duration::from_millis(self.config.reattach_grace_ms);
        let until = crate::spin::deadline(Instant::now(), grace);
        let dropped = self.disks.unmount(client, until);
        self.give_up_demotions(dropped);
    }

    /// A disk copy of `key` (`size` bytes) at `at`, with its hold on the record.
    fn disk_copy(&self, key: &str, size: u64, at: DiskLocation) -> DiskCopyRef {
        DiskCopyRef {
            at,
            hold: self.disks.hold(key, size, at.tier, at.generation),
            mount: self.disks.mount_number(at.tier),
            hits: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fast_config, grant, one, setup};
    use super::super::MasterApi;
    use crate::error::ErrorCode;
    use crate::types::{DiskMount, DiskMountPage, DiskObject, DiskReport, DiskTask, Uuid};
    use std::time::{Duration, Instant};

    const SIZE: u64 = 256 << 10;

    /// The first page of the owner's mount attempt `attempt`.
    fn first_page(attempt: u64, last: bool, held: Vec<DiskObject>) -> DiskMountPage {
        DiskMountPage {
            first: true,
            mount: 0,
            attempt,
            last,
            held,
        }
    }

    /// A later page of mount `mount`.
    fn next_page(mount: u64, last: bool, held: Vec<DiskObject>) -> DiskMountPage {
        DiskMountPage {
            first: false,
            mount,
            attempt: 0,
            last,
            held,
        }
    }

    fn tier() -> DiskMount {
        DiskMount {
            disk: Uuid::random(),
            endpoint: "127.0.0.1:1".into(),
            capacity: u64::MAX,
            used: 0,
        }
    }

    /// Mounts `mount` for `owner` empty, then puts 8 values of [`SIZE`] into its 1 MiB
    /// segment, demoting what eviction hands over; returns the keys on disk (at least 3).
    fn fill_tier(
        master: &super::MasterService,
        owner: crate::types::ClientId,
        mount: &DiskMount,
    ) -> Vec<String> {
        let mount = mount.clone();
        let first = master.mount_disk(owner, mount, first_page(1, true, Vec::new()));
        assert_eq!(first.map(|a| a.kept), Ok(Vec::new()));
        for i in 0..8 {
            let key = format!("k{i}");
            put_demoting(master, owner, key);
        }
        let disk = demote_all(master, owner, 0);
        let on_disk: Vec<String> = (0..8)
            .map(|i| format!("k{i}"))
            .filter(|k| {
                let answer = one(master.batch_get_replica_list(vec![k.clone()]));
                answer.is_ok_and(|q| q.replicas.iter().any(|r| r.disk.is_some()))
            })
            .collect();
        assert!(
            on_disk.len() >= 3,
            "on disk: {on_disk:?} ({} reported)",
            disk.len()
        );
        on_disk
    }

    /// A master whose one client has a 1 MiB segment and a mounted tier of unlimited size,
    /// filled by [`fill_tier`]: (master, owner, the tier, the keys on disk).
    fn filled_tier() -> (
        std::sync::Arc<super::MasterService>,
        crate::types::ClientId,
        DiskMount,
        Vec<String>,
    ) {
        let (master, owner, _) = setup(fast_config(), 1 << 20);
        let mount = tier();
        let on_disk = fill_tier(&master, owner, &mount);
        (master, owner, mount, on_disk)
    }

    /// Puts `key` ([`SIZE`] bytes), demoting what eviction hands over while the segment is
    /// full (bounded).
    fn put_demoting(master: &super::MasterService, owner: crate::types::ClientId, key: String) {
        let until = Instant::now() + Duration::from_secs(10);
        let written = loop {
            match grant(master, owner, &key, SIZE) {
                Err(ErrorCode::NoAvailableHandle) if Instant::now() < until => {
                    demote_all(master, owner, 1);
                }
                other => break other,
            }
        };
        let token = written.expect("granted").token;
        one(master.batch_put_end(owner, vec![key], vec![token])).unwrap();
    }

    fn listed(key: &str, generation: u64) -> DiskObject {
        DiskObject {
            key: key.into(),
            generation,
            size: SIZE,
        }
    }

    /// Demotes every task the owner gets until `keys` objects are on disk; returns them.
    fn demote_all(
        master: &super::MasterService,
        owner: crate::types::ClientId,
        keys: usize,
    ) -> Vec<DiskObject> {
        let mut on_disk = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while on_disk.len() < keys && Instant::now() < until {
            for task in master.disk_tasks(owner).unwrap() {
                if let DiskTask::Demote {
                    task,
                    key,
                    generation,
                    ..
                } = task
                {
                    let report = vec![DiskReport::Demoted {
                        task,
                        key: key.clone(),
                        generation,
                        written: true,
                    }];
                    if master.disk_report(owner, report).unwrap() == vec![true] {
                        on_disk.push(DiskObject {
                            key,
                            generation,
                            size: SIZE,
                        });
                    }
                }
            }
        }
        on_disk
    }

    /// Which of `key`'s replicas, in the master's order, are on disk.
    fn replicas(master: &super::MasterService, key: &str) -> crate::error::Result<Vec<bool>> {
        let answer = one(master.batch_get_replica_list(vec![key.into()]));
        answer.map(|q| q.replicas.iter().map(|r| r.disk.is_some()).collect())
    }

    /// The write-through copy tasks queued by the writes' ends: (task, key, generation).
    fn copies(
        master: &super::MasterService,
        owner: crate::types::ClientId,
    ) -> Vec<(u64, String, u64)> {
        let tasks = master.disk_tasks(owner).unwrap();
        tasks
            .into_iter()
            .filter_map(|task| match task {
                DiskTask::Demote {
                    task,
                    key,
                    generation,
                    ..
                } => Some((task, key, generation)),
                DiskTask::Delete { .. } | DiskTask::Promote { .. } => None,
            })
            .collect()
    }

    /// Write-through (`offload_at_put`): a write's end queues a copy to its owner's tier;
    /// a committed copy leaves the object in memory and on disk (memory listed first), a
    /// failed one in memory only; evicting an object with a copy frees its memory without a
    /// demotion; trimming the copy of an object in memory keeps the object; a journaled
    /// master restarts with both.
    #[test]
    fn write_through_keeps_memory_and_disk_and_eviction_frees_only_memory() {
        let journal = crate::test_util::TempDir::new("write-through");
        // Eviction only when a write finds no room (not above a watermark in the background).
        let config = super::super::MasterConfig {
            offload_at_put: true,
            eviction_high_watermark_ratio: 1.0,
            ..fast_config()
        };
        let options = super::super::JournalOptions::new(journal.path());
        let master = super::MasterService::open(config.clone(), options.clone()).unwrap();
        let owner = Uuid::random();
        let seg = super::super::tests::segment("h1", 1 << 20);
        master.mount_segment(owner, seg.clone()).unwrap();
        let mount = tier();
        let first = master.mount_disk(owner, mount.clone(), first_page(1, true, Vec::new()));
        assert!(first.is_ok());
        // Four values fill the 1 MiB segment; the copies of a and d are written, b's fails,
        // c's is not reported yet.
        for key in ["a", "b", "c", "d"] {
            let token = grant(&master, owner, key, SIZE).unwrap().token;
            one(master.batch_put_end(owner, vec![key.into()], vec![token])).unwrap();
        }
        let queued = copies(&master, owner);
        let keys: Vec<&str> = queued.iter().map(|(_, key, _)| key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c", "d"]);
        let report = |keys: &[&str], written: bool| {
            let tasks = queued.iter().filter(|(_, k, _)| keys.contains(&k.as_str()));
            let reports = tasks
                .map(|(task, key, generation)| DiskReport::Demoted {
                    task: *task,
                    key: key.clone(),
                    generation: *generation,
                    written,
                })
                .collect();
            master.disk_report(owner, reports).unwrap()
        };
        assert_eq!(report(&["a", "d"], true), vec![true, true]);
        assert_eq!(report(&["b"], false), vec![false]);
        assert_eq!(
            replicas(&master, "a"),
            Ok(vec![false, true]),
            "memory, then disk"
        );
        assert_eq!(
            replicas(&master, "b"),
            Ok(vec![false]),
            "a failed copy: memory only"
        );
        let disk = master.metrics().disk;
        let counted = (
            disk.offloads_started,
            disk.offloads_committed,
            disk.offloads_failed,
        );
        assert_eq!(counted, (4, 2, 1));
        assert_eq!(disk.demotions_started, 0);
        // A restart on the journal lists a with its memory replica and its disk copy.
        drop(master);
        let master = super::MasterService::open(config, options).unwrap();
        assert_eq!(
            master.reattach_segment(owner, seg.epoch, seg.clone()),
            Ok(true)
        );
        let token = |master: &super::MasterService, key: &str| {
            super::super::tests::current_token(master, key).0
        };
        let held = vec![
            listed("a", token(&master, "a")),
            listed("d", token(&master, "d")),
        ];
        let remounted = master.mount_disk(owner, mount.clone(), first_page(2, true, held));
        assert_eq!(remounted.map(|m| m.kept), Ok(vec![true, true]));
        assert_eq!(
            replicas(&master, "a"),
            Ok(vec![false, true]),
            "both after the restart"
        );
        // The segment is full: the eviction a new write asks for frees d's memory (the least
        // recently read) with no demotion, and d reads from disk.
        for key in ["b", "c"] {
            assert!(replicas(&master, key).is_ok());
        }
        std::thread::sleep(Duration::from_millis(60)); // the read leases end
        let until = Instant::now() + Duration::from_secs(10);
        let e = loop {
            match grant(&master, owner, "e", SIZE) {
                Err(ErrorCode::NoAvailableHandle) if Instant::now() < until => {
                    master.eviction_tick();
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other.unwrap(),
            }
        };
        assert_eq!(master.metrics().disk.memory_released, 1);
        assert_eq!(master.metrics().disk.demotions_started, 0);
        assert_eq!(replicas(&master, "d"), Ok(vec![true]), "on disk only");
        one(master.batch_put_end(owner, vec!["e".into()], vec![e.token])).unwrap();
        // Trimming a's copy (a is in memory) keeps a, in memory only, and deletes the record.
        std::thread::sleep(Duration::from_millis(60)); // a's read lease ends
        let a = token(&master, "a");
        let trimmed = master.evict_from_disk(mount.disk, "a", a, Instant::now());
        assert!(matches!(trimmed, super::DiskEviction::Evicted));
        assert_eq!(replicas(&master, "a"), Ok(vec![false]));
        let until = Instant::now() + Duration::from_secs(10);
        let mut deleted = false;
        while !deleted && Instant::now() < until {
            master.eviction_tick();
            let tasks = master.disk_tasks(owner).unwrap();
            deleted = tasks
                .iter()
                .any(|t| matches!(t, DiskTask::Delete { key, .. } if key == "a"));
        }
        assert!(deleted, "a's record is deleted");
    }

    /// Promotion on hit: the second read of an object on disk only queues a task that loads
    /// its record into a new range of its owner's segment; once reported, the object is in
    /// memory (listed first) and on disk; a failed load frees the range and leaves it on
    /// disk only; a read of an object in memory counts nothing.
    #[test]
    fn a_second_read_promotes_a_disk_object_back_into_memory() {
        let config = super::super::MasterConfig {
            promotion_on_hit: true,
            ..fast_config()
        };
        let (master, owner, _) = setup(config, 1 << 20);
        let on_disk = fill_tier(&master, owner, &tier());
        // Room in the segment: the objects still in memory go.
        let in_memory: Vec<String> = (0..8)
            .map(|i| format!("k{i}"))
            .filter(|k| !on_disk.contains(k))
            .collect();
        for key in &in_memory {
            one(master.batch_remove(vec![key.clone()], true)).unwrap();
        }
        let until = Instant::now() + Duration::from_secs(10);
        while master.metrics().bytes_used > 0 && Instant::now() < until {
            master.eviction_tick();
            std::thread::sleep(Duration::from_millis(5));
        }
        // fill_tier read each key once: the next read is the second.
        let promote = |key: &str| {
            assert_eq!(replicas(&master, key), Ok(vec![true]), "{key}: two reads");
            let tasks = master.disk_tasks(owner).unwrap();
            match tasks.as_slice() {
                [DiskTask::Promote {
                    task,
                    key: named,
                    generation,
                    replica,
                }] => {
                    assert_eq!(named, key);
                    assert_eq!(replica.size, SIZE);
                    (*task, *generation)
                }
                other => panic!("{key}: {other:?}"),
            }
        };
        // Promotes `key` and reports the load as `written`; the master's answer.
        let load = |key: &String, written: bool| {
            let (task, generation) = promote(key);
            let key = key.clone();
            let report = DiskReport::Demoted {
                task,
                key,
                generation,
                written,
            };
            master.disk_report(owner, vec![report])
        };
        let (a, b) = (&on_disk[0], &on_disk[1]);
        assert_eq!(load(a, true), Ok(vec![true]));
        assert_eq!(
            replicas(&master, a),
            Ok(vec![false, true]),
            "memory, then disk"
        );
        assert_eq!(master.metrics().bytes_used, SIZE);
        // In memory now: reads count nothing.
        for _ in 0..3 {
            assert!(replicas(&master, a).is_ok());
        }
        assert!(master.disk_tasks(owner).unwrap().is_empty());
        // A load that failed: the range is freed, the object stays on disk.
        assert_eq!(load(b, false), Ok(vec![false]));
        assert_eq!(replicas(&master, b), Ok(vec![true]));
        assert_eq!(master.metrics().bytes_used, SIZE);
        let disk = master.metrics().disk;
        let counted = (
            disk.promotions_started,
            disk.promotions_committed,
            disk.promotions_failed,
        );
        assert_eq!(counted, (2, 1, 1));
    }

    /// The Demote tasks the owner gets within 10 s (eviction rounds run meanwhile), the first
    /// non-empty poll's: (task, key, generation).
    fn demotions(
        master: &super::MasterService,
        owner: crate::types::ClientId,
    ) -> Vec<(u64, String, u64)> {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            master.eviction_tick();
            let tasks = copies(master, owner);
            if !tasks.is_empty() {
                return tasks;
            }
        }
        Vec::new()
    }

    /// A demotion given up after its timeout whose object was then demoted again to the
    /// same record: the late report of the first task is refused, but the owner is told to
    /// keep the record (the second task's, accepted) instead of deleting it.
    #[test]
    fn a_late_report_of_a_timed_out_demotion_keeps_the_record_a_later_one_wrote() {
        let (master, owner, _) = setup(fast_config(), 1 << 20);
        let first = master.mount_disk(owner, tier(), first_page(1, true, Vec::new()));
        assert!(first.is_ok());
        for i in 0..4 {
            let key = format!("k{i}");
            let token = grant(&master, owner, &key, SIZE).unwrap().token;
            one(master.batch_put_end(owner, vec![key], vec![token])).unwrap();
        }
        let (late, key, generation) = demotions(&master, owner).remove(0);
        let timeout = super::super::disk_tiers::DEMOTION_TIMEOUT;
        master.expire_demotions(Instant::now() + timeout + Duration::from_secs(1));
        let until = Instant::now() + Duration::from_secs(10);
        let again = loop {
            let found = demotions(&master, owner)
                .into_iter()
                .find(|(_, k, _)| *k == key);
            match found {
                Some((task, _, _)) => break task,
                None => assert!(Instant::now() < until, "{key} is demoted again"),
            }
        };
        let report = |task: u64| {
            let key = key.clone();
            let written = true;
            let report = DiskReport::Demoted {
                task,
                key,
                generation,
                written,
            };
            master.disk_report(owner, vec![report]).unwrap()
        };
        assert_eq!(report(again), vec![true]);
        assert_eq!(report(late), vec![true], "the record is the object's: kept");
        assert_eq!(replicas(&master, &key), Ok(vec![true]));
    }

    /// A mount in pages keeps what its pages confirm and forgets the copies none confirmed;
    /// a page that is not first needs a mount in progress.
    #[test]
    fn a_paged_mount_keeps_what_its_pages_confirm() {
        let (master, owner, mount, on_disk) = filled_tier();
        let generation = |key: &str| super::super::tests::current_token(&master, key).0;
        let (a, b, c) = (&on_disk[0], &on_disk[1], &on_disk[2]);
        // A page that is not first from another client: no mount in progress.
        let stranger = master.mount_disk(Uuid::random(), mount.clone(), next_page(1, true, vec![]));
        assert_eq!(stranger, Err(ErrorCode::ClientNotFound));
        // Two pages: a and b confirmed, a bogus record refused; c was not reported.
        let page_one = vec![listed(a, generation(a))];
        let page_two = vec![listed(b, generation(b)), listed("nobody", 1)];
        let started = master.mount_disk(owner, mount.clone(), first_page(2, false, page_one));
        let started = started.unwrap();
        assert_eq!(started.kept, vec![true]);
        let ended = master.mount_disk(owner, mount, next_page(started.mount, true, page_two));
        assert_eq!(ended.map(|a| a.kept), Ok(vec![true, false]));
        for (key, kept) in [(a, true), (b, true), (c, false)] {
            let answer = one(master.batch_get_replica_list(vec![key.clone()]));
            match kept {
                true => assert!(answer.is_ok_and(|q| q.replicas[0].disk.is_some()), "{key}"),
                false => assert_eq!(answer.map(|_| ()), Err(ErrorCode::ObjectNotFound), "{key}"),
            }
        }
    }

    /// A mount keeps a record whose object is gone while a pin still holds it (the pinned
    /// reader reads it later), and deletes it once the pin goes; pages of an older mount or
    /// attempt never apply to a later one.
    #[test]
    fn a_mount_keeps_what_a_reader_holds_and_refuses_stale_pages() {
        let (master, owner, mount, on_disk) = filled_tier();
        let generation = |key: &str| super::super::tests::current_token(&master, key).0;
        let (a, b) = (on_disk[0].clone(), on_disk[1].clone());
        let (gen_a, gen_b) = (generation(&a), generation(&b));
        let pinned = one(master.batch_pin(owner, vec![a.clone()])).unwrap();
        assert!(pinned.query.replicas[0].disk.is_some(), "pinned on disk");
        one(master.batch_remove(vec![a.clone()], true)).unwrap();
        // The owner goes away and comes back (a restart on its directory, or an expiry).
        master.unmount_disk(owner).unwrap();
        let held = vec![listed(&a, gen_a), listed(&b, gen_b)];
        let remount = master.mount_disk(owner, mount.clone(), first_page(2, true, held));
        let remount = remount.unwrap();
        assert_eq!(remount.kept, vec![true, true], "the pinned record is kept");
        // A page answered late: an older attempt, or a page of an older mount.
        let late_first = master.mount_disk(owner, mount.clone(), first_page(1, true, vec![]));
        assert_eq!(late_first.map(|a| a.mount), Err(ErrorCode::TryAgain));
        let late_page = next_page(remount.mount - 1, true, vec![]);
        let late_page = master.mount_disk(owner, mount.clone(), late_page);
        assert_eq!(late_page.map(|a| a.mount), Err(ErrorCode::TryAgain));
        let b_answer = one(master.batch_get_replica_list(vec![b.clone()]));
        assert!(
            b_answer.is_ok_and(|q| q.replicas[0].disk.is_some()),
            "b kept"
        );
        // The pin goes: the record's deletion is queued to the owner.
        master.unpin(owner, vec![pinned.pin_id]).unwrap();
        let deletion = DiskTask::Delete {
            key: a.clone(),
            generation: gen_a,
        };
        let until = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        while !tasks.contains(&deletion) && Instant::now() < until {
            tasks.extend(master.disk_tasks(owner).unwrap());
        }
        assert!(tasks.contains(&deletion), "{tasks:?}");
        // And a later mount no longer keeps it.
        let held = vec![listed(&a, gen_a)];
        let last = master.mount_disk(owner, mount, first_page(3, true, held));
        assert_eq!(last.map(|a| a.kept), Ok(vec![false]));
    }

    /// A full tier makes room by evicting its oldest unpinned objects, so eviction keeps
    /// demoting instead of dropping; a pinned record stays.
    #[test]
    fn a_full_tier_evicts_its_oldest_unpinned_objects() {
        let (master, owner, _) = setup(fast_config(), 1 << 20);
        let mount = DiskMount {
            capacity: 3 * super::record_bytes(SIZE),
            ..tier()
        };
        let on_disk = fill_tier(&master, owner, &mount);
        let generation = |key: &str| super::super::tests::current_token(&master, key).0;
        let on_disk_now = |key: &str| {
            let answer = one(master.batch_get_replica_list(vec![key.to_string()]));
            answer.is_ok_and(|q| q.replicas.iter().any(|r| r.disk.is_some()))
        };
        let evicted = master.metrics().disk.disk_evicted_objects;
        assert!(
            evicted >= 1,
            "evicted from disk: {evicted}, on disk: {on_disk:?}"
        );
        assert_eq!(master.metrics().disk.demotions_skipped, 0);
        // Ages are write order: the first value demoted went first.
        assert!(!on_disk.contains(&"k0".to_string()), "{on_disk:?}");
        // Pin the oldest on disk, then push more through: it stays, the others go.
        let oldest = on_disk[0].clone();
        let pinned = one(master.batch_pin(owner, vec![oldest.clone()])).unwrap();
        let gen_oldest = generation(&oldest);
        for i in 8..16 {
            let key = format!("k{i}");
            put_demoting(&master, owner, key);
        }
        demote_all(&master, owner, 0);
        assert!(on_disk_now(&oldest), "the pinned object stays on disk");
        assert_eq!(generation(&oldest), gen_oldest);
        assert!(!on_disk_now(&on_disk[1]), "an unpinned older one went");
        master.unpin(owner, vec![pinned.pin_id]).unwrap();
    }

    /// The last page of a mount that a later mount replaced after the page passed its check
    /// (the page's processing raced the owner's retry) forgets nothing: neither what the
    /// later mount confirmed nor what it has yet to confirm.
    #[test]
    fn a_replaced_mount_ends_without_forgetting() {
        let (master, owner, mount, on_disk) = filled_tier();
        let generation = |key: &str| super::super::tests::current_token(&master, key).0;
        let (a, b) = (on_disk[0].clone(), on_disk[1].clone());
        let older = master.mount_disk(owner, mount.clone(), first_page(2, false, vec![]));
        let older = older.unwrap().mount;
        // The retry: its first page confirms a; b is on a page still to come.
        let held = vec![listed(&a, generation(&a))];
        let newer = master.mount_disk(owner, mount.clone(), first_page(3, false, held));
        assert_eq!(newer.map(|a| a.kept), Ok(vec![true]));
        // The older mount's last page, processed now.
        assert!(!master.end_mount(mount.disk, older), "replaced: not ended");
        for key in [&a, &b] {
            let answer = one(master.batch_get_replica_list(vec![key.clone()]));
            assert!(
                answer.is_ok_and(|q| q.replicas[0].disk.is_some()),
                "{key} kept"
            );
        }
    }

    /// A client the master expired (or never knew) cannot mount a tier: registering it there
    /// would answer its next ping `Ok`, and it would never remount its segment.
    #[test]
    fn an_unknown_client_mounts_no_tier_and_still_hears_it_must_remount() {
        let (master, _, _) = setup(fast_config(), 1 << 20);
        let stranger = Uuid::random();
        let answer = master.mount_disk(stranger, tier(), first_page(1, true, Vec::new()));
        assert_eq!(answer, Err(ErrorCode::ClientNotFound));
        let ping = master.ping(stranger).unwrap();
        assert_eq!(ping.status, crate::types::ClientStatus::NeedRemount);
    }
}
