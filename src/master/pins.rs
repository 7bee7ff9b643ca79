//! Pin records: each pin holds the pinned object's allocations, so its bytes cannot be freed
//! or reused while the pin exists, whatever happens to the key.
//!
//! Thread-safety: one `parking_lot::Mutex`; it may be taken while a shard lock is held, never
//! the other way round. Records are returned to the caller and dropped outside the lock.

use crate::alloc::Allocation;
use crate::types::ClientId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One pin.
pub(crate) struct PinRecord {
    /// Client that took the pin (the only one that may release it).
    pub client: ClientId,
    /// Pinned key.
    pub key: String,
    /// Generation of the object pinned (a key may be re-created).
    pub object_id: u64,
    /// Keeps the bytes allocated (never read: dropping the record releases them).
    pub _allocations: Vec<Arc<Allocation>>,
    /// Keeps the SSD tier record of a value on disk (deleted only once released).
    pub _disk: Option<Arc<super::disk_tiers::DiskHold>>,
}

/// All live pins by id.
pub(crate) struct PinTable {
    next_id: AtomicU64,
    pins: Mutex<HashMap<u64, PinRecord>>,
}

impl Default for PinTable {
    fn default() -> Self {
        PinTable {
            next_id: AtomicU64::new(1),
            pins: Mutex::new(HashMap::new()),
        }
    }
}

impl PinTable {
    /// Stores `record`; returns its unique id.
    pub(crate) fn insert(&self, record: PinRecord) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pins.lock().insert(id, record);
        id
    }

    /// Removes and returns the pins among `ids` that `client` owns; others are left alone.
    pub(crate) fn take(&self, client: ClientId, ids: &[u64]) -> Vec<PinRecord> {
        let mut pins = self.pins.lock();
        let mut taken = Vec::new();
        for id in ids {
            if pins.get(id).is_some_and(|pin| pin.client == client) {
                taken.extend(pins.remove(id));
            }
        }
        taken
    }

    /// Removes and returns every pin `client` owns.
    pub(crate) fn take_client(&self, client: ClientId) -> Vec<PinRecord> {
        let mut pins = self.pins.lock();
        let ids: Vec<u64> = pins
            .iter()
            .filter(|(_, pin)| pin.client == client)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| pins.remove(id)).collect()
    }

    /// Pins held.
    pub(crate) fn len(&self) -> usize {
        self.pins.lock().len()
    }
}
