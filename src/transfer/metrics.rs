//! Transfer counters: lock-free atomics updated on the hot path, read as a serialisable
//! snapshot ([`TransferMetrics`]).

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// A point-in-time copy of the engine's counters. Request counters count whole
        /// [`TransferRequest`](super::TransferRequest)s on the initiating side and wire
        /// requests (one per slice) on the serving side. Byte counters count payload bytes.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct TransferMetrics {
            $( $(#[$doc])* pub $name: u64, )*
        }

        /// The live counters behind [`TransferMetrics`]. Thread-safe; share by `Arc`.
        #[derive(Debug, Default)]
        pub(crate) struct Metrics {
            $( pub(crate) $name: AtomicU64, )*
        }

        impl Metrics {
            /// Reads every counter (each individually atomic; the set is not a transaction).
            pub(crate) fn snapshot(&self) -> TransferMetrics {
                TransferMetrics { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Requests completed by a local copy.
    local_copies,
    /// READ requests completed by one copy from a same-host peer's mapped segment.
    same_host_reads,
    /// Bytes of those reads.
    same_host_read_bytes,
    /// WRITE requests completed by one copy into a same-host peer's mapped segment.
    same_host_writes,
    /// Bytes of those writes.
    same_host_write_bytes,
    /// Same-host peers whose segment this engine mapped after a handshake that named the
    /// replica's epoch.
    same_host_handshakes,
    /// Same-host handshakes that failed or were refused (no owner socket — another network
    /// namespace, an old peer, `MC_SAME_HOST=0` there —, another epoch, nothing exported):
    /// those requests went over TCP.
    same_host_refusals,
    /// Cached same-host mappings dropped because their mount was retired, their owner closed
    /// the connection, or a request named another epoch.
    same_host_mappings_dropped,
    /// Same-host copies failed `STALE_SEGMENT_EPOCH` because the owner retired the mount
    /// before or during them (also counted in `stale_epoch_rejections`).
    same_host_stale,
    /// Same-host copies failed `TRANSFER_FAIL` because the peer's segment (or control file)
    /// lost pages under our mapping: a hole punched in it that the kernel could not refill
    /// faulted, and the SIGBUS guard (`shm::fault_guard`) finished the copy on scratch pages.
    lost_page_copies,
    /// Bytes moved by local copies.
    local_copy_bytes,
    /// READ requests completed over TCP.
    tcp_reads,
    /// Bytes received by completed TCP READ requests.
    tcp_read_bytes,
    /// WRITE requests completed over TCP.
    tcp_writes,
    /// Bytes sent by completed TCP WRITE requests.
    tcp_write_bytes,
    /// Wire READ requests this engine's server accepted and answered (counted before the
    /// data is sent, so the initiator never sees its transfer complete before the count).
    served_reads,
    /// Bytes this engine's server sent for READ requests.
    served_read_bytes,
    /// Wire WRITE requests whose payload this engine's server applied (counted before the
    /// OK status is sent).
    served_writes,
    /// Bytes this engine's server received for WRITE requests.
    served_write_bytes,
    /// Wire requests this engine's server refused (address outside the remotely accessible
    /// registered memory, zero size, unknown opcode, stale segment epoch).
    rejected_requests,
    /// Requests refused because the segment epoch they named is not the current epoch of
    /// the registered range: wire requests refused by this engine's server and local
    /// copies refused by this engine. Nothing was read or written for them.
    stale_epoch_rejections,
    /// Stream copies queued against a mount of this engine's registered memory that hold
    /// it now ([`TransferEngine::hold_mount`](super::TransferEngine::hold_mount); a gauge).
    segment_holds,
    /// Remounts (epoch switches) that found the current mount still held by queued stream
    /// copies past their wait and were refused `TRY_AGAIN`, to be tried again later.
    remounts_deferred,
    /// Wire requests this engine's server gave up on because their header or WRITE payload
    /// had not arrived by the deadline (arrival of the header's first byte plus
    /// `MC_TRANSFER_TIMEOUT_MS`); the connection was closed abortively and no later byte of
    /// it was applied.
    expired_requests,
    /// Slices this engine did not start because their request's `send_by` had passed (the
    /// writer's grant or lease ended); they failed with `STALE_WRITE_TOKEN`.
    late_sends_refused,
    /// Incoming connections this engine's server reset at once, without reading from them,
    /// because it already held `MC_TRANSFER_MAX_CONNECTIONS` connections, or
    /// `MC_TRANSFER_MAX_CONNECTIONS_PER_PEER` from the same peer IP address.
    refused_connections,
    /// Connections this engine's server closed because no request arrived on them for
    /// `MC_TRANSFER_IDLE_TIMEOUT_MS`.
    idle_closed,
    /// Requests (local or remote) that this engine initiated and that failed.
    failed_requests,
    /// Outgoing TCP connections opened.
    connections_opened,
    /// Copies through a pinned bounce buffer for device memory sent or received over TCP
    /// (device → bounce before a send, bounce → device after a receive).
    device_staging_copies,
    /// Bytes of those copies.
    device_staging_bytes,
    /// Slices (parts of requests) completed by RDMA READ work requests.
    rdma_read_slices,
    /// Bytes of those slices.
    rdma_read_bytes,
    /// Slices completed by RDMA WRITE work requests.
    rdma_write_slices,
    /// Bytes of those slices.
    rdma_write_bytes,
    /// Copies between caller memory and a registered RDMA bounce buffer (caller memory not
    /// registered with the NIC, or device memory).
    rdma_bounce_copies,
    /// Bytes of those copies.
    rdma_bounce_bytes,
    /// Bytes RDMA moved straight into or out of device memory registered with the NIC
    /// (GPUDirect: no staging copy).
    rdma_gpudirect_bytes,
    /// Queue pairs this engine connected to peers (handshakes it initiated).
    rdma_connections,
    /// Queue pairs this engine's server connected for peers (handshakes it answered).
    rdma_served_connections,
}

/// Adds one event of `bytes` bytes to a count/bytes counter pair.
pub(crate) fn add(count: &AtomicU64, bytes_counter: &AtomicU64, bytes: u64) {
    count.fetch_add(1, Ordering::Relaxed);
    bytes_counter.fetch_add(bytes, Ordering::Relaxed);
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The data path a completed request took (the rows of the zero-copy table). Reads and
/// writes are seen from this process: "local segment" is registered memory of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    HostToLocalSegment,
    DeviceToLocalSegment,
    RegisteredToRemote,
    UnregisteredToRemote,
    DeviceToRemote,
    LocalSegmentToHost,
    LocalSegmentToDevice,
    RemoteToHost,
    RemoteToDevice,
    HostToPeerSegment,
    DeviceToPeerSegment,
    PeerSegmentToHost,
    PeerSegmentToDevice,
}

impl Path {
    /// Whether the path is a copy through a same-host peer's mapped segment.
    pub(crate) fn is_same_host(self) -> bool {
        matches!(
            self,
            Path::HostToPeerSegment
                | Path::DeviceToPeerSegment
                | Path::PeerSegmentToHost
                | Path::PeerSegmentToDevice
        )
    }
}

/// One path's totals: completed requests, their payload bytes, and the bytes this process
/// copied locally for them (`copied_bytes / bytes` = local copies per byte; socket I/O is
/// not a local copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PathStats {
    /// Completed requests.
    pub ops: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Bytes copied locally (CPU memcpy or device driver copy) for them.
    pub copied_bytes: u64,
}

macro_rules! paths {
    ($( $(#[$doc:meta])* $field:ident = $path:ident, )*) => {
        /// Per-path counters (see [`PathStats`]), a snapshot.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct CopyPaths {
            $( $(#[$doc])* pub $field: PathStats, )*
        }

        /// The live per-path counters. Thread-safe.
        #[derive(Debug, Default)]
        pub(crate) struct PathCounters {
            $( $field: [AtomicU64; 3], )*
        }

        impl PathCounters {
            fn slot(&self, path: Path) -> &[AtomicU64; 3] {
                match path { $( Path::$path => &self.$field, )* }
            }

            pub(crate) fn snapshot(&self) -> CopyPaths {
                let read = |c: &[AtomicU64; 3]| PathStats {
                    ops: c[0].load(Ordering::Relaxed),
                    bytes: c[1].load(Ordering::Relaxed),
                    copied_bytes: c[2].load(Ordering::Relaxed),
                };
                CopyPaths { $( $field: read(&self.$field), )* }
            }
        }
    };
}

paths! {
    /// Host memory → this process's segment (put): one CPU copy.
    host_to_local_segment = HostToLocalSegment,
    /// Device memory → this process's segment (put): one driver copy (device → pinned).
    device_to_local_segment = DeviceToLocalSegment,
    /// Registered host buffer → remote segment: no local copy.
    registered_to_remote = RegisteredToRemote,
    /// Unregistered host buffer → remote segment: no local copy over TCP (only a transport
    /// that needs registered memory, such as RDMA, would stage it).
    unregistered_to_remote = UnregisteredToRemote,
    /// Device memory → remote segment: one driver copy into a pinned bounce buffer.
    device_to_remote = DeviceToRemote,
    /// This process's segment → host memory (get): one CPU copy.
    local_segment_to_host = LocalSegmentToHost,
    /// This process's segment → device memory (get): one driver copy.
    local_segment_to_device = LocalSegmentToDevice,
    /// Remote segment → host memory: received in place, no local copy.
    remote_to_host = RemoteToHost,
    /// Remote segment → device memory: one driver copy from the bounce buffer.
    remote_to_device = RemoteToDevice,
    /// Host memory → a same-host peer's mapped segment: one CPU copy, no socket.
    host_to_peer_segment = HostToPeerSegment,
    /// Device memory → a same-host peer's mapped segment: one driver copy.
    device_to_peer_segment = DeviceToPeerSegment,
    /// A same-host peer's mapped segment → host memory: one CPU copy, no socket.
    peer_segment_to_host = PeerSegmentToHost,
    /// A same-host peer's mapped segment → device memory: one driver copy.
    peer_segment_to_device = PeerSegmentToDevice,
}

impl PathCounters {
    /// Counts one completed request on `path`.
    pub(crate) fn record(&self, path: Path, bytes: u64, copied_bytes: u64) {
        let slot = self.slot(path);
        slot[0].fetch_add(1, Ordering::Relaxed);
        slot[1].fetch_add(bytes, Ordering::Relaxed);
        slot[2].fetch_add(copied_bytes, Ordering::Relaxed);
    }
}
