//! Per-segment offset allocator: best fit over free ranges, coalescing on free, sizes rounded
//! up to [`ALIGNMENT`]. Allocations are RAII [`Allocation`] handles.
//!
//! Thread-safety: the free lists sit behind one `parking_lot::Mutex` per allocator, a leaf
//! lock (nothing else is locked while it is held). Used bytes are mirrored in an atomic so
//! readers never take the lock.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
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

/// The allocator of one mounted segment: hands out ranges of `[0, capacity)`.
pub struct OffsetAllocator {
    capacity: u64,
    /// Cleared (under the `ranges` lock) when the segment is unmounted; read lock-free.
    alive: AtomicBool,
    /// Mount generation: bumped (under the `ranges` lock) when a dead allocator is revived
    /// for a remount, so allocations of the earlier mount are no longer live.
    generation: AtomicU64,
    used: AtomicU64,
    ranges: Mutex<FreeRanges>,
}

impl OffsetAllocator {
    /// An allocator over `size` bytes (rounded down to [`ALIGNMENT`]), all free.
    pub fn new(size: u64) -> Arc<OffsetAllocator> {
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
            alive: AtomicBool::new(true),
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
        self.used.fetch_add(rounded, Ordering::Relaxed);
        let generation = self.generation.load(Ordering::Relaxed);
        drop(ranges);
        Some(Allocation {
            allocator: Arc::clone(self),
            offset,
            size: rounded,
            generation,
        })
    }

    /// Returns a range, also while the allocator is dead: a revived allocator must know
    /// which ranges of the earlier mount are still held.
    fn free(&self, freed_offset: u64, freed_size: u64) {
        let mut ranges = self.ranges.lock();
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
        self.used.fetch_sub(freed_size, Ordering::Relaxed);
    }

    /// Marks the allocator dead (segment unmounted): no more allocations and no allocation
    /// is live. Handles still out (pins, deferred frees) keep their ranges reserved until
    /// dropped, so a later [`OffsetAllocator::revive`] never hands them out again.
    pub(crate) fn mark_dead(&self) {
        let _ranges = self.ranges.lock();
        self.alive.store(false, Ordering::Release);
    }

    /// Brings a dead allocator back for a remount of the same segment: allocations of the
    /// earlier mount stay reserved but are no longer live (their replicas are unreadable).
    pub(crate) fn revive(&self) {
        let _ranges = self.ranges.lock();
        self.generation.fetch_add(1, Ordering::Relaxed);
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
        self.allocator.is_alive()
            && self.allocator.generation.load(Ordering::Acquire) == self.generation
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.allocator.free(self.offset, self.size);
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
