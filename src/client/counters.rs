//! The client's live counters (atomics bumped on every operation); `metrics.rs` turns them
//! into a [`super::ClientMetrics`] snapshot. Thread-safe: relaxed atomics, read without locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Live counters; updated with relaxed atomics on every operation.
#[derive(Default)]
pub(super) struct ClientCounters {
    pub(super) objects_written: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) objects_read: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) get_buffer_ops: AtomicU64,
    pub(super) get_buffer_bytes: AtomicU64,
    pub(super) failed_ops: AtomicU64,
    /// Master calls made (RPCs, or direct calls to an embedded master).
    pub(super) master_calls: Arc<AtomicU64>,
}

impl ClientCounters {
    pub(super) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}
