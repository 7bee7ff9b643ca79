//! Storage tiers: where a stored value's bytes live, below the caller's process handle.
//!
//! [`Tier`] is the seam for addressable memory: a tier hands out space for values
//! ([`TierAlloc`], freed when its last holder lets go) and says where that space is
//! ([`Location`]); [`DramTier`] is an engine-registered, remotely accessible mapping with an
//! offset allocator (the P2P owner's tiers). The SSD tier is not a [`Tier`]: its values are
//! whole records, written and read by key and generation ([`DiskStore`], `disk/`; the
//! centralized client's owner side is `node/disk_tier.rs`, `docs/ssd-tier.md`).
//!
//! Public only for [`record_in`], which tools and tests use to look at a tier's files.
//!
//! May use: `transfer` (registration), `device` (mappings), `alloc` and the ground floor;
//! never `client`, `p2p`, `node` or `ffi`.

mod disk;
mod dram;

pub use disk::record_in;
pub(crate) use disk::{AlignedBuf, DiskStats, DiskStore, DiskStoreOptions, ReadRecord};
pub(crate) use dram::DramTier;

use crate::alloc::Allocation;
use std::sync::Arc;

/// Where the bytes of one allocation are. Plain value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// Addressable memory of this process, registered with the transfer engine.
    Memory {
        /// Address of the first byte.
        addr: usize,
    },
}

/// One storage tier. Implementations are `Send + Sync` and shared by `Arc`; their allocator
/// locks are leaves (nothing else is locked while one is held).
pub(crate) trait Tier: Send + Sync {
    /// Space for `len` (> 0) bytes, or `None` when the tier has no room.
    fn allocate(&self, len: u64) -> Option<Allocation>;

    /// Where `allocation` (one of this tier's) is.
    fn location(&self, allocation: &Allocation) -> Location;

    /// Allocated bytes (rounded up to the allocator's alignment).
    fn used_bytes(&self) -> u64;
}

/// Space for one value in one tier. Dropping the last `Arc` ([`AllocationHandle`]) returns
/// the range to its tier (RAII, via [`Allocation`]); it also keeps the tier alive (mapped).
pub(crate) struct TierAlloc {
    tier: Arc<dyn Tier>,
    allocation: Allocation,
    len: u64,
}

/// A shared reference to a [`TierAlloc`].
pub(crate) type AllocationHandle = Arc<TierAlloc>;

impl TierAlloc {
    /// Allocates `len` (> 0) bytes in `tier`; `None` when it has no room.
    pub(crate) fn new_in(tier: &Arc<dyn Tier>, len: u64) -> Option<AllocationHandle> {
        let allocation = tier.allocate(len)?;
        Some(Arc::new(TierAlloc {
            tier: Arc::clone(tier),
            allocation,
            len,
        }))
    }

    /// Where the value's bytes are.
    pub(crate) fn location(&self) -> Location {
        self.tier.location(&self.allocation)
    }

    /// Address of the first byte in this process (every tier today is memory).
    pub(crate) fn addr(&self) -> usize {
        let Location::Memory { addr } = self.location();
        addr
    }

    /// Value length in bytes (the allocation may be rounded up).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}
