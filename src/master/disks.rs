//! The SSD tier at the master (`docs/ssd-tier.md`): owners mount their disk tiers and say
//! what they hold, eviction demotes objects to their owner's tier instead of dropping them,
//! owners report committed records (the memory replica is then released) and lost ones (the
//! master forgets them), and removals queue the deletion of the disk copy.
//!
//! Who knows what a tier holds: the master of the view an owner mounted under knows exactly
//! (everything it listed there went through it); a master of another view without a journal
//! knows nothing and adopts what the owner reports; a journaled master does not journal disk
//! copies (a demotion journals the value's removal), so after its restart the owner drops its
//! records. Locks: one object shard at a time, then the tier registry (`service.rs` order).

use super::disk_tiers::Demotion;
use super::metrics::Counters;
use super::objects::{DiskLocation, ObjectMeta, Shard};
use super::service::MasterService;
use crate::error::Result;
use crate::types::{
    ClientId, DeploymentMode, DiskMount, DiskMountAnswer, DiskObject, DiskReport, DiskTask,
    ReplicateConfig, Uuid, WriteToken,
};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long an owner's poll for disk work waits when none is queued.
pub(super) const DISK_POLL: Duration = Duration::from_millis(100);

impl MasterService {
    /// [`super::MasterApi::mount_disk`].
    pub(super) fn mount_disk_tier(
        &self,
        client: ClientId,
        mount: DiskMount,
        held: Vec<DiskObject>,
    ) -> Result<DiskMountAnswer> {
        self.require_mode(DeploymentMode::Centralized)?;
        self.clients.register(client, Instant::now());
        let view = self.view_version.load(Ordering::Acquire);
        let adopt = mount.view_version != view && self.journal.is_none();
        let tier = mount.disk;
        self.disks.mount(client, &mount);
        let now = Instant::now();
        let kept: Vec<bool> = held
            .iter()
            .map(|object| self.reconcile_held(client, tier, object, adopt, now))
            .collect();
        let listed: HashSet<(&str, u64)> = held
            .iter()
            .zip(&kept)
            .filter(|(_, kept)| **kept)
            .map(|(o, _)| (o.key.as_str(), o.generation))
            .collect();
        self.forget_unlisted(tier, |key, generation| listed.contains(&(key, generation)));
        let adopted = if adopt {
            kept.iter().filter(|k| **k).count()
        } else {
            0
        };
        let dropped = kept.iter().filter(|k| !**k).count();
        Counters::add(&self.counters.disk_objects_adopted, adopted as u64);
        Counters::add(&self.counters.disk_objects_refused, dropped as u64);
        tracing::info!(%client, held = held.len(), adopted, dropped, "disk tier mounted");
        Ok(DiskMountAnswer {
            view_version: view,
            kept,
        })
    }

    /// Whether `client`, mounting `tier`, keeps `object` of it: the master lists it there,
    /// or adopts it (`adopt`, the key is unknown).
    fn reconcile_held(
        &self,
        client: ClientId,
        tier: Uuid,
        object: &DiskObject,
        adopt: bool,
        now: Instant,
    ) -> bool {
        if object.key.is_empty() || object.size == 0 {
            return false;
        }
        let mut shard = self.objects.shard(&object.key);
        let listed = DiskLocation {
            tier,
            generation: object.generation,
        };
        match shard.get(&object.key) {
            Some(meta) => meta.disk == Some(listed) && meta.size == object.size,
            None if adopt => {
                self.next_write
                    .fetch_max(object.generation.saturating_add(1), Ordering::AcqRel);
                let mut meta = ObjectMeta::new(
                    WriteToken(object.generation),
                    object.size,
                    client,
                    Vec::new(),
                    &ReplicateConfig::default(),
                    Duration::ZERO,
                    now,
                );
                meta.complete(now);
                meta.disk = Some(listed);
                shard.insert(object.key.clone(), meta);
                true
            }
            None => false,
        }
    }

    /// Drops the disk copies the master lists on `tier` that `keep` refuses (the owner lacks
    /// them, or the tier is given up); objects left with no replica disappear.
    pub(super) fn forget_unlisted(&self, tier: Uuid, keep: impl Fn(&str, u64) -> bool) {
        let now = Instant::now();
        for mut shard in self.objects.shards() {
            let lost: Vec<String> = shard
                .iter_mut()
                .filter_map(|(key, meta)| {
                    let location = meta.disk.filter(|d| d.tier == tier)?;
                    let gone = !keep(key, location.generation);
                    gone.then(|| {
                        meta.disk = None;
                        key.clone()
                    })
                })
                .collect();
            for key in lost {
                self.drop_if_unreadable(&mut shard, &key, now);
            }
        }
    }

    /// Takes `key` out of the table if it has no replica left.
    fn drop_if_unreadable(&self, shard: &mut Shard, key: &str, now: Instant) {
        let empty = shard
            .get(key)
            .is_some_and(|meta| meta.replicas.is_empty() && meta.disk.is_none());
        if empty {
            if let Some(mut meta) = self.take_object(shard, key) {
                self.retire(&mut meta, now);
            }
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
                DiskReport::Demoted { task, written } => {
                    match self.disks.finish_demotion(client, task, written) {
                        Some(demotion) => self.end_demotion(demotion, task, written, now),
                        None => {
                            Counters::add(&self.counters.demotions_refused, 1);
                            false
                        }
                    }
                }
                DiskReport::Lost { key, generation } => {
                    self.forget_lost(client, &key, generation, now);
                    true
                }
            })
            .collect())
    }

    /// Ends demotion `task`: with its record `written`, the object moves to disk (its memory
    /// replicas are released once their read lease ends); without, the object is evicted as
    /// it would have been without a tier. Returns whether the record is accepted.
    fn end_demotion(&self, demotion: Demotion, task: u64, written: bool, now: Instant) -> bool {
        let key = demotion.key.as_str();
        let mut shard = self.objects.shard(key);
        let current = shard.get_mut(key).filter(|meta| {
            meta.demoting == Some(task)
                && meta.write.0 == demotion.generation
                && meta.write_started().is_none()
        });
        let Some(meta) = current else {
            drop(shard);
            Counters::add(&self.counters.demotions_refused, 1);
            if written {
                self.disks.give_back(demotion.tier, demotion.size);
            }
            return false;
        };
        meta.demoting = None;
        if !written {
            Counters::add(&self.counters.demotions_failed, 1);
            if Self::is_evictable(meta, now) {
                if let Some(meta) = self.take_object(&mut shard, key) {
                    self.count_evicted(&meta);
                }
            }
            return false;
        }
        meta.disk = Some(DiskLocation {
            tier: demotion.tier,
            generation: demotion.generation,
        });
        let until = meta.lease_deadline.unwrap_or(now);
        let memory = meta.take_allocations();
        // Journaled before the memory is let go (the ranges then wait at the free gate until
        // it is durable): a restarted master finds the value on disk, never over reused ranges.
        self.journal_commit(key, meta, now);
        let bytes = memory.iter().map(|a| a.size()).sum();
        self.deferred.hold_until(until, now, memory);
        Counters::add(&self.counters.demotions_committed, 1);
        Counters::add(&self.counters.evicted_bytes, bytes);
        true
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
        if meta.disk == Some(DiskLocation { tier, generation }) {
            meta.disk = None;
            Counters::add(&self.counters.disk_replicas_lost, 1);
            tracing::warn!(key, %owner, "disk replica lost; the master forgets it");
            self.drop_if_unreadable(&mut shard, key, now);
        }
    }

    /// Starts demoting the evictable object `key` to the disk tier of the owner of its first
    /// readable replica, if it has one with room. Returns whether a demotion started.
    pub(super) fn start_demotion(&self, shard: &mut Shard, key: &str) -> bool {
        let Some(meta) = shard.get_mut(key) else {
            return false;
        };
        let Some(replica) = meta.readable().first().copied() else {
            return false;
        };
        let Some(owner) = self.segments.owner_of(replica.segment) else {
            return false;
        };
        let range = std::sync::Arc::clone(&replica.allocation);
        let buffer = replica.buffer.clone();
        let generation = meta.write.0;
        match self
            .disks
            .start_demotion(owner, key, generation, &buffer, range)
        {
            Some((task, _)) => {
                meta.demoting = Some(task);
                Counters::add(&self.counters.demotions_started, 1);
                true
            }
            None => false,
        }
    }

    /// Gives up demotions not reported in time: their objects become evictable again.
    pub(super) fn expire_demotions(&self, now: Instant) {
        for demotion in self.disks.expire_demotions(now) {
            let mut shard = self.objects.shard(&demotion.key);
            if let Some(meta) = shard.get_mut(&demotion.key) {
                if meta.demoting == Some(demotion.task) {
                    meta.demoting = None;
                }
            }
            drop(shard);
            Counters::add(&self.counters.demotions_expired, 1);
        }
    }

    /// Queues the deletion of `meta`'s disk copy (the value is removed or superseded).
    pub(super) fn drop_disk_copy(&self, key: &str, meta: &mut ObjectMeta) {
        if let Some(location) = meta.disk.take() {
            self.disks
                .queue_delete(location.tier, key, location.generation, meta.size);
        }
    }
}
