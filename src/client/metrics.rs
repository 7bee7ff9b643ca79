//! Client operation counters, readable as a snapshot (and as JSON through the C API).

use super::core::Client;
use super::location_cache::LocationCacheStats;
use crate::device::{DeviceInfo, DeviceStats};
use crate::stream::StreamMetrics;
use crate::transfer::{CopyPaths, TransferMetrics};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// `get_buffer` reads (each exactly one copy into the returned buffer).
    pub get_buffer: GetBufferStats,
    /// Per-key operations that failed.
    pub failed_ops: u64,
    /// Calls this client made to the master (RPCs or embedded calls), heartbeat pings
    /// excluded.
    pub master_calls: u64,
    /// On-stream calls: tickets, copies, pins held, staging in use.
    pub stream: StreamMetrics,
    /// Transfer engine counters.
    pub transfer: TransferMetrics,
    /// Requests, bytes and local copies per data path (the zero-copy table).
    pub paths: CopyPaths,
    /// The process's device runtime.
    pub device_info: DeviceInfo,
    /// Process-wide device counters: copies by route, host registrations.
    pub device: DeviceStats,
    /// This client's SSD tier (`None`: it has none).
    pub ssd: Option<SsdTierMetrics>,
    /// This client's location cache (`docs/location-cache.md`).
    pub location_cache: LocationCacheStats,
}

/// A client's SSD tier (`docs/ssd-tier.md`): what it holds (record files, and the bytes of
/// writes in flight, against its capacity; 0: the filesystem's free space) and what happened
/// since it was opened (records written by demotions, read and verified, found corrupt or
/// missing, writes refused for lack of space, other I/O errors). Plain data.
pub type SsdTierMetrics = crate::storage::DiskStats;

/// `get_buffer` totals: objects, bytes, and bytes copied into the returned buffers (one
/// copy per object: a local memcpy or the socket receive, never a second copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GetBufferStats {
    /// Objects read.
    pub ops: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes copied into the buffers.
    pub copied_bytes: u64,
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
            get_buffer: GetBufferStats {
                ops: get(&c.get_buffer_ops),
                bytes: get(&c.get_buffer_bytes),
                copied_bytes: get(&c.get_buffer_bytes),
            },
            failed_ops: get(&c.failed_ops),
            master_calls: get(&c.master_calls),
            stream: self.core.streams.metrics(),
            transfer: self.core.engine.metrics(),
            paths: self.core.engine.copy_paths(),
            device_info: crate::device::runtime().info(),
            device: DeviceStats::snapshot(),
            ssd: self.core.disk_stats(),
            location_cache: self.core.locations.stats(),
        }
    }
}
