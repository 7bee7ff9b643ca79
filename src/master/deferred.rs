//! Deferred frees: allocations that must outlive their key (a read lease still running, or an
//! abandoned writer that may still be writing) and are dropped when their time comes.
//!
//! Thread-safety: one `parking_lot::Mutex`, a leaf lock; due allocations are dropped after it
//! is released.

use crate::alloc::Allocation;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Groups of allocations keyed by (deadline, sequence number).
type Queue = BTreeMap<(Instant, u64), Vec<Arc<Allocation>>>;

/// Allocations held until a deadline.
#[derive(Default)]
pub(crate) struct DeferredFrees {
    seq: AtomicU64,
    queue: Mutex<Queue>,
}

impl DeferredFrees {
    /// Holds `allocations` until `due`, or drops them now if `due` is not after `now`.
    pub(crate) fn hold_until(&self, due: Instant, now: Instant, allocations: Vec<Arc<Allocation>>) {
        if due <= now || allocations.is_empty() {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.queue.lock().insert((due, seq), allocations);
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
