//! Background work of [`MasterService`]: deferred frees, abandoned-write reclaim and eviction
//! (every 10 ms, spec §4.6, §4.9), and client expiry (spec §4.5).
//!
//! Cost: a table scan runs only when it can find work. Reclaim scans when the oldest
//! unfinished write it saw last time can be due; eviction, above the watermark, backs off
//! exponentially (10 ms to 1 s, [`super::eviction::Backoff`]) while rounds free nothing and the
//! table's object count, used bytes and pin count stay the same; a failed allocation scans at
//! once. Scans are counted in `MasterMetrics::table_scans`.

use super::disk_tiers::{Demote, DiskWork};
use super::eviction::{self, Candidate};
use super::metrics::Counters;
use super::objects::ObjectMeta;
use super::service::{MasterService, EVICTION_PERIOD};
use crate::spin::deadline;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Longest interval between scans for abandoned writes.
const RECLAIM_PERIOD: Duration = Duration::from_secs(1);

/// How long the keys of an expired P2P owner stay reclaimable (see `route_claims`); an owner
/// gone longer drops them when it comes back.
pub(crate) const EXPIRED_CLAIM_AGE: Duration = Duration::from_secs(600);

impl MasterService {
    /// One round of the eviction thread.
    pub(super) fn eviction_tick(&self) {
        let now = Instant::now();
        self.deferred.release_due(now);
        self.reclaim_abandoned_writes(now);
        self.expire_demotions(now);
        self.trim_disk_tiers(now);
        self.evict_if_needed(now);
    }

    /// One round of the client monitor: expires clients not seen for `client_ttl`, and gives
    /// up recovered segments whose owners did not re-attach within `reattach_grace_ms`.
    /// Also forgets expired owners' route claims older than [`EXPIRED_CLAIM_AGE`].
    pub(super) fn client_tick(&self) {
        let now = Instant::now();
        let given_up = self.segments.expire_recovered(now);
        if given_up > 0 {
            tracing::warn!(
                given_up,
                "recovered segments not re-attached in time; their replicas are gone"
            );
            self.purge(None);
        }
        let expired = self.clients.expire(now, self.config.client_ttl());
        for client in expired {
            self.retire_client(client);
        }
        self.cache_leases.sweep(now);
        for tier in self.disks.expire_awaited(now) {
            tracing::warn!(%tier, "SSD tier not mounted again in time; its objects are gone");
            // Copies a mount that started meanwhile confirmed stay.
            let current = self.disks.mount_number(tier);
            self.forget_unlisted(tier, |copy| current != 0 && copy.mount == current);
        }
        if let Some(cutoff) = now.checked_sub(EXPIRED_CLAIM_AGE) {
            let forgotten = self.routes.prune_claims(cutoff);
            if forgotten > 0 {
                tracing::info!(forgotten, "forgot route claims of owners expired long ago");
            }
        }
    }

    /// Releases everything an expired `client` held: its segments, pins, P2P routes and the
    /// objects only it could serve; then ends its retirement, so a re-registration that was
    /// waiting proceeds on a clean slate.
    pub(super) fn retire_client(&self, client: crate::types::ClientId) {
        tracing::info!(%client, "client expired");
        for segment in self.segments.segments_of(client) {
            if let Err(e) = self.segments.unmount(client, segment) {
                tracing::warn!(%client, %segment, error = %e, "cannot unmount the expired client's segment");
            }
        }
        self.release_pins(self.pins.take_client(client));
        self.close_disk_tier(client);
        let keys = self.routes.drop_owner(client, Instant::now());
        if keys > 0 {
            tracing::info!(%client, keys, "dropped the expired owner's P2P routes");
        }
        self.purge(Some(client));
        Counters::add(&self.counters.clients_expired, 1);
        self.clients.retired(client);
    }

    /// Erases writes neither ended nor revoked within `put_start_release_timeout`, freeing
    /// their bytes. Scans only when the oldest write it saw could be due: a write started
    /// after a scan is due no earlier than that scan plus the timeout (and at most once per
    /// `min(timeout, 1 s)`).
    fn reclaim_abandoned_writes(&self, now: Instant) {
        let timeout = self.config.put_start_release_timeout();
        if now < *self.next_reclaim.lock() {
            return;
        }
        Counters::add(&self.counters.table_scans, 1);
        let mut next_due = deadline(now, timeout);
        self.objects.scan_in_slices(|shard, slots| {
            let mut abandoned = Vec::new();
            for (key, meta) in shard.slice(slots) {
                let Some(started) = meta.write_started() else {
                    continue;
                };
                if now.saturating_duration_since(started) >= timeout {
                    abandoned.push(key.to_string());
                } else {
                    next_due = next_due.min(deadline(started, timeout));
                }
            }
            for key in abandoned {
                if let Some(mut meta) = self.take_object(shard, &key) {
                    self.retire(&mut meta, now);
                }
            }
        });
        *self.next_reclaim.lock() = next_due.max(deadline(now, timeout.min(RECLAIM_PERIOD)));
    }

    /// Whether eviction may take `meta`: complete, mounted, not hard-pinned, unleased,
    /// unpinned, not being demoted to disk.
    pub(super) fn is_evictable(meta: &ObjectMeta, now: Instant) -> bool {
        // In-memory first: it rules out objects that are only on disk, most of a big tier.
        meta.is_readable_in_memory()
            && meta.write_started().is_none()
            && !meta.hard_pinned
            && !meta.has_lease(now)
            && meta.pins == 0
            && meta.demoting().is_none()
    }

    /// Counts `meta` as evicted.
    pub(super) fn count_evicted(&self, meta: &ObjectMeta) {
        Counters::add(&self.counters.evicted_objects, 1);
        Counters::add(&self.counters.evicted_bytes, meta.allocated_bytes());
    }

    /// Bytes in use in the mounted segments and their total. Demotions in flight free their
    /// ranges soon: they count as free already.
    fn segment_usage(&self) -> (u64, u64) {
        let (used, total) = self.segments.usage();
        (used.saturating_sub(self.disks.demoting_bytes()), total)
    }

    /// Whether the mounted segments are above the eviction high watermark (memory pressure:
    /// location-cache renewals are refused).
    pub(super) fn under_memory_pressure(&self) -> bool {
        let (used, total) = self.segment_usage();
        total > 0 && used as f64 / total as f64 > self.config.eviction_high_watermark_ratio
    }

    /// Asks for an eviction round that ends after every round run so far; `true` when this
    /// is a new request (the eviction thread should be woken), `false` when one is pending.
    pub(super) fn request_eviction(&self) -> bool {
        let wanted = self.evictions_done.load(Ordering::Acquire) + 1;
        self.eviction_wanted.fetch_max(wanted, Ordering::AcqRel) < wanted
    }

    /// Runs an eviction round if usage is above the high watermark or an allocation asked
    /// for one since the last requested round. One round at a time: a call while another
    /// round runs does nothing (what that round frees serves the requests made before it
    /// ends; an allocation that still finds no room asks again).
    fn evict_if_needed(&self, now: Instant) {
        let Some(_round) = self.eviction_round.try_lock() else {
            return;
        };
        let wanted = self.eviction_wanted.load(Ordering::Acquire);
        let requested = wanted > self.evictions_done.load(Ordering::Acquire);
        self.evict_round(now, requested);
        if requested {
            self.evictions_done.fetch_max(wanted, Ordering::AcqRel);
        }
    }

    /// One eviction round (see [`Self::evict_if_needed`]); `requested` when an allocation
    /// asked for it.
    fn evict_round(&self, now: Instant, requested: bool) {
        let (used, total) = self.segment_usage();
        if total == 0 {
            return;
        }
        let used_ratio = used as f64 / total as f64;
        let hwm = self.config.eviction_high_watermark_ratio;
        let ratio = self.config.eviction_ratio;
        if !(used_ratio > hwm || (requested && ratio > 0.0)) {
            return;
        }
        let state = (self.objects.len() as u64, used, self.pins.len() as u64);
        if !requested && !self.eviction_backoff.lock().due(now, state) {
            return;
        }
        let allow_soft = self.config.allow_evict_soft_pinned_objects;
        Counters::add(&self.counters.table_scans, 1);
        let mut candidates = Vec::new();
        self.objects.scan_in_slices(|shard, slots| {
            for (key, meta) in shard.slice(slots) {
                let soft_pinned = meta.is_soft_pinned(now);
                if Self::is_evictable(meta, now) && (allow_soft || !soft_pinned) {
                    candidates.push(Candidate {
                        key: key.to_string(),
                        object_id: meta.id,
                        last_access: meta.last_access(),
                        soft_pinned,
                    });
                }
            }
        });
        let targets = eviction::targets(candidates.len(), used_ratio, hwm, ratio);
        let mut objects = 0;
        for victim in eviction::choose(candidates, targets) {
            let mut shard = self.objects.shard(&victim.key);
            let still = shard
                .get(&victim.key)
                .is_some_and(|meta| meta.id == victim.object_id && Self::is_evictable(meta, now));
            if !still {
                continue;
            }
            // An object on disk already (a write-through copy) only frees its memory.
            if let Some(meta) = shard.get_mut(&victim.key).filter(|m| m.disk().is_some()) {
                self.count_evicted(meta);
                self.release_memory(&victim.key, meta, now);
                Counters::add(&self.counters.memory_released, 1);
                objects += 1;
                continue;
            }
            // Demoted to the owner's disk tier when it has one with room, else dropped; left
            // in memory while the tier has its fill of demotions in flight, or makes room.
            match self.start_demotion(&mut shard, &victim.key, DiskWork::Demote) {
                Demote::Started(_) => objects += 1,
                Demote::Busy | Demote::Trimming => {}
                Demote::NoTier | Demote::Full => {
                    if let Some(meta) = self.take_object(&mut shard, &victim.key) {
                        self.count_evicted(&meta);
                        objects += 1;
                    }
                }
            }
        }
        self.eviction_backoff
            .lock()
            .record(now, objects, state, EVICTION_PERIOD);
    }
}
