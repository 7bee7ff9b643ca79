//! Master counters and their snapshot ([`MasterMetrics`]), with a Prometheus text rendering.

use super::stripes::StripedCounter;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic event counters, updated lock-free by the service.
#[derive(Default)]
pub(crate) struct Counters {
    pub evicted_objects: AtomicU64,
    pub evicted_bytes: AtomicU64,
    /// Bumped by every read (the hottest path): striped.
    pub leases_granted: StripedCounter,
    pub pins_released: AtomicU64,
    pub clients_expired: AtomicU64,
    pub table_scans: AtomicU64,
    pub scan_removed: AtomicU64,
    pub scan_slots: AtomicU64,
    pub demotions_started: AtomicU64,
    pub demotions_committed: AtomicU64,
    pub demotions_failed: AtomicU64,
    pub demotions_refused: AtomicU64,
    pub demotions_expired: AtomicU64,
    pub disk_replicas_lost: AtomicU64,
    pub demotions_skipped: AtomicU64,
    pub disk_objects_refused: AtomicU64,
    pub disk_evicted_objects: AtomicU64,
    pub disk_evicted_bytes: AtomicU64,
    pub offloads_started: AtomicU64,
    pub offloads_committed: AtomicU64,
    pub offloads_failed: AtomicU64,
    pub offloads_skipped: AtomicU64,
    pub memory_released: AtomicU64,
    pub promotions_started: AtomicU64,
    pub promotions_committed: AtomicU64,
    pub promotions_failed: AtomicU64,
    pub promotions_skipped: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Usage of one mounted segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentMetrics {
    /// Segment name (owner's hostname).
    pub name: String,
    /// Segment id.
    pub id: String,
    /// Allocated bytes (64-byte rounded sizes).
    pub used_bytes: u64,
    /// Usable capacity.
    pub total_bytes: u64,
}

/// A point-in-time snapshot of the master's state and counters. Plain data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MasterMetrics {
    /// Cluster name from the configuration.
    pub cluster_id: String,
    /// Keys in the object table (readable or being written).
    pub objects: u64,
    /// P2P mode: keys routed to owner clients.
    pub p2p_keys: u64,
    /// P2P mode: keys of expired owners they may still reclaim (see `route_claims`).
    pub p2p_claimed_keys: u64,
    /// Allocated bytes over all segments.
    pub bytes_used: u64,
    /// Capacity over all segments.
    pub bytes_total: u64,
    /// Per-segment usage.
    pub segments: Vec<SegmentMetrics>,
    /// Objects evicted so far.
    pub evicted_objects: u64,
    /// Bytes (allocated) evicted so far.
    pub evicted_bytes: u64,
    /// Read leases granted or extended so far.
    pub leases_granted: u64,
    /// Pins currently held.
    pub active_pins: u64,
    /// Pins released so far (unpin or client expiry).
    pub pins_released: u64,
    /// Clients currently considered alive.
    pub clients_alive: u64,
    /// Clients expired so far.
    pub clients_expired: u64,
    /// Groups of ranges waiting for a lease or timeout before being freed.
    pub deferred_frees_pending: u64,
    /// Whole-table scans by the eviction and reclaim rounds so far.
    pub table_scans: u64,
    /// Objects removed by `remove_all` and `remove_by_regex` so far (advances slice by slice
    /// while one runs: its progress).
    pub scan_removed: u64,
    /// Table slots `remove_all` and `remove_by_regex` visited so far (a scan answered
    /// `TRY_AGAIN` resumes where it stopped: about one visit per slot per whole scan).
    pub scan_slots: u64,
    /// Segments recovered from the journal still waiting for their owners to re-attach.
    pub recovered_segments_waiting: u64,
    /// Objects the journal gave back at start.
    pub recovered_objects: u64,
    /// The journal's counters (`None`: no `--journal_dir`).
    pub journal: Option<crate::master::JournalMetrics>,
    /// The SSD tier's counters.
    pub disk: DiskTierMetrics,
    /// The location caches' leases (`docs/location-cache.md`).
    pub location_cache: LocationCacheMetrics,
}

/// Location-cache leases at the master (`docs/location-cache.md`). Plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LocationCacheMetrics {
    /// Cached leases granted (a client became or stayed a holder of a key).
    pub holders_granted: u64,
    /// Revocations sent to holders.
    pub revocations_sent: u64,
    /// Revocations the holders acknowledged.
    pub revocations_acked: u64,
    /// Revocations a writer stopped waiting for because the holder's cached lease ran out
    /// (a holder that did not answer in time: partitioned, stopped or slow).
    pub revocations_expired: u64,
    /// `await_revocations` calls that had to wait, and their total wait in microseconds.
    pub writes_waited: u64,
    pub write_wait_us: u64,
    /// Keys clients asked to renew ahead of their cached lease's end (`renew_locations`),
    /// and those refused because the segments were above the eviction high watermark.
    pub renewals: u64,
    pub renewals_refused: u64,
}

impl LocationCacheMetrics {
    fn series(&self) -> Vec<(&'static str, &'static str, &'static str, u64)> {
        vec![
            (
                "location_cache_holders_granted_total",
                "counter",
                "Cached location leases granted",
                self.holders_granted,
            ),
            (
                "location_cache_revocations_sent_total",
                "counter",
                "Location cache revocations sent",
                self.revocations_sent,
            ),
            (
                "location_cache_revocations_acked_total",
                "counter",
                "Location cache revocations acknowledged",
                self.revocations_acked,
            ),
            (
                "location_cache_revocations_expired_total",
                "counter",
                "Location cache revocations that ran out unacknowledged",
                self.revocations_expired,
            ),
            (
                "location_cache_writes_waited_total",
                "counter",
                "Revocation waits that had to wait",
                self.writes_waited,
            ),
            (
                "location_cache_write_wait_us_total",
                "counter",
                "Microseconds writers waited for revocations",
                self.write_wait_us,
            ),
            (
                "location_cache_renewals_total",
                "counter",
                "Keys location caches asked to renew ahead of expiry",
                self.renewals,
            ),
            (
                "location_cache_renewals_refused_total",
                "counter",
                "Renewals refused above the eviction high watermark",
                self.renewals_refused,
            ),
        ]
    }
}

/// The SSD tier as the master sees it (`docs/ssd-tier.md`). Plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiskTierMetrics {
    /// Demotions of evicted objects to an owner's disk tier started so far.
    pub demotions_started: u64,
    /// Demotions whose record was committed (the object moved to disk).
    pub demotions_committed: u64,
    /// Demotions the owner could not write (disk full, I/O error): the object was evicted.
    pub demotions_failed: u64,
    /// Demotion reports refused (the object changed, or the demotion was given up).
    pub demotions_refused: u64,
    /// Demotions given up after `DEMOTION_TIMEOUT` without a report.
    pub demotions_expired: u64,
    /// Demotions in flight now.
    pub demotions_in_flight: u64,
    /// Disk replicas an owner reported unreadable (forgotten).
    pub disk_replicas_lost: u64,
    /// Evicted objects dropped because their owner's tier was full of leased or pinned
    /// records.
    pub demotions_skipped: u64,
    /// Objects evicted from a disk tier to make room (oldest first).
    pub disk_evicted_objects: u64,
    /// Their value bytes.
    pub disk_evicted_bytes: u64,
    /// Records an owner held that the master did not list (the owner deleted them).
    pub disk_objects_refused: u64,
    /// Write-through copies (`offload_at_put`) started at the end of a write.
    pub offloads_started: u64,
    /// Write-through copies committed: the object is in memory and on disk.
    pub offloads_committed: u64,
    /// Write-through copies the owner could not write (the object stays in memory only).
    pub offloads_failed: u64,
    /// Writes not copied at their end because the owner's tier was busy or had no room
    /// (they are demoted when evicted, as without write-through).
    pub offloads_skipped: u64,
    /// Evicted objects that had a disk copy already: only their memory was freed.
    pub memory_released: u64,
    /// Promotions of objects on disk only back into memory (`promotion_on_hit`) started.
    pub promotions_started: u64,
    /// Promotions committed: the object is in memory and on disk.
    pub promotions_committed: u64,
    /// Promotions the owner could not load, or whose object changed meanwhile.
    pub promotions_failed: u64,
    /// Promotions not started: the owner's segment had no room or its tier was busy.
    pub promotions_skipped: u64,
}

impl DiskTierMetrics {
    /// Prometheus series: (name, type, help, value).
    fn series(&self) -> Vec<(&'static str, &'static str, &'static str, u64)> {
        vec![
            (
                "demotions_started_total",
                "counter",
                "Demotions to disk started",
                self.demotions_started,
            ),
            (
                "demotions_committed_total",
                "counter",
                "Demotions committed to disk",
                self.demotions_committed,
            ),
            (
                "demotions_failed_total",
                "counter",
                "Demotions the owner could not write",
                self.demotions_failed,
            ),
            (
                "demotions_refused_total",
                "counter",
                "Demotion reports refused",
                self.demotions_refused,
            ),
            (
                "demotions_expired_total",
                "counter",
                "Demotions given up unreported",
                self.demotions_expired,
            ),
            (
                "demotions_in_flight",
                "gauge",
                "Demotions in flight",
                self.demotions_in_flight,
            ),
            (
                "disk_replicas_lost_total",
                "counter",
                "Disk replicas reported unreadable",
                self.disk_replicas_lost,
            ),
            (
                "demotions_skipped_total",
                "counter",
                "Evictions dropped: the owner's tier was full",
                self.demotions_skipped,
            ),
            (
                "disk_evicted_objects_total",
                "counter",
                "Objects evicted from a disk tier to make room",
                self.disk_evicted_objects,
            ),
            (
                "disk_evicted_bytes_total",
                "counter",
                "Value bytes evicted from a disk tier",
                self.disk_evicted_bytes,
            ),
            (
                "disk_objects_refused_total",
                "counter",
                "Disk records refused at a tier mount",
                self.disk_objects_refused,
            ),
            (
                "offloads_started_total",
                "counter",
                "Write-through copies to disk started at the end of a write",
                self.offloads_started,
            ),
            (
                "offloads_committed_total",
                "counter",
                "Write-through copies committed to disk",
                self.offloads_committed,
            ),
            (
                "offloads_failed_total",
                "counter",
                "Write-through copies the owner could not write",
                self.offloads_failed,
            ),
            (
                "offloads_skipped_total",
                "counter",
                "Writes not copied to disk at their end: the tier was busy or full",
                self.offloads_skipped,
            ),
            (
                "memory_released_total",
                "counter",
                "Evictions that freed only memory: the object stays on disk",
                self.memory_released,
            ),
            (
                "promotions_started_total",
                "counter",
                "Promotions of objects on disk only back into memory started",
                self.promotions_started,
            ),
            (
                "promotions_committed_total",
                "counter",
                "Promotions committed: the object is in memory again",
                self.promotions_committed,
            ),
            (
                "promotions_failed_total",
                "counter",
                "Promotions not loaded, or whose object changed meanwhile",
                self.promotions_failed,
            ),
            (
                "promotions_skipped_total",
                "counter",
                "Promotions not started: no room in the owner's segment, or its tier busy",
                self.promotions_skipped,
            ),
        ]
    }
}

/// A per-segment series: name, help text and the value it reads.
type SegmentSeries = (&'static str, &'static str, fn(&SegmentMetrics) -> u64);

fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl MasterMetrics {
    /// Prometheus text exposition (`mooncake_master_*` names; per-segment series labelled
    /// `segment` and `id`).
    pub fn prometheus_text(&self) -> String {
        let mut out = String::new();
        let cluster = escape_label(&self.cluster_id);
        let mut scalars: Vec<(&str, &str, &str, u64)> = vec![
            ("objects", "gauge", "Keys in the object table", self.objects),
            (
                "p2p_keys",
                "gauge",
                "Keys routed to P2P owners",
                self.p2p_keys,
            ),
            (
                "p2p_claimed_keys",
                "gauge",
                "Keys of expired P2P owners they may still reclaim",
                self.p2p_claimed_keys,
            ),
            (
                "bytes_used",
                "gauge",
                "Allocated bytes over all segments",
                self.bytes_used,
            ),
            (
                "bytes_total",
                "gauge",
                "Capacity over all segments",
                self.bytes_total,
            ),
            (
                "evicted_objects_total",
                "counter",
                "Objects evicted",
                self.evicted_objects,
            ),
            (
                "evicted_bytes_total",
                "counter",
                "Bytes evicted",
                self.evicted_bytes,
            ),
            (
                "leases_granted_total",
                "counter",
                "Read leases granted",
                self.leases_granted,
            ),
            ("active_pins", "gauge", "Pins held", self.active_pins),
            (
                "pins_released_total",
                "counter",
                "Pins released",
                self.pins_released,
            ),
            (
                "clients_alive",
                "gauge",
                "Clients alive",
                self.clients_alive,
            ),
            (
                "clients_expired_total",
                "counter",
                "Clients expired",
                self.clients_expired,
            ),
            (
                "deferred_frees_pending",
                "gauge",
                "Deferred frees waiting",
                self.deferred_frees_pending,
            ),
            (
                "table_scans_total",
                "counter",
                "Whole-table scans by eviction and reclaim",
                self.table_scans,
            ),
            (
                "scan_removed_total",
                "counter",
                "Objects removed by remove_all and remove_by_regex (advances during a scan)",
                self.scan_removed,
            ),
            (
                "scan_slots_visited_total",
                "counter",
                "Table slots visited by remove_all and remove_by_regex",
                self.scan_slots,
            ),
            (
                "recovered_segments_waiting",
                "gauge",
                "Recovered segments waiting for their owners",
                self.recovered_segments_waiting,
            ),
            (
                "recovered_objects",
                "gauge",
                "Objects recovered from the journal at start",
                self.recovered_objects,
            ),
        ];
        if let Some(journal) = &self.journal {
            scalars.extend(journal.series());
        }
        scalars.extend(self.disk.series());
        scalars.extend(self.location_cache.series());
        for (name, kind, help, value) in scalars {
            let _ = writeln!(out, "# HELP mooncake_master_{name} {help}");
            let _ = writeln!(out, "# TYPE mooncake_master_{name} {kind}");
            let _ = writeln!(
                out,
                "mooncake_master_{name}{{cluster=\"{cluster}\"}} {value}"
            );
        }
        let per_segment: [SegmentSeries; 2] = [
            ("segment_used_bytes", "Allocated bytes per segment", |s| {
                s.used_bytes
            }),
            ("segment_total_bytes", "Capacity per segment", |s| {
                s.total_bytes
            }),
        ];
        for (name, help, value) in per_segment {
            let _ = writeln!(out, "# HELP mooncake_master_{name} {help}");
            let _ = writeln!(out, "# TYPE mooncake_master_{name} gauge");
            for segment in &self.segments {
                let _ = writeln!(
                    out,
                    "mooncake_master_{name}{{cluster=\"{cluster}\",segment=\"{}\",id=\"{}\"}} {}",
                    escape_label(&segment.name),
                    escape_label(&segment.id),
                    value(segment)
                );
            }
        }
        out
    }
}
