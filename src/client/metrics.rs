//! Client operation counters, readable as a snapshot (and as JSON through the C API).

use super::core::Client;
use crate::transfer::TransferMetrics;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters; updated with relaxed atomics on every operation.
#[derive(Default)]
pub(super) struct ClientCounters {
    pub(super) objects_written: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) objects_read: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) staging_copies: AtomicU64,
    pub(super) staging_copy_bytes: AtomicU64,
    pub(super) failed_ops: AtomicU64,
}

impl ClientCounters {
    pub(super) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }
}

/// A snapshot of a client's counters.
#[derive(Clone, Debug, Serialize)]
pub struct ClientMetrics {
    /// Objects successfully written (put/upsert, counted once per key).
    pub objects_written: u64,
    /// Logical bytes of those objects (not multiplied by replicas).
    pub bytes_written: u64,
    /// Objects successfully read.
    pub objects_read: u64,
    /// Bytes of those reads.
    pub bytes_read: u64,
    /// Copies into the local buffer made by the copying `put` family.
    pub staging_copies: u64,
    /// Bytes of those copies.
    pub staging_copy_bytes: u64,
    /// Per-key operations that failed.
    pub failed_ops: u64,
    /// Transfer engine counters (copies and bytes per path).
    pub transfer: TransferMetrics,
}

impl Client {
    /// A snapshot of this client's counters.
    pub fn metrics(&self) -> ClientMetrics {
        let c = &self.core.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientMetrics {
            objects_written: get(&c.objects_written),
            bytes_written: get(&c.bytes_written),
            objects_read: get(&c.objects_read),
            bytes_read: get(&c.bytes_read),
            staging_copies: get(&c.staging_copies),
            staging_copy_bytes: get(&c.staging_copy_bytes),
            failed_ops: get(&c.failed_ops),
            transfer: self.core.engine.metrics(),
        }
    }
}
