//! Mounted segments, their allocators, and replica placement (Mooncake's `random` strategy,
//! spec §4.7).
//!
//! Thread-safety: one `parking_lot::RwLock` over the registry. Placement takes it shared and
//! then allocator locks (leaves); mount/unmount take it exclusively and never lock anything
//! else except an allocator (to mark it dead).

use super::metrics::SegmentMetrics;
use crate::alloc::{Allocation, OffsetAllocator};
use crate::error::{fail, ErrorCode, Result};
use crate::types::{BufferDescriptor, ClientId, ReplicateConfig, Segment, SegmentId};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// At most this many segment names are tried after the preferred ones (Mooncake's cap).
const MAX_NAMES_TRIED: usize = 100;

struct MountedSegment {
    segment: Segment,
    owner: ClientId,
    allocator: Arc<OffsetAllocator>,
}

/// An unmounted segment whose allocator may still have ranges out (pins, deferred frees,
/// quarantine): a remount of the same range revives it instead of starting empty.
struct RetiredSegment {
    base: u64,
    size: u64,
    allocator: Weak<OffsetAllocator>,
}

#[derive(Default)]
struct Registry {
    by_id: HashMap<SegmentId, MountedSegment>,
    retired: HashMap<SegmentId, RetiredSegment>,
    /// Segment ids per name, in mount order.
    by_name: HashMap<String, Vec<SegmentId>>,
    /// Distinct names, in mount order (random-start iteration).
    names: Vec<String>,
}

/// One replica placed by [`SegmentRegistry::place`].
pub(crate) struct Placed {
    /// The range; freed when the last holder drops it.
    pub allocation: Arc<Allocation>,
    /// Where a client writes / reads it.
    pub buffer: BufferDescriptor,
}

impl Registry {
    /// Allocates on one of the segments called `name`, starting from a random one.
    fn place_on_name(&self, name: &str, size: u64) -> Option<Placed> {
        let ids = self.by_name.get(name)?;
        let start = fastrand::usize(..ids.len().max(1));
        (0..ids.len()).find_map(|i| {
            let id = ids[(start + i) % ids.len()];
            let mounted = self.by_id.get(&id)?;
            let allocation = mounted.allocator.allocate(size)?;
            let buffer = BufferDescriptor {
                size,
                buffer_address: mounted.segment.base.saturating_add(allocation.offset()),
                protocol: mounted.segment.protocol.clone(),
                transport_endpoint: mounted.segment.name.clone(),
                epoch: mounted.segment.epoch,
            };
            Some(Placed {
                allocation: Arc::new(allocation),
                buffer,
            })
        })
    }
}

/// The set of mounted segments. Owned by the master service; `Send + Sync`.
#[derive(Default)]
pub(crate) struct SegmentRegistry {
    inner: RwLock<Registry>,
}

impl SegmentRegistry {
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
            existing.allocator.revive();
            existing.segment = segment;
            return Ok(true);
        }
        let ids = inner.by_name.entry(segment.name.clone()).or_default();
        ids.push(segment.id);
        if ids.len() == 1 {
            inner.names.push(segment.name.clone());
        }
        let allocator = match inner.retired.remove(&segment.id) {
            Some(old) if (old.base, old.size) == (segment.base, segment.size) => old
                .allocator
                .upgrade()
                .inspect(|allocator| allocator.revive()),
            _ => None,
        }
        .unwrap_or_else(|| OffsetAllocator::new(segment.size));
        inner.by_id.insert(
            segment.id,
            MountedSegment {
                segment,
                owner: client,
                allocator,
            },
        );
        Ok(false)
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

    /// Ids of the segments `client` owns.
    pub(crate) fn segments_of(&self, client: ClientId) -> Vec<SegmentId> {
        let inner = self.inner.read();
        let owned = inner.by_id.iter().filter(|(_, m)| m.owner == client);
        owned.map(|(id, _)| *id).collect()
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
