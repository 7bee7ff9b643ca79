//! Counters of the P2P paths, kept lock-free and readable as a [`P2pCounters`] snapshot
//! (locally through `P2pClient::counters`, remotely through the owner's `counters` RPC).

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! p2p_counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// A snapshot of the P2P counters of one client (owner and accessor roles). Plain data.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct P2pCounters {
            $( $(#[$doc])* pub $name: u64, )*
            /// Live PendingWriteRecords (gauge).
            pub pending_records: u64,
            /// Live PinnedKeyRecords (gauge).
            pub pin_records: u64,
            /// Bytes allocated in the tiers (gauge).
            pub tier_bytes_used: u64,
            /// Owner allocations held in quarantine, not yet reusable (gauge): expired or
            /// revoked PreWrites, removed values whose readers' leases have not ended.
            pub quarantined_allocations: u64,
        }

        /// The live counters.
        #[derive(Default)]
        pub(crate) struct Counters {
            $( pub(crate) $name: AtomicU64, )*
        }

        impl Counters {
            /// The counters' values; the gauges are left 0 for the caller to fill.
            pub(crate) fn snapshot(&self) -> P2pCounters {
                P2pCounters {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                    ..P2pCounters::default()
                }
            }
        }
    };
}

p2p_counters! {
    /// PendingWriteRecords created (FORWARD PreWrite and REVERSE writes).
    pending_created,
    /// Pending writes committed.
    pending_committed,
    /// Pending writes revoked by WriteRevoke (or a failed REVERSE pull).
    pending_revoked,
    /// Pending records reclaimed by the background scan.
    pending_reclaimed_by_scan,
    /// Expired pending records removed by a stage RPC that met them.
    pending_reclaimed_in_stage,
    /// PinnedKeyRecords created.
    pins_created,
    /// Pins renewed by another reader (record shared).
    pins_renewed,
    /// Pins released by UnPinKey.
    pins_released,
    /// Pin records reclaimed by the background scan.
    pins_reclaimed_by_scan,
    /// Expired pin records removed by a stage RPC that met them.
    pins_reclaimed_in_stage,
    /// Stage RPCs refused for a stale operation id.
    stale_operations_rejected,
    /// REVERSE writes served (owner pulled the value).
    reverse_writes_served,
    /// REVERSE reads served (owner pushed the value).
    reverse_reads_served,
    /// Puts by this accessor over the FORWARD path.
    forward_puts,
    /// Gets by this accessor over the FORWARD path.
    forward_gets,
    /// Puts by this accessor over the REVERSE path.
    reverse_puts,
    /// Gets by this accessor over the REVERSE path.
    reverse_gets,
    /// Puts and gets served by this client's own backend (same process, no RPC).
    local_ops,
    /// WriteRevoke RPCs sent (retries included).
    revokes_sent,
    /// UnPinKey RPCs sent (retries included).
    unpins_sent,
    /// Copies through the REVERSE staging buffer.
    staging_copies,
    /// REVERSE staging slots held in quarantine because their item failed in transfer.
    staging_quarantined,
    /// REVERSE items this owner did not transfer because the accessor's deadline
    /// (`valid_for_ms` from receipt) had passed before they started.
    reverse_late_refused,
}

/// Adds 1 to `counter`.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
