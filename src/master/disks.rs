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

use super::disk_tiers::{record_bytes, Demote, Demotion};
use super::metrics::Counters;
use super::objects::{DiskCopyRef, DiskLocation, Shard};
use super::service::MasterService;
use crate::error::Result;
use crate::types::{ClientId, DeploymentMode, DiskMount, DiskObject, DiskReport, DiskTask, Uuid};
use std::collections::HashSet;
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
    ) -> Result<Vec<bool>> {
        self.require_mode(DeploymentMode::Centralized)?;
        self.clients.register(client, Instant::now());
        let tier = mount.disk;
        self.disks.mount(client, &mount);
        let kept: Vec<bool> = held.iter().map(|object| self.lists(tier, object)).collect();
        let listed: HashSet<(&str, u64)> = held
            .iter()
            .zip(&kept)
            .filter(|(_, kept)| **kept)
            .map(|(o, _)| (o.key.as_str(), o.generation))
            .collect();
        self.forget_unlisted(tier, |key, generation| listed.contains(&(key, generation)));
        // What the tier holds once the owner deleted what it may not keep.
        let used = held.iter().zip(&kept).filter(|(_, kept)| **kept);
        self.disks
            .set_used(tier, used.map(|(o, _)| record_bytes(o.size)).sum());
        let dropped = kept.iter().filter(|k| !**k).count();
        Counters::add(&self.counters.disk_objects_refused, dropped as u64);
        tracing::info!(%client, held = held.len(), dropped, "disk tier mounted");
        Ok(kept)
    }

    /// Whether the master lists `object` on `tier` (same key, generation and size): only then
    /// may its owner keep the record. A record the master does not know is never adopted: it
    /// may hold a value removed or overwritten since, or the bytes of a refused demotion.
    fn lists(&self, tier: Uuid, object: &DiskObject) -> bool {
        let listed = DiskLocation {
            tier,
            generation: object.generation,
        };
        let shard = self.objects.shard(&object.key);
        shard
            .get(&object.key)
            .is_some_and(|meta| meta.disk_at() == Some(listed) && meta.size == object.size)
    }

    /// Drops the disk copies the master lists on `tier` that `keep` refuses (the owner lacks
    /// them, or the tier is given up); objects left with no replica disappear.
    pub(super) fn forget_unlisted(&self, tier: Uuid, keep: impl Fn(&str, u64) -> bool) {
        let now = Instant::now();
        for mut shard in self.objects.shards() {
            let lost: Vec<String> = shard
                .iter_mut()
                .filter_map(|(key, meta)| {
                    let location = meta.disk_at().filter(|d| d.tier == tier)?;
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
        let at = DiskLocation {
            tier: demotion.tier,
            generation: demotion.generation,
        };
        meta.disk = Some(self.disk_copy(key, meta.size, at));
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
        if meta.disk_at() == Some(DiskLocation { tier, generation }) {
            meta.disk = None;
            Counters::add(&self.counters.disk_replicas_lost, 1);
            tracing::warn!(key, %owner, "disk replica lost; the master forgets it");
            self.drop_if_unreadable(&mut shard, key, now);
        }
    }

    /// Starts demoting the evictable object `key` to the disk tier of the owner of its first
    /// readable replica, if it has one with room; says what happened.
    pub(super) fn start_demotion(&self, shard: &mut Shard, key: &str) -> Demote {
        let Some(meta) = shard.get_mut(key) else {
            return Demote::NoTier;
        };
        let Some(replica) = meta.readable().first().copied() else {
            return Demote::NoTier;
        };
        let Some(owner) = self.segments.owner_of(replica.segment) else {
            return Demote::NoTier;
        };
        let range = std::sync::Arc::clone(&replica.allocation);
        let buffer = replica.buffer.clone();
        let generation = meta.write.0;
        let outcome = self
            .disks
            .start_demotion(owner, key, generation, &buffer, range);
        match outcome {
            Demote::Started(task) => {
                meta.demoting = Some(task);
                Counters::add(&self.counters.demotions_started, 1);
            }
            Demote::Full => Counters::add(&self.counters.demotions_skipped, 1),
            Demote::NoTier | Demote::Busy => {}
        }
        outcome
    }

    /// Gives up demotions not reported in time: their objects become evictable again.
    pub(super) fn expire_demotions(&self, now: Instant) {
        let expired = self.disks.expire_demotions(now);
        Counters::add(&self.counters.demotions_expired, expired.len() as u64);
        self.give_up_demotions(expired);
    }

    /// Ends `demotions` without a record: their objects stay in memory, evictable again.
    fn give_up_demotions(&self, demotions: Vec<Demotion>) {
        for demotion in demotions {
            let mut shard = self.objects.shard(&demotion.key);
            if let Some(meta) = shard.get_mut(&demotion.key) {
                if meta.demoting == Some(demotion.task) {
                    meta.demoting = None;
                }
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
        }
    }
}
