//! The DRAM tier: a pinned mapping registered with the transfer engine as remotely
//! accessible (peers write into reserved ranges and read pinned ones), with an offset
//! allocator over it. Thread-safety: the allocator's lock is a leaf; the mapping never moves.

use super::{Location, Tier};
use crate::alloc::{Allocation, OffsetAllocator};
use crate::device::MappedRegion;
use crate::error::Result;
use crate::transfer::TransferEngine;
use std::sync::Arc;

/// One DRAM tier; see the module documentation. Unmapped when the last holder drops it.
pub(crate) struct DramTier {
    region: MappedRegion,
    allocator: Arc<OffsetAllocator>,
}

impl DramTier {
    /// Maps `capacity` bytes (pinned with the device runtime when one is present) and
    /// registers them with `engine`, remotely accessible.
    ///
    /// Errors: `INTERNAL_ERROR` when the mapping fails; `INVALID_PARAMS` when registration
    /// fails.
    pub(crate) fn new(capacity: u64, engine: &TransferEngine) -> Result<DramTier> {
        let region = MappedRegion::pinned(capacity, "p2p tier")?;
        engine.register(region.addr(), region.len(), true)?;
        Ok(DramTier {
            allocator: OffsetAllocator::new(region.len() as u64),
            region,
        })
    }
}

impl Tier for DramTier {
    fn allocate(&self, len: u64) -> Option<Allocation> {
        self.allocator.allocate(len)
    }

    fn location(&self, allocation: &Allocation) -> Location {
        Location::Memory {
            addr: self.region.addr() + allocation.offset() as usize,
        }
    }

    fn used_bytes(&self) -> u64 {
        self.allocator.used()
    }
}
