//! Process-wide device counters (the runtime is process-wide too): copies by route,
//! registrations and their failures. Read as a [`DeviceStats`] snapshot.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! device_counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// A snapshot of the process-wide device counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct DeviceStats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        pub(crate) struct Counters {
            $( pub(crate) $name: AtomicU64, )*
        }

        pub(crate) static STATS: Counters = Counters { $( $name: AtomicU64::new(0), )* };

        impl DeviceStats {
            /// Reads every counter (each atomic on its own).
            pub fn snapshot() -> DeviceStats {
                DeviceStats { $( $name: STATS.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

device_counters! {
    /// Copies of caller memory done by the CPU (host ↔ host).
    host_copies,
    /// Bytes of those copies.
    host_copy_bytes,
    /// Of those copies, the ones split across the copy crew (`MC_COPY_THREADS`).
    host_split_copies,
    /// Copies done by the device driver (a side was device memory).
    driver_copies,
    /// Bytes of those copies.
    driver_copy_bytes,
    /// Driver copies that failed.
    driver_copy_failures,
    /// Host ranges registered (pinned) with the runtime.
    host_registrations,
    /// Bytes currently registered.
    host_registered_bytes,
    /// Registrations the runtime refused (non-fatal; copies run at pageable speed).
    host_register_failures,
    /// Registrations skipped: no runtime with host registration, or over
    /// `MC_STORE_PIN_MEMORY_MAX_BYTES`.
    host_register_skipped,
}

pub(crate) fn add(count: &AtomicU64, bytes: &AtomicU64, n: u64) {
    count.fetch_add(1, Ordering::Relaxed);
    bytes.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
