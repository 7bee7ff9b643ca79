//! What [`MasterService`] journals and how a restarted master comes back from its journal
//! (see `journal/` for the files and `docs/ha.md` for the design).
//!
//! - Commits are journaled at `PutEnd` (acknowledged before they are durable); every way a
//!   committed object leaves the table or is rewritten journals its removal first
//!   ([`MasterService::take_object`], [`MasterService::forget_committed`]); its ranges then
//!   wait at the free gate until that removal is durable.
//! - An upsert that rewrites a committed object in place waits for its removal to be durable
//!   before it hands out the grant: a crash during the rewrite must not bring back the old
//!   value over half-written bytes.
//! - Write tokens come from blocks reserved in the journal ([`TOKEN_BLOCK`]): a restarted
//!   master starts above every token its predecessor could have handed out.
//! - Recovery restores segments dormant and objects committed; an owner that still holds the
//!   same memory under the same epoch re-attaches it under a fresh epoch
//!   ([`MasterService::reattach`]), which fences every descriptor the previous master handed
//!   out; a segment not re-attached within `reattach_grace_ms` is given up.

use super::journal::{DiskCopy, JournalState, ObjectRecord, Record};
use super::objects::{DiskCopyRef, DiskLocation, ObjectMeta, Range, Replica, Replicas, Shard};
use super::replicas::Place;
use super::service::MasterService;
use crate::alloc::Allocation;
use crate::error::Result;
use crate::types::{ClientId, DeploymentMode, Segment, SegmentId, WriteToken};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Write tokens reserved per `TokenCeiling` record; a new block is reserved when half of the
/// current one is used, so handing out a token practically never waits for the disk.
pub(super) const TOKEN_BLOCK: u64 = 1 << 32;

/// The journaled ceiling of write tokens.
#[derive(Default)]
pub(super) struct TokenReserve {
    /// Tokens below this may be handed out once `lsn` is durable.
    pub ceiling: u64,
    pub lsn: u64,
    /// Tokens below this are covered by a durable record.
    pub durable: u64,
}

/// What a recovery restored (reported in the master's log and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Restored {
    pub segments: u64,
    pub objects: u64,
    /// Replicas the journal names whose range another replica already holds (corruption;
    /// never served).
    pub overlapping_replicas: u64,
}

impl MasterService {
    /// Removes `key` from `shard`, journaling its removal if it was committed.
    pub(super) fn take_object(&self, shard: &mut Shard, key: &str) -> Option<ObjectMeta> {
        let mut meta = shard.remove(key)?;
        self.forget_committed(key, &mut meta);
        if meta.has_cache_holders() {
            self.revoke_cached(key, &mut meta, Instant::now());
        }
        Some(meta)
    }

    /// Sends revocations to the clients caching `key`'s replica list (they are forgotten as
    /// holders); whether any was sent.
    pub(super) fn revoke_cached(&self, key: &str, meta: &mut ObjectMeta, now: Instant) -> bool {
        if !meta.has_cache_holders() {
            return false;
        }
        self.cache_leases
            .revoke(key, meta.take_cache_holders(), now)
    }

    /// Journals that the committed value of `key` is gone (before it is rewritten or its
    /// ranges are released); returns the record's LSN, or `None` if nothing was journaled.
    pub(super) fn forget_committed(&self, key: &str, meta: &mut ObjectMeta) -> Option<u64> {
        let journal = self.journal.as_ref()?;
        if !std::mem::take(&mut meta.journaled) {
            return None;
        }
        let lsn = journal.append(&Record::Remove {
            key: key.to_string(),
        });
        self.objects.note_removal(key, lsn);
        Some(lsn)
    }

    /// Waits until the last journaled removal in `key`'s shard is safe (durable here and at
    /// every standby): called before a write of `key` is granted or a removal acknowledged,
    /// so a failover can lose the newest commits but never bring back a value removed before
    /// an acknowledged write or removal. Errors: see [`Self::wait_durable`].
    pub(super) fn wait_removals_safe(&self, key: &str) -> Result<()> {
        match self.objects.last_removal(key) {
            0 => Ok(()),
            lsn => self.wait_durable(Some(lsn)),
        }
    }

    /// Journals the commit of `key` (complete now), in memory or, after a demotion, on disk.
    pub(super) fn journal_commit(&self, key: &str, meta: &mut ObjectMeta, now: Instant) {
        if let Some(journal) = &self.journal {
            let key = key.to_string();
            let object = meta.record(now);
            journal.append(&match meta.disk_at() {
                None => Record::Commit { key, object },
                Some(on_disk) => Record::DiskCommit {
                    key,
                    object,
                    disk: DiskCopy {
                        tier: on_disk.tier,
                        generation: on_disk.generation,
                    },
                },
            });
            meta.journaled = true;
        }
    }

    /// Waits until the removal journaled at `lsn` (if any) is durable.
    pub(super) fn wait_durable(&self, lsn: Option<u64>) -> Result<()> {
        match (&self.journal, lsn) {
            (Some(journal), Some(lsn)) => journal.wait_durable(lsn),
            _ => Ok(()),
        }
    }

    /// The journal; `UNAVAILABLE_IN_CURRENT_MODE` without one.
    pub(super) fn journal_or_fail(&self) -> Result<&super::journal::Journal> {
        match &self.journal {
            Some(journal) => Ok(journal),
            None => crate::error::fail(
                crate::error::ErrorCode::UnavailableInCurrentMode,
                "this master keeps no journal (--journal_dir)",
            ),
        }
    }

    /// `INTERNAL_ERROR` while the journal cannot write: new writes are refused then.
    pub(super) fn check_journal(&self) -> Result<()> {
        match &self.journal {
            Some(journal) if journal.is_failing() => crate::error::fail(
                crate::error::ErrorCode::InternalError,
                "the master's journal cannot write; new writes are refused until it can",
            ),
            _ => Ok(()),
        }
    }

    /// A fresh write token (write generation), covered by a journaled ceiling when there is
    /// a journal.
    pub(super) fn next_write_token(&self) -> WriteToken {
        let token = self.next_write.next();
        if self.journal.is_some() {
            self.cover_token(token);
        }
        WriteToken(token)
    }

    fn cover_token(&self, token: u64) {
        let Some(journal) = &self.journal else { return };
        if token < self.tokens_covered.load(Ordering::Acquire) {
            return;
        }
        let mut reserve = self.token_reserve.lock();
        if token.saturating_add(TOKEN_BLOCK / 2) >= reserve.ceiling {
            reserve.ceiling = reserve.ceiling.max(token).saturating_add(TOKEN_BLOCK);
            reserve.lsn = journal.append(&Record::TokenCeiling(reserve.ceiling));
        }
        if token >= reserve.durable {
            if journal.wait_durable(reserve.lsn).is_err() {
                tracing::error!(
                    token,
                    "write token handed out before its ceiling is durable"
                );
                return;
            }
            reserve.durable = reserve.ceiling;
        }
        let covered = reserve
            .durable
            .min(reserve.ceiling.saturating_sub(TOKEN_BLOCK / 2));
        self.tokens_covered.store(covered, Ordering::Release);
    }

    /// Restores what the journal kept: segments dormant until their owners re-attach (or
    /// `reattach_grace` passes), committed objects on them, and the write-token floor.
    pub(super) fn recover(&self, state: JournalState) -> Restored {
        let now = Instant::now();
        let grace = Duration::from_millis(self.config.reattach_grace_ms);
        let until = crate::spin::deadline(now, grace);
        let mut restored = Restored::default();
        let mut allocators = HashMap::new();
        for (id, kept) in state.segments {
            let restored_segment = self.segments.restore(kept.client, kept.segment, until);
            allocators.insert(id, restored_segment);
            restored.segments += 1;
        }
        let objects: Vec<(String, ObjectRecord)> = state.objects.into_iter().collect();
        // Ranges are carved in offset order per segment: the free lists stay short (in the
        // table's random order each carve would split a long list of gaps).
        let mut order: Vec<(SegmentId, u64, usize, usize)> = objects
            .iter()
            .enumerate()
            .flat_map(|(o, (_, object))| {
                let replicas = object.replicas.iter().enumerate();
                replicas.map(move |(r, kept)| (kept.segment, kept.offset, o, r))
            })
            .collect();
        order.sort_unstable();
        let mut carved: Vec<Vec<Option<Allocation>>> = objects
            .iter()
            .map(|(_, object)| object.replicas.iter().map(|_| None).collect())
            .collect();
        for (segment, offset, o, r) in order {
            let Some((allocator, _)) = allocators.get(&segment) else {
                continue;
            };
            let size = objects[o].1.replicas[r].size;
            match allocator.allocate_at(offset, size) {
                Some(allocation) => carved[o][r] = Some(allocation),
                None => {
                    restored.overlapping_replicas += 1;
                    let key = &objects[o].0;
                    tracing::error!(%key, offset, "journal: replica overlaps another; dropped");
                }
            }
        }
        // Places of replicas journaled under another epoch than their segment's (one each).
        let mut places = HashMap::new();
        for ((key, object), allocations) in objects.into_iter().zip(carved) {
            let mut replicas = Replicas::new();
            for (kept, allocation) in object.replicas.iter().zip(allocations) {
                let (Some(allocation), Some((_, place))) =
                    (allocation, allocators.get(&kept.segment))
                else {
                    continue;
                };
                let place = match place.epoch == kept.epoch {
                    true => Arc::clone(place),
                    false => places
                        .entry((kept.segment, kept.epoch))
                        .or_insert_with(|| place.with_epoch(kept.epoch))
                        .clone(),
                };
                replicas.push(Replica {
                    id: kept.id,
                    place,
                    range: Range::Owned(allocation),
                });
            }
            let on_disk = state.disk.get(&key).map(|copy| DiskCopyRef {
                at: DiskLocation {
                    tier: copy.tier,
                    generation: copy.generation,
                },
                hold: self
                    .disks
                    .hold(&key, object.size, copy.tier, copy.generation),
                mount: 0,
                hits: 0,
            });
            if replicas.is_empty() && on_disk.is_none() {
                if let Some(journal) = &self.journal {
                    journal.append(&Record::Remove { key });
                }
                continue;
            }
            let soft_pin = object
                .soft_pin_ms
                .map(|ms| crate::spin::deadline(now, Duration::from_millis(ms)));
            let meta = ObjectMeta::restored(
                object.id,
                object.size,
                replicas,
                object.hard_pinned,
                (soft_pin, on_disk),
                now,
            );
            self.objects.shard(&key).insert(key, meta);
            restored.objects += 1;
        }
        // Disk copies stay unreadable until their tier's owner mounts it again.
        let tiers: std::collections::HashSet<_> = state.disk.values().map(|c| c.tier).collect();
        self.disks.await_tiers(tiers, until);
        self.start_tokens(state.token_ceiling);
        restored
    }

    /// Starts write tokens (and replica ids) at the recovered ceiling (a random start for an
    /// empty journal) and makes the next block's reservation durable before anything is
    /// handed out.
    fn start_tokens(&self, recovered_ceiling: u64) {
        let start = match recovered_ceiling {
            0 => self.next_write.ceiling(),
            ceiling => ceiling,
        };
        self.next_write.restart_at(start);
        self.next_replica_id.restart_at(start);
        self.cover_token(start);
    }

    /// The segments the journal recovered for `client` that still wait for it to re-attach.
    pub(super) fn recovered_of(&self, client: ClientId) -> Result<Vec<Segment>> {
        self.require_mode(DeploymentMode::Centralized)?;
        Ok(self.segments.recovered_of(client))
    }

    /// Re-attaches a recovered segment: `client` held it under `previous_epoch` (the epoch the
    /// journal names, so its pages are the ones the journal describes) and now mounts the same
    /// memory as `segment`, under a fresh epoch. The replicas on it become readable under the
    /// new epoch. `Ok(false)`: nothing to re-attach (the caller mounts it afresh).
    pub(super) fn reattach(
        &self,
        client: ClientId,
        previous_epoch: u64,
        segment: Segment,
    ) -> Result<bool> {
        self.require_mode(DeploymentMode::Centralized)?;
        self.clients.register(client, Instant::now());
        if !self.segments.can_adopt(client, previous_epoch, &segment) {
            return Ok(false);
        }
        // The replicas take the new epoch while still unreadable (the segment is dormant).
        let place = Place::of(&segment);
        self.objects.scan_in_slices(|shard, slots| {
            for (_, meta) in shard.slice_mut(slots) {
                // Only the recovered mount's ranges (dormant): a fresh mount of the same id
                // meanwhile keeps its own place.
                let on_it = meta
                    .replicas
                    .iter_mut()
                    .filter(|r| r.segment() == segment.id && r.allocation().is_dormant());
                for replica in on_it {
                    replica.place = Arc::clone(&place);
                }
            }
        });
        let name = segment.name.clone();
        let adopted = self.segments.adopt(client, previous_epoch, segment, place);
        if adopted {
            tracing::info!(%client, segment = %name, "owner re-attached its recovered segment");
        }
        Ok(adopted)
    }
}
