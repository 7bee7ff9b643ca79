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
    /// registered memory, zero size, unknown opcode).
    rejected_requests,
    /// Requests (local or remote) that this engine initiated and that failed.
    failed_requests,
    /// Outgoing TCP connections opened.
    connections_opened,
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
