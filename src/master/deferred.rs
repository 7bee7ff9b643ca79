//! Deferred frees: allocations (and SSD tier records) that must outlive their key (a read
//! lease still running, or an abandoned writer that may still be writing) and are dropped
//! when their time comes.
//!
//! Thread-safety: the queue is split in [`STRIPES`] stripes (`super::stripes`), each behind its own
//! `parking_lot::Mutex` (a leaf lock) on a cache line of its own; a thread always queues into
//! the same stripe, so removals on different threads neither wait for one lock nor share its
//! line. Due allocations are dropped after the stripe's lock is released.

use super::disk_tiers::DiskHold;
use super::replicas::Range;
use super::stripes::{this_threads_stripe, STRIPES};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What one group holds (never read: dropping it releases the ranges, or the disk record).
enum Held {
    Ranges { _ranges: Vec<Range> },
    Disk { _record: Arc<DiskHold> },
}

/// Groups of held things keyed by (deadline, sequence number).
type Queue = BTreeMap<(Instant, u64), Held>;

/// One stripe: its queue and the sequence numbers that keep equal deadlines apart.
#[derive(Default)]
struct Stripe {
    seq: u64,
    queue: Queue,
}

/// A stripe alone on its cache lines.
#[derive(Default)]
#[repr(align(128))]
struct Padded(Mutex<Stripe>);

/// Allocations held until a deadline.
#[derive(Default)]
pub(crate) struct DeferredFrees {
    stripes: [Padded; STRIPES],
}

impl DeferredFrees {
    /// Holds `allocations` until `due`, or drops them now if `due` is not after `now`.
    pub(crate) fn hold_until(&self, due: Instant, now: Instant, allocations: Vec<Range>) {
        if due <= now || allocations.is_empty() {
            return;
        }
        self.queue(
            due,
            Held::Ranges {
                _ranges: allocations,
            },
        );
    }

    /// Holds the disk record `hold` claims until `due` (its deletion is queued when the last
    /// hold goes), or lets it go now if `due` is not after `now`.
    pub(crate) fn hold_disk_until(&self, due: Instant, now: Instant, hold: Arc<DiskHold>) {
        if due > now {
            self.queue(due, Held::Disk { _record: hold });
        }
    }

    fn queue(&self, due: Instant, held: Held) {
        let mut stripe = self.stripes[this_threads_stripe()].0.lock();
        stripe.seq += 1;
        let seq = stripe.seq;
        stripe.queue.insert((due, seq), held);
    }

    /// Drops every group whose deadline is at or before `now`; returns how many groups.
    pub(crate) fn release_due(&self, now: Instant) -> usize {
        let mut released = 0;
        for stripe in &self.stripes {
            let due = {
                let mut stripe = stripe.0.lock();
                let later = stripe.queue.split_off(&(now, u64::MAX));
                std::mem::replace(&mut stripe.queue, later)
            };
            released += due.len();
        }
        released
    }

    /// Groups waiting.
    pub(crate) fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.0.lock().queue.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::OffsetAllocator;
    use std::time::Duration;

    /// Ranges held from several threads (several stripes) come back to their allocator
    /// exactly when their deadline passes, each once, and are counted while they wait.
    #[test]
    fn ranges_held_from_many_threads_are_freed_when_due_and_not_before() {
        let allocator = OffsetAllocator::new(64 * 1024);
        let deferred = DeferredFrees::default();
        let now = Instant::now();
        let (soon, later) = (now + Duration::from_secs(1), now + Duration::from_secs(2));
        std::thread::scope(|scope| {
            for t in 0..2 * STRIPES {
                let (allocator, deferred) = (&allocator, &deferred);
                scope.spawn(move || {
                    let due = if t % 2 == 0 { soon } else { later };
                    let range = Range::Owned(allocator.allocate(64).unwrap());
                    deferred.hold_until(due, now, vec![range]);
                });
            }
        });
        assert_eq!(deferred.len(), 2 * STRIPES);
        assert_eq!(allocator.used(), 64 * 2 * STRIPES as u64);
        assert_eq!(deferred.release_due(now), 0);
        assert_eq!(deferred.release_due(soon), STRIPES);
        assert_eq!(allocator.used(), 64 * STRIPES as u64);
        assert_eq!(deferred.len(), STRIPES);
        assert_eq!(deferred.release_due(later), STRIPES);
        assert_eq!((allocator.used(), deferred.len()), (0, 0));
        // A deadline already passed frees at once.
        deferred.hold_until(
            now,
            now,
            vec![Range::Owned(allocator.allocate(64).unwrap())],
        );
        assert_eq!((allocator.used(), deferred.len()), (0, 0));
    }
}
