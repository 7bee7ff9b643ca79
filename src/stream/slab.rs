//! Gate and status words: a slab of 8-byte slots allocated once at setup in host memory that
//! is pinned and mapped for the device when a runtime is present, so a device stream can wait
//! on the gate word and a kernel can read the status word.
//!
//! Slot layout: `gate: u32` (the stream waits until it equals the ticket's generation), then
//! `status: i32` (`TICKET_PENDING`, 0, or a negative error code). The host writes both with
//! atomic stores: status first, then the gate with `Release`, so whoever sees the gate open
//! sees the final status.
//!
//! Thread-safety: slots are handed out once at a time ([`GateSlab::take`]) and return to the
//! slab when their [`GateSlot`] drops.

use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;

/// A ticket's status while its data is not yet known to be in place.
pub const TICKET_PENDING: i32 = 1;
const SLOT_BYTES: usize = 8;

/// The slab: `slots` words pairs in one pinned region.
pub(crate) struct GateSlab {
    region: MappedRegion,
    /// Device address of the region's first byte (equal to the host address without a
    /// runtime, or where the runtime maps host memory at the same address).
    device_base: usize,
    free: Mutex<Vec<u32>>,
    /// Generations handed out so far (wrapping; 0 is never used).
    generation: AtomicU32,
}

impl GateSlab {
    /// Allocates `slots` slots. `device_base` maps the region's host address to its device
    /// address (identity for host streams).
    pub(crate) fn new(
        slots: u32,
        device_address: impl Fn(usize) -> std::result::Result<usize, String>,
    ) -> Result<Arc<GateSlab>> {
        if slots == 0 {
            return fail(
                ErrorCode::InvalidParams,
                "the gate slab needs at least one slot",
            );
        }
        let region = MappedRegion::pinned(slots as u64 * SLOT_BYTES as u64, "stream gate words")?;
        let device_base = match device_address(region.addr()) {
            Ok(addr) => addr,
            Err(e) => {
                return fail(
                    ErrorCode::InternalError,
                    format!("no device address for the gate words: {e}"),
                )
            }
        };
        Ok(Arc::new(GateSlab {
            region,
            device_base,
            free: Mutex::new((0..slots).rev().collect()),
            generation: AtomicU32::new(0),
        }))
    }

    /// Takes a free slot, its gate closed and its status pending. `TRY_AGAIN` when every slot
    /// is in use.
    pub(crate) fn take(self: &Arc<Self>) -> Result<GateSlot> {
        let Some(index) = self.free.lock().pop() else {
            return fail(
                ErrorCode::TryAgain,
                "every stream ticket slot is in use (free tickets or raise MC_STREAM_TICKETS)",
            );
        };
        let generation = loop {
            let g = self
                .generation
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            if g != 0 {
                break g;
            }
        };
        let slot = GateSlot {
            slab: self.clone(),
            index,
            generation,
        };
        slot.status().store(TICKET_PENDING, Ordering::Relaxed);
        slot.gate().store(0, Ordering::Release);
        Ok(slot)
    }

    /// Slots currently handed out.
    #[cfg(test)]
    fn in_use(&self, total: u32) -> u32 {
        total - self.free.lock().len() as u32
    }
}

/// One slot, owned by one ticket; returns to the slab on drop.
pub(crate) struct GateSlot {
    slab: Arc<GateSlab>,
    index: u32,
    generation: u32,
}

impl GateSlot {
    fn host_addr(&self) -> usize {
        self.slab.region.addr() + self.index as usize * SLOT_BYTES
    }

    fn gate(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the slab's mapping, alive as long as `self.slab`;
        // only touched through atomics.
        unsafe { &*(self.host_addr() as *const AtomicU32) }
    }

    fn status(&self) -> &AtomicI32 {
        // SAFETY: as `gate`, 4 bytes further.
        unsafe { &*((self.host_addr() + 4) as *const AtomicI32) }
    }

    /// The value the gate word takes when open.
    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }

    /// Host address of the gate word.
    pub(crate) fn gate_host(&self) -> usize {
        self.host_addr()
    }

    /// Device address of the gate word.
    pub(crate) fn gate_device(&self) -> usize {
        self.slab.device_base + self.index as usize * SLOT_BYTES
    }

    /// Device address of the status word.
    pub(crate) fn status_device(&self) -> usize {
        self.gate_device() + 4
    }

    /// Writes the final status, then opens the gate (release order).
    pub(crate) fn open(&self, status: i32) {
        self.status().store(status, Ordering::SeqCst);
        self.gate().store(self.generation, Ordering::Release);
    }

    /// Opens the gate word and leaves the status word as it is (written later, after the
    /// copies the gate released).
    pub(crate) fn open_gate_only(&self) {
        self.gate().store(self.generation, Ordering::Release);
    }

    /// Writes the status word without touching the gate (tickets with nothing to wait for).
    pub(crate) fn set_status(&self, status: i32) {
        self.status().store(status, Ordering::SeqCst);
    }

    /// Whether the gate word is open.
    #[cfg(test)]
    fn is_open(&self) -> bool {
        self.gate().load(Ordering::Acquire) == self.generation
    }
}

impl Drop for GateSlot {
    fn drop(&mut self) {
        self.slab.free.lock().push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_run_out_and_come_back() {
        let slab = GateSlab::new(2, Ok).unwrap();
        let a = slab.take().unwrap();
        let b = slab.take().unwrap();
        assert_eq!(slab.take().err(), Some(ErrorCode::TryAgain));
        assert_ne!(a.gate_device(), b.gate_device());
        assert_eq!(slab.in_use(2), 2);
        assert!(!a.is_open());
        a.open(-800);
        assert!(a.is_open());
        assert_eq!(a.status().load(Ordering::SeqCst), -800);
        drop(a);
        let c = slab.take().unwrap();
        assert!(!c.is_open(), "a reused slot starts closed");
        assert_eq!(c.status().load(Ordering::SeqCst), TICKET_PENDING);
        drop((b, c));
        assert_eq!(slab.in_use(2), 0);
    }
}
