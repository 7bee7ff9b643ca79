//! Deferred frees: allocations (and SSD tier records) that must outlive their key (a read
//! lease still running, or an abandoned writer that may still be writing) and are dropped
//! when their time comes.
//!
//! Thread-safety: one `parking_lot::Mutex`, a leaf lock; due allocations are dropped after it
//! is released.

use super::disk_tiers::DiskHold;
use super::replicas::Range;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What one group holds (never read: dropping it releases the ranges, or the disk record).
enum Held {
    Ranges { _ranges: Vec<Range> },
    Disk { _record: Arc<DiskHold> },
}

/// Groups of held things keyed by (deadline, sequence number).
type Queue = BTreeMap<(Instant, u64), Held>;

/// Allocations held until a deadline.
#[derive(Default)]
pub(crate) struct DeferredFrees {
    seq: AtomicU64,
    queue: Mutex<Queue>,
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
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.queue.lock().insert((due, seq), held);
    }

    /// Drops every group whose deadline is at or before `now`; returns how many groups.
    pub(crate) fn release_due(&self, now: Instant) -> usize {
        let due = {
            let mut queue = self.queue.lock();
            let later = queue.split_off(&(now, u64::MAX));
            std::mem::replace(&mut *queue, later)
        };
        due.len()
    }

    /// Groups waiting.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().len()
    }
}
