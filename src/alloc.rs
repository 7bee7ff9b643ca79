//! Per-segment offset allocator: best fit over free ranges, coalescing on free, sizes rounded
//! up to [`ALIGNMENT`]. Allocations are RAII [`Allocation`] handles.
//!
//! Thread-safety: the free lists sit behind one `parking_lot::Mutex` per allocator, a leaf
//! lock (nothing else is locked while it is held). Used bytes are mirrored in an atomic so
//! readers never take the lock.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Granularity of every allocation, in bytes.
pub(crate) const ALIGNMENT: u64 = 64;

/// Free ranges indexed twice: by offset (for coalescing) and by (size, offset) (best fit).
struct FreeRanges {
    by_offset: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeRanges {
    fn insert(&mut self, offset: u64, size: u64) {
        self.by_offset.insert(offset, size);
        self.by_size.insert((size, offset));
    }

    fn remove(&mut self, offset: u64, size: u64) {
        self.by_offset.remove(&offset);
        self.by_size.remove(&(size, offset));
    }
}

/// Holds freed ranges back until a watermark passes: a range dropped while the stamp reads
/// `s` returns to its allocator only once [`FreeGate::release_through`] is called with
/// `s` or more. The master's journal stamps every record it appends and releases what its
/// last flush made durable, so a range is reused only after every record naming it as
/// removed is on disk.
///
/// Thread-safety: the held queue sits behind a leaf `parking_lot::Mutex`; ranges are returned
/// to their allocators after it is released.
#[derive(Default)]
pub(crate) struct FreeGate {
    stamp: AtomicU64,
    held: Mutex<Held>,
}

/// The ranges waiting at a gate, and the watermark released so far (a range dropped with a
/// stamp at or below it is free at once: no later release would come for it in a quiet
/// journal).
#[derive(Default)]
struct Held {
    ranges: VecDeque<HeldRange>,
    released: u64,
}

/// A range waiting at a [`FreeGate`].
struct HeldRange {
    stamp: u64,
    allocator: Arc<OffsetAllocator>,
    offset: u64,
    size: u64,
}

impl FreeGate {
    /// Raises the stamp ranges dropped from now on carry (never lowers it).
    pub(crate) fn stamp(&self, value: u64) {
        self.stamp.fetch_max(value, Ordering::AcqRel);
    }

    /// Returns to their allocators the held ranges stamped `watermark` or less, oldest first
    /// (a range stamped higher stops the walk: it is only held longer). Returns how many.
    pub(crate) fn release_through(&self, watermark: u64) -> usize {
        let mut due = Vec::new();
        {
            let mut held = self.held.lock();
            held.released = held.released.max(watermark);
            while held
                .ranges
                .front()
                .is_some_and(|range| range.stamp <= watermark)
            {
                due.extend(held.ranges.pop_front());
            }
        }
        for range in &due {
            range.allocator.free(range.offset, range.size);
        }
        due.len()
    }

    /// Ranges held now.
    pub(crate) fn held(&self) -> usize {
        self.held.lock().ranges.len()
    }

    fn hold(&self, allocator: &Arc<OffsetAllocator>, offset: u64, size: u64) {
        let stamp = self.stamp.load(Ordering::Acquire);
        let mut held = self.held.lock();
        if stamp <= held.released {
            drop(held);
            allocator.free(offset, size);
            return;
        }
        held.ranges.push_back(HeldRange {
            stamp,
            allocator: Arc::clone(allocator),
            offset,
            size,
        });
    }
}

/// The allocator of one mounted segment: hands out ranges of `[0, capacity)`.
pub struct OffsetAllocator {
    capacity: u64,
    /// Where dropped ranges wait before they are free again (none: free at once).
    gate: Option<Arc<FreeGate>>,
    /// Cleared (under the `ranges` lock) when the segment is unmounted; read lock-free.
    alive: AtomicBool,
    /// Set while dead but waiting to be re-attached with its contents (a segment recovered
    /// from the master's journal): its allocations are unreadable but not gone.
    dormant: AtomicBool,
    /// Mount generation: bumped (under the `ranges` lock) when a dead allocator is revived
    /// for a remount, so allocations of the earlier mount are no longer live.
    generation: AtomicU64,
    used: AtomicU64,
    ranges: Mutex<FreeRanges>,
}

impl OffsetAllocator {
    /// An allocator over `size` bytes (rounded down to [`ALIGNMENT`]), all free.
    pub fn new(size: u64) -> Arc<OffsetAllocator> {
        Self::gated(size, None)
    }

    /// [`OffsetAllocator::new`] whose dropped ranges wait at `gate` (if any) before they can
    /// be handed out again.
    pub(crate) fn gated(size: u64, gate: Option<Arc<FreeGate>>) -> Arc<OffsetAllocator> {
        let capacity = size - size % ALIGNMENT;
        let mut ranges = FreeRanges {
            by_offset: BTreeMap::new(),
            by_size: BTreeSet::new(),
        };
        if capacity > 0 {
            ranges.insert(0, capacity);
        }
        Arc::new(OffsetAllocator {
            capacity,
            gate,
            alive: AtomicBool::new(true),
            dormant: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            used: AtomicU64::new(0),
            ranges: Mutex::new(ranges),
        })
    }

    /// Allocates `size` bytes (rounded up to [`ALIGNMENT`]) from the smallest free range that
    /// fits (lowest offset among equals). `None` when `size` is 0, nothing fits, or the
    /// allocator is dead.
    pub fn allocate(self: &Arc<Self>, size: u64) -> Option<Allocation> {
        let rounded = size.checked_add(ALIGNMENT - 1)? / ALIGNMENT * ALIGNMENT;
        if rounded == 0 {
            return None;
        }
        let mut ranges = self.ranges.lock();
        if !self.is_alive() {
            return None;
        }
        let (free_size, offset) = *ranges.by_size.range((rounded, 0)..).next()?;
        ranges.remove(offset, free_size);
        if free_size > rounded {
            ranges.insert(offset + rounded, free_size - rounded);
        }
        Some(self.handed_out(ranges, offset, rounded))
    }

    /// The handle of `[offset, offset + rounded)`, just taken out of `ranges` (whose lock is
    /// released here).
    fn handed_out(
        self: &Arc<Self>,
        ranges: parking_lot::MutexGuard<'_, FreeRanges>,
        offset: u64,
        rounded: u64,
    ) -> Allocation {
        self.used.fetch_add(rounded, Ordering::Relaxed);
        let generation = self.generation.load(Ordering::Relaxed);
        drop(ranges);
        Allocation {
            allocator: Arc::clone(self),
            offset,
            size: rounded,
            generation,
        }
    }

    /// Allocates exactly `[offset, offset + size)` (`size` rounded up to [`ALIGNMENT`]), also
    /// while the allocator is dead: how a recovering master rebuilds the ranges its journal
    /// names. `None` when `offset` is unaligned, `size` is 0 or the range is not wholly free.
    pub(crate) fn allocate_at(self: &Arc<Self>, offset: u64, size: u64) -> Option<Allocation> {
        let rounded = size.checked_add(ALIGNMENT - 1)? / ALIGNMENT * ALIGNMENT;
        let end = offset.checked_add(rounded)?;
        if rounded == 0 || !offset.is_multiple_of(ALIGNMENT) {
            return None;
        }
        let mut ranges = self.ranges.lock();
        let (&free_offset, &free_size) = ranges.by_offset.range(..=offset).next_back()?;
        if free_offset + free_size < end {
            return None;
        }
        ranges.remove(free_offset, free_size);
        if free_offset < offset {
            ranges.insert(free_offset, offset - free_offset);
        }
        if end < free_offset + free_size {
            ranges.insert(end, free_offset + free_size - end);
        }
        Some(self.handed_out(ranges, offset, rounded))
    }

    /// Returns a range, also while the allocator is dead: a revived allocator must know
    /// which ranges of the earlier mount are still held.
    fn free(&self, offset: u64, size: u64) {
        Self::free_locked(&mut self.ranges.lock(), offset, size);
        self.used.fetch_sub(size, Ordering::Relaxed);
    }

    /// Returns `[freed_offset, freed_offset + freed_size)` to `ranges`, merged with the free
    /// ranges it touches.
    fn free_locked(ranges: &mut FreeRanges, freed_offset: u64, freed_size: u64) {
        let (mut offset, mut size) = (freed_offset, freed_size);
        if let Some((&prev_offset, &prev_size)) = ranges.by_offset.range(..offset).next_back() {
            if prev_offset + prev_size == offset {
                ranges.remove(prev_offset, prev_size);
                offset = prev_offset;
                size += prev_size;
            }
        }
        if let Some(&next_size) = ranges.by_offset.get(&(offset + size)) {
            ranges.remove(offset + size, next_size);
            size += next_size;
        }
        ranges.insert(offset, size);
    }

    /// Marks the allocator dead (segment unmounted): no more allocations and no allocation
    /// is live. Handles still out (pins, deferred frees) keep their ranges reserved until
    /// dropped, so a later [`OffsetAllocator::revive`] never hands them out again.
    pub(crate) fn mark_dead(&self) {
        let _ranges = self.ranges.lock();
        self.alive.store(false, Ordering::Release);
        self.dormant.store(false, Ordering::Release);
    }

    /// Marks the allocator dead but dormant: its allocations are not live, nothing is handed
    /// out, yet they are not gone: [`OffsetAllocator::revive_keeping`] makes them live again,
    /// [`OffsetAllocator::mark_dead`] ends them.
    pub(crate) fn mark_dormant(&self) {
        let _ranges = self.ranges.lock();
        self.alive.store(false, Ordering::Release);
        self.dormant.store(true, Ordering::Release);
    }

    /// Brings a dead allocator back for a remount of the same segment: allocations of the
    /// earlier mount stay reserved but are no longer live (their replicas are unreadable).
    pub(crate) fn revive(&self) {
        let _ranges = self.ranges.lock();
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.alive.store(true, Ordering::Release);
    }

    /// Brings a dead allocator back for a mount that keeps the earlier mount's contents (a
    /// recovered segment re-attached by its owner): its allocations become live again.
    pub(crate) fn revive_keeping(&self) {
        let _ranges = self.ranges.lock();
        self.dormant.store(false, Ordering::Release);
        self.alive.store(true, Ordering::Release);
    }

    /// Whether the segment is still mounted.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Allocated bytes (rounded sizes).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Number of free ranges (fragmentation measure for tests and metrics).
    #[cfg(test)]
    pub fn free_ranges(&self) -> usize {
        self.ranges.lock().by_offset.len()
    }
}

/// One allocated range; dropping it returns the range to its allocator (also after the
/// segment was unmounted). Shared as `Arc<Allocation>` by an object's replica, pins and
/// deferred frees: the bytes are free only when the last holder lets go.
pub struct Allocation {
    allocator: Arc<OffsetAllocator>,
    offset: u64,
    size: u64,
    /// The allocator's mount generation when this range was handed out.
    generation: u64,
}

impl Allocation {
    /// Offset inside the segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Allocated (rounded) length.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the owning segment is still mounted, by the mount that handed this out.
    pub(crate) fn is_live(&self) -> bool {
        self.allocator.is_alive() && self.is_current()
    }

    /// Whether the owning segment waits to be re-attached with this range's contents (see
    /// [`OffsetAllocator::mark_dormant`]).
    pub(crate) fn is_dormant(&self) -> bool {
        self.allocator.dormant.load(Ordering::Acquire) && self.is_current()
    }

    fn is_current(&self) -> bool {
        self.allocator.generation.load(Ordering::Acquire) == self.generation
    }
}

impl Allocation {
    /// The allocator, offset and size, taken out without returning the range.
    fn into_parts(self) -> (Arc<OffsetAllocator>, u64, u64) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so its allocator handle is moved out exactly once
        // and the range is not returned by `Drop`.
        let allocator = unsafe { std::ptr::read(&this.allocator) };
        (allocator, this.offset, this.size)
    }
}

/// Returns many ranges as dropping each would, but those of one allocator in offset order
/// under one hold of its lock: a scan that removes thousands of objects pays one lock per
/// segment and batch instead of one per range, and walks the free-range trees in order
/// instead of from the top at random (a gated allocator's ranges go to its gate, one by one).
pub(crate) fn release_all(allocations: Vec<Allocation>) {
    let mut parts: Vec<_> = allocations
        .into_iter()
        .map(Allocation::into_parts)
        .collect();
    parts.sort_unstable_by_key(|(allocator, offset, _)| (Arc::as_ptr(allocator) as usize, *offset));
    for group in parts.chunk_by(|(a, _, _), (b, _, _)| Arc::ptr_eq(a, b)) {
        let allocator = &group[0].0;
        match &allocator.gate {
            Some(gate) => {
                for (_, offset, size) in group {
                    gate.hold(allocator, *offset, *size);
                }
            }
            None => {
                let mut ranges = allocator.ranges.lock();
                for (_, offset, size) in group {
                    OffsetAllocator::free_locked(&mut ranges, *offset, *size);
                }
                drop(ranges);
                let freed = group.iter().map(|(_, _, size)| size).sum();
                allocator.used.fetch_sub(freed, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        match &self.allocator.gate {
            Some(gate) => gate.hold(&self.allocator, self.offset, self.size),
            None => self.allocator.free(self.offset, self.size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_and_rejects_zero_and_overflow() {
        let a = OffsetAllocator::new(1000); // capacity 960
        assert_eq!(a.capacity(), 960);
        assert!(a.allocate(0).is_none());
        assert!(a.allocate(u64::MAX).is_none());
        let x = a.allocate(1).unwrap();
        assert_eq!((x.offset(), x.size()), (0, 64));
        assert_eq!(a.used(), 64);
        drop(x);
        assert_eq!(a.used(), 0);
        assert!(OffsetAllocator::new(10).allocate(1).is_none());
    }

    #[test]
    fn best_fit_picks_the_smallest_hole() {
        let a = OffsetAllocator::new(64 * 100);
        let blocks: Vec<_> = (0..10).map(|_| a.allocate(64 * 4).unwrap()).collect();
        let mut blocks: Vec<Option<Allocation>> = blocks.into_iter().map(Some).collect();
        // Holes: 4 blocks at 1 (256 B), 2 blocks at 3..5 after coalescing (512 B).
        blocks[1] = None;
        blocks[3] = None;
        blocks[4] = None;
        let small = a.allocate(200).unwrap();
        assert_eq!(small.offset(), 64 * 4, "fits exactly in the 256-byte hole");
        let mid = a.allocate(300).unwrap();
        assert_eq!(mid.offset(), 64 * 12, "512-byte hole, not the large tail");
        drop(blocks);
    }

    #[test]
    fn frees_coalesce_back_to_one_range() {
        let a = OffsetAllocator::new(64 * 64);
        let mut blocks: Vec<Option<Allocation>> =
            (0..64).map(|_| a.allocate(64)).collect::<Vec<_>>();
        assert!(a.allocate(64).is_none(), "exhausted");
        for i in (0..64).step_by(2) {
            blocks[i] = None;
        }
        assert_eq!(a.free_ranges(), 32, "fragmented");
        assert!(a.allocate(128).is_none(), "no two adjacent free blocks");
        for i in (1..64).step_by(2) {
            blocks[i] = None;
        }
        assert_eq!(a.free_ranges(), 1);
        assert_eq!(a.used(), 0);
        assert_eq!(a.allocate(64 * 64).unwrap().offset(), 0);
    }

    #[test]
    fn dead_allocator_refuses_allocations_and_revives_without_reusing_held_ranges() {
        let a = OffsetAllocator::new(4096);
        let held = a.allocate(100).unwrap();
        let freed = a.allocate(100).unwrap();
        a.mark_dead();
        assert!(!held.is_live());
        drop(freed);
        assert!(a.allocate(64).is_none());
        a.revive();
        assert!(
            !held.is_live(),
            "an allocation of the earlier mount stays dead"
        );
        let fresh = a.allocate(64).unwrap();
        assert!(fresh.is_live());
        assert_ne!(
            fresh.offset(),
            held.offset(),
            "a held range is never handed out again"
        );
        assert_eq!(a.used(), 128 + 64);
        drop(held);
        assert_eq!(a.used(), 64);
    }

    #[test]
    fn allocate_at_carves_exact_free_ranges_only() {
        let a = OffsetAllocator::new(64 * 16);
        let middle = a.allocate_at(64 * 4, 100).unwrap();
        assert_eq!((middle.offset(), middle.size()), (64 * 4, 128));
        assert!(a.allocate_at(64 * 5, 64).is_none(), "overlaps a held range");
        assert!(a.allocate_at(65, 64).is_none(), "unaligned");
        assert!(a.allocate_at(64 * 15, 128).is_none(), "past the end");
        let first = a.allocate_at(0, 64 * 4).unwrap();
        assert_eq!(a.used(), 64 * 6);
        assert_eq!(
            a.allocate(64 * 10).unwrap().offset(),
            64 * 6,
            "the rest stays free"
        );
        drop((first, middle));
        a.mark_dead();
        assert!(a.allocate_at(0, 64).is_some(), "recovery carves while dead");
    }

    #[test]
    fn a_gate_holds_dropped_ranges_until_their_stamp_is_released() {
        let gate = Arc::new(FreeGate::default());
        let a = OffsetAllocator::gated(64 * 4, Some(Arc::clone(&gate)));
        gate.stamp(7);
        let held = a.allocate(64 * 4).unwrap();
        drop(held);
        assert_eq!(gate.held(), 1);
        assert!(a.allocate(64).is_none(), "held at the gate, not free");
        assert_eq!(gate.release_through(6), 0);
        assert!(a.allocate(64).is_none());
        assert_eq!(gate.release_through(7), 1);
        assert_eq!(a.used(), 0);
        // Dropped after its stamp was released (a lease ran out long after the removal was
        // durable): free at once, not held until some later release.
        let late = a.allocate(64 * 4).unwrap();
        assert_eq!(late.offset(), 0);
        drop(late);
        assert_eq!(gate.held(), 0);
        assert_eq!(a.used(), 0);
        gate.stamp(8);
        drop(a.allocate(64).unwrap());
        assert_eq!(gate.held(), 1, "a stamp above the released one waits");
    }

    /// The free ranges of `a` as (offset, size), in offset order.
    fn free_list(a: &OffsetAllocator) -> Vec<(u64, u64)> {
        let ranges = a.ranges.lock();
        let by_size: BTreeSet<_> = ranges.by_offset.iter().map(|(&o, &s)| (s, o)).collect();
        assert_eq!(by_size, ranges.by_size, "the two indexes agree");
        ranges.by_offset.iter().map(|(&o, &s)| (o, s)).collect()
    }

    #[test]
    fn releasing_a_batch_leaves_what_dropping_one_by_one_leaves() {
        // Two allocators filled with blocks of mixed sizes; the same blocks are let go of one
        // by one in a pair of reference allocators and as one shuffled batch here.
        let sizes = |i: u64| 64 * (1 + i % 3);
        let fill = |a: &Arc<OffsetAllocator>| -> Vec<Option<Allocation>> {
            (0..60).map(|i| a.allocate(sizes(i))).collect()
        };
        let (a, b) = (
            OffsetAllocator::new(64 * 200),
            OffsetAllocator::new(64 * 200),
        );
        let (ra, rb) = (
            OffsetAllocator::new(64 * 200),
            OffsetAllocator::new(64 * 200),
        );
        let (mut xa, mut xb, mut ya, mut yb) = (fill(&a), fill(&b), fill(&ra), fill(&rb));
        for round in 0..3u64 {
            let mut batch = Vec::new();
            for i in (0..60).filter(|i| (i * 7 + round) % 3 == 0) {
                batch.extend(xa[i as usize].take());
                batch.extend(xb[i as usize].take());
                drop(ya[i as usize].take());
                drop(yb[i as usize].take());
            }
            fastrand::shuffle(&mut batch);
            release_all(batch);
            assert_eq!(free_list(&a), free_list(&ra), "round {round}");
            assert_eq!(free_list(&b), free_list(&rb), "round {round}");
            assert_eq!((a.used(), b.used()), (ra.used(), rb.used()));
        }
        assert_eq!(
            (a.used(), a.free_ranges()),
            (0, 1),
            "everything back, coalesced"
        );
        assert_eq!(a.allocate(64 * 200).unwrap().offset(), 0);
    }

    #[test]
    fn a_released_batch_of_a_gated_allocator_waits_at_its_gate() {
        let gate = Arc::new(FreeGate::default());
        let a = OffsetAllocator::gated(64 * 4, Some(Arc::clone(&gate)));
        let plain = OffsetAllocator::new(64 * 2);
        gate.stamp(3);
        let batch = vec![
            a.allocate(64 * 2).unwrap(),
            plain.allocate(64 * 2).unwrap(),
            a.allocate(64 * 2).unwrap(),
        ];
        release_all(batch);
        assert_eq!(gate.held(), 2);
        assert_eq!(a.used(), 64 * 4, "held, not free");
        assert_eq!(
            plain.used(),
            0,
            "the ungated allocator's range is free at once"
        );
        assert_eq!(gate.release_through(3), 2);
        assert_eq!((a.used(), a.free_ranges()), (0, 1));
    }

    #[test]
    fn revive_keeping_makes_the_earlier_allocations_live_again() {
        let a = OffsetAllocator::new(4096);
        let kept = a.allocate(64).unwrap();
        a.mark_dormant();
        assert!(!kept.is_live() && kept.is_dormant());
        assert!(a.allocate(64).is_none(), "nothing handed out while dormant");
        a.revive_keeping();
        assert!(kept.is_live() && !kept.is_dormant());
        a.mark_dormant();
        a.mark_dead();
        assert!(!kept.is_live() && !kept.is_dormant(), "a dead end");
    }

    #[test]
    fn churn_with_partial_frees_coalesces_back_to_one_range() {
        let a = OffsetAllocator::new(1 << 34);
        let rounds = 100_000u32;
        let mut live = Vec::with_capacity(1024);
        for i in 0..rounds {
            live.push(a.allocate(64 + u64::from(i % 97) * 64).unwrap());
            if live.len() == 1024 {
                // free every other handle first to exercise coalescing
                let mut keep = Vec::with_capacity(1024);
                for (j, h) in live.drain(..).enumerate() {
                    if j % 2 == 0 {
                        drop(h);
                    } else {
                        keep.push(h);
                    }
                }
                drop(keep);
            }
        }
        drop(live);
        assert_eq!(a.used(), 0);
        assert_eq!(a.free_ranges(), 1);
    }
}
