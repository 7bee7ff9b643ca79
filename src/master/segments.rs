//! Mounted segments, their allocators, and replica placement (Mooncake's `random` strategy,
//! spec §4.7).
//!
//! Thread-safety: one `parking_lot::RwLock` over the registry. Placement takes it shared and
//! then allocator locks (leaves); mount/unmount take it exclusively and never lock anything
//! else except an allocator (to mark it dead).

use super::journal::{Journal, Record};
use super::metrics::SegmentMetrics;
use super::replicas::Place;
use crate::alloc::{Allocation, FreeGate, OffsetAllocator};
use crate::error::{fail, ErrorCode, Result};
use crate::types::{BufferDescriptor, ClientId, ReplicateConfig, Segment, SegmentId};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// At most this many segment names are tried after the preferred ones (Mooncake's cap).
const MAX_NAMES_TRIED: usize = 100;

struct MountedSegment {
    segment: Segment,
    owner: ClientId,
    allocator: Arc<OffsetAllocator>,
    /// How the replicas placed on this mount are addressed.
    place: Arc<Place>,
}

impl MountedSegment {
    fn new(segment: Segment, owner: ClientId, allocator: Arc<OffsetAllocator>) -> Self {
        MountedSegment {
            place: Place::of(&segment),
            segment,
            owner,
            allocator,
        }
    }
}

/// An unmounted segment whose allocator may still have ranges out (pins, deferred frees,
/// quarantine): a remount of the same range revives it instead of starting empty.
struct RetiredSegment {
    base: u64,
    size: u64,
    allocator: Weak<OffsetAllocator>,
}

/// A segment the journal says was mounted when the master stopped: its replicas are
/// unreadable (the allocator is dead) until its owner re-attaches the same memory, or gone at
/// `deadline` if it does not.
struct RecoveredSegment {
    mounted: MountedSegment,
    deadline: Instant,
}

#[derive(Default)]
struct Registry {
    by_id: HashMap<SegmentId, MountedSegment>,
    retired: HashMap<SegmentId, RetiredSegment>,
    recovered: HashMap<SegmentId, RecoveredSegment>,
    /// Segment ids per name, in mount order.
    by_name: HashMap<String, Vec<SegmentId>>,
    /// Distinct names, in mount order (random-start iteration).
    names: Vec<String>,
}

/// One replica placed by [`SegmentRegistry::place`].
pub(crate) struct Placed {
    /// The range; freed when dropped.
    pub allocation: Allocation,
    /// The mount it is on.
    pub place: Arc<Place>,
}

impl Placed {
    /// Where a client writes or reads `size` bytes of it.
    pub(crate) fn buffer(&self, size: u64) -> BufferDescriptor {
        self.place.buffer(self.allocation.offset(), size)
    }
}

impl Registry {
    /// Adds a mounted segment to the indexes.
    fn insert_mounted(&mut self, mounted: MountedSegment) {
        let name = &mounted.segment.name;
        let ids = self.by_name.entry(name.clone()).or_default();
        ids.push(mounted.segment.id);
        if ids.len() == 1 {
            self.names.push(name.clone());
        }
        self.by_id.insert(mounted.segment.id, mounted);
    }

    /// Allocates on one of the segments called `name`, starting from a random one.
    fn place_on_name(&self, name: &str, size: u64) -> Option<Placed> {
        let ids = self.by_name.get(name)?;
        let start = fastrand::usize(..ids.len().max(1));
        (0..ids.len()).find_map(|i| {
            let id = ids[(start + i) % ids.len()];
            let mounted = self.by_id.get(&id)?;
            let allocation = mounted.allocator.allocate(size)?;
            Some(Placed {
                allocation,
                place: Arc::clone(&mounted.place),
            })
        })
    }
}

/// The set of mounted segments. Owned by the master service; `Send + Sync`.
#[derive(Default)]
pub(crate) struct SegmentRegistry {
    inner: RwLock<Registry>,
    /// Where mounts and unmounts are journaled (appended under the write lock, so in the
    /// order they happen), and where freed ranges wait for their removal to be durable.
    journal: Option<(Arc<Journal>, Arc<FreeGate>)>,
}

impl SegmentRegistry {
    /// A registry whose changes go to `journal` and whose allocators free through `gate`.
    pub(crate) fn journaled(journal: Arc<Journal>, gate: Arc<FreeGate>) -> SegmentRegistry {
        SegmentRegistry {
            inner: RwLock::default(),
            journal: Some((journal, gate)),
        }
    }

    fn record(&self, record: impl FnOnce() -> Record) {
        if let Some((journal, _)) = &self.journal {
            journal.append(&record());
        }
    }

    fn new_allocator(&self, size: u64) -> Arc<OffsetAllocator> {
        let gate = self.journal.as_ref().map(|(_, gate)| Arc::clone(gate));
        OffsetAllocator::gated(size, gate)
    }

    /// Adds a segment recovered from the journal, owned by `client`, with a dormant allocator
    /// (none of its ranges live or allocatable) until [`SegmentRegistry::adopt`]; returns the
    /// allocator, on which the caller carves the recovered replicas' ranges, and the place
    /// of those replicas.
    pub(crate) fn restore(
        &self,
        client: ClientId,
        segment: Segment,
        deadline: Instant,
    ) -> (Arc<OffsetAllocator>, Arc<Place>) {
        let allocator = self.new_allocator(segment.size);
        allocator.mark_dormant();
        let mounted = MountedSegment::new(segment, client, Arc::clone(&allocator));
        let (id, place) = (mounted.segment.id, Arc::clone(&mounted.place));
        let recovered = RecoveredSegment { mounted, deadline };
        self.inner.write().recovered.insert(id, recovered);
        (allocator, place)
    }

    /// The recovered segments of `client` still waiting for it, as the journal describes
    /// them (their epoch is the mount the owner must still hold to re-attach).
    pub(crate) fn recovered_of(&self, client: ClientId) -> Vec<Segment> {
        let inner = self.inner.read();
        let waiting = inner.recovered.values().map(|r| &r.mounted);
        let owned = waiting.filter(|m| m.owner == client);
        owned.map(|m| m.segment.clone()).collect()
    }

    /// Whether `segment` (by `client`, which held it under `previous_epoch`) can re-attach a
    /// recovered segment: same id, owner, range, name and protocol, and that epoch.
    pub(crate) fn can_adopt(
        &self,
        client: ClientId,
        previous_epoch: u64,
        segment: &Segment,
    ) -> bool {
        let inner = self.inner.read();
        inner.recovered.get(&segment.id).is_some_and(|r| {
            let old = &r.mounted.segment;
            r.mounted.owner == client
                && old.epoch == previous_epoch
                && (old.base, old.size, &old.name, &old.protocol)
                    == (segment.base, segment.size, &segment.name, &segment.protocol)
        })
    }

    /// Re-attaches a recovered segment under the owner's new epoch (see
    /// [`SegmentRegistry::can_adopt`], checked again here): its ranges are live again and the
    /// rest of it allocatable. `false` when it no longer can (nothing changed).
    /// `place` is the new epoch's place (the caller moved the recovered replicas to it).
    pub(crate) fn adopt(
        &self,
        client: ClientId,
        previous_epoch: u64,
        segment: Segment,
        place: Arc<Place>,
    ) -> bool {
        if !self.can_adopt(client, previous_epoch, &segment) {
            return false;
        }
        let mut inner = self.inner.write();
        let Some(recovered) = inner.recovered.remove(&segment.id) else {
            return false;
        };
        let allocator = recovered.mounted.allocator;
        self.record(|| Record::Mount {
            client,
            segment: segment.clone(),
            adopted_from: Some(previous_epoch),
        });
        inner.insert_mounted(MountedSegment {
            segment,
            owner: client,
            allocator: Arc::clone(&allocator),
            place,
        });
        allocator.revive_keeping();
        true
    }

    /// Gives up the recovered segments whose owners did not re-attach by `now`; returns how
    /// many (their replicas are dead: the caller purges them).
    pub(crate) fn expire_recovered(&self, now: Instant) -> usize {
        let mut inner = self.inner.write();
        let due: Vec<SegmentId> = inner
            .recovered
            .iter()
            .filter(|(_, r)| r.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            if let Some(recovered) = inner.recovered.remove(id) {
                recovered.mounted.allocator.mark_dead();
            }
            self.record(|| Record::Unmount { segment: *id });
        }
        due.len()
    }

    /// Recovered segments still waiting for their owners.
    pub(crate) fn recovered_waiting(&self) -> usize {
        self.inner.read().recovered.len()
    }

    /// Adds `segment` for `client`. Idempotent for the same id, owner and epoch; the same id
    /// and owner with a new epoch is a remount (the owner restarted its segment): the earlier
    /// mount's allocations stop being live and `Ok(true)` tells the caller to purge them.
    /// A remount of a segment unmounted earlier (e.g. its owner expired) keeps every range
    /// still held by the earlier mount reserved. Errors: `INVALID_PARAMS` (empty name, size
    /// 0, range overflows), `SEGMENT_ALREADY_EXISTS` (id owned by another client).
    pub(crate) fn mount(&self, client: ClientId, segment: Segment) -> Result<bool> {
        if segment.name.is_empty() || segment.size == 0 {
            return fail(ErrorCode::InvalidParams, "segment needs a name and a size");
        }
        if segment.base.checked_add(segment.size).is_none() {
            return fail(ErrorCode::InvalidParams, "segment range overflows");
        }
        let mut inner = self.inner.write();
        if let Some(existing) = inner.by_id.get_mut(&segment.id) {
            if existing.owner != client {
                return fail(
                    ErrorCode::SegmentAlreadyExists,
                    format!("segment {} belongs to another client", segment.id),
                );
            }
            if existing.segment == segment {
                return Ok(false);
            }
            let shape = |s: &Segment| (s.base, s.size, s.name.clone(), s.protocol.clone());
            if shape(&existing.segment) != shape(&segment) {
                return fail(
                    ErrorCode::InvalidParams,
                    format!(
                        "segment {} is mounted with another range or name",
                        segment.id
                    ),
                );
            }
            // A new epoch: the earlier mount's allocations stop being live.
            self.record(|| Record::Mount {
                client,
                segment: segment.clone(),
                adopted_from: None,
            });
            existing.allocator.revive();
            existing.place = Place::of(&segment);
            existing.segment = segment;
            return Ok(true);
        }
        // A recovered segment mounted afresh (not re-attached): its replicas are gone.
        let forgotten = inner.recovered.remove(&segment.id);
        if let Some(recovered) = &forgotten {
            recovered.mounted.allocator.mark_dead();
        }
        let allocator = match inner.retired.remove(&segment.id) {
            Some(old) if (old.base, old.size) == (segment.base, segment.size) => old
                .allocator
                .upgrade()
                .inspect(|allocator| allocator.revive()),
            _ => None,
        }
        .unwrap_or_else(|| self.new_allocator(segment.size));
        self.record(|| Record::Mount {
            client,
            segment: segment.clone(),
            adopted_from: None,
        });
        inner.insert_mounted(MountedSegment::new(segment, client, allocator));
        Ok(forgotten.is_some())
    }

    /// Removes segment `id` and marks its allocator dead. `Ok(false)` if unknown; errors:
    /// `ILLEGAL_CLIENT` if `client` does not own it.
    pub(crate) fn unmount(&self, client: ClientId, id: SegmentId) -> Result<bool> {
        let mut inner = self.inner.write();
        match inner.by_id.get(&id) {
            None => return Ok(false),
            Some(mounted) if mounted.owner != client => {
                return fail(
                    ErrorCode::IllegalClient,
                    format!("segment {id} belongs to another client"),
                )
            }
            Some(_) => {}
        }
        let Some(mounted) = inner.by_id.remove(&id) else {
            return Ok(false);
        };
        self.record(|| Record::Unmount { segment: id });
        mounted.allocator.mark_dead();
        inner
            .retired
            .retain(|_, old| old.allocator.strong_count() > 0);
        inner.retired.insert(
            id,
            RetiredSegment {
                base: mounted.segment.base,
                size: mounted.segment.size,
                allocator: Arc::downgrade(&mounted.allocator),
            },
        );
        let name = &mounted.segment.name;
        let now_empty = inner.by_name.get_mut(name).is_some_and(|ids| {
            ids.retain(|other| *other != id);
            ids.is_empty()
        });
        if now_empty {
            inner.by_name.remove(name);
            inner.names.retain(|other| other != name);
        }
        Ok(true)
    }

    /// The client owning mounted segment `id`.
    pub(crate) fn owner_of(&self, id: SegmentId) -> Option<ClientId> {
        self.inner.read().by_id.get(&id).map(|m| m.owner)
    }

    /// The place of the current mount of segment `id`.
    pub(crate) fn place_of(&self, id: SegmentId) -> Option<Arc<Place>> {
        let inner = self.inner.read();
        inner.by_id.get(&id).map(|m| Arc::clone(&m.place))
    }

    /// Ids of the segments `client` owns.
    pub(crate) fn segments_of(&self, client: ClientId) -> Vec<SegmentId> {
        let inner = self.inner.read();
        let owned = inner.by_id.iter().filter(|(_, m)| m.owner == client);
        owned.map(|(id, _)| *id).collect()
    }

    /// Places one replica of `size` bytes in a segment `client` owns, if one has room.
    pub(crate) fn place_at_owner(&self, client: ClientId, size: u64) -> Option<Placed> {
        let inner = self.inner.read();
        let mut owned = inner.by_id.values().filter(|m| m.owner == client);
        let name = owned.next()?.segment.name.clone();
        inner.place_on_name(&name, size)
    }

    /// Places up to `config.replica_num` replicas of `size` bytes, each on a distinct segment
    /// name: preferred names first, then names from a random start (at most 100 tried).
    /// Returns what could be placed (possibly nothing).
    pub(crate) fn place(&self, size: u64, config: &ReplicateConfig) -> Vec<Placed> {
        let wanted = usize::try_from(config.replica_num).unwrap_or(usize::MAX);
        let inner = self.inner.read();
        let names = &inner.names;
        let start = fastrand::usize(..names.len().max(1));
        let random_order = (0..names.len().min(MAX_NAMES_TRIED))
            .map(|i| names[(start + i) % names.len()].as_str());
        let mut placed = Vec::new();
        let mut used_names: Vec<&str> = Vec::new();
        for name in config.preferred().into_iter().chain(random_order) {
            if placed.len() >= wanted {
                break;
            }
            if used_names.contains(&name) {
                continue;
            }
            if let Some(replica) = inner.place_on_name(name, size) {
                placed.push(replica);
                used_names.push(name);
            }
        }
        placed
    }

    /// Whether any segment is mounted.
    pub(crate) fn is_empty(&self) -> bool {
        self.inner.read().by_id.is_empty()
    }

    /// (allocated bytes, capacity) over all segments.
    pub(crate) fn usage(&self) -> (u64, u64) {
        let inner = self.inner.read();
        inner.by_id.values().fold((0, 0), |(used, total), m| {
            (
                used.saturating_add(m.allocator.used()),
                total.saturating_add(m.allocator.capacity()),
            )
        })
    }

    /// Per-segment usage, sorted by name then id.
    pub(crate) fn metrics(&self) -> Vec<SegmentMetrics> {
        let inner = self.inner.read();
        let mut out: Vec<SegmentMetrics> = inner
            .by_id
            .values()
            .map(|m| SegmentMetrics {
                name: m.segment.name.clone(),
                id: m.segment.id.to_string(),
                used_bytes: m.allocator.used(),
                total_bytes: m.allocator.capacity(),
            })
            .collect();
        out.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        out
    }
}
