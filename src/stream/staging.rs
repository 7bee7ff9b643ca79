//! Pinned staging for on-stream transfers: one region allocated (and registered with the
//! device runtime, when there is one) at setup, carved into ranges per call by the master's
//! offset allocator. Data fetched from other clients lands here first, and the stream copies
//! it to the caller's buffer when the stream reaches that point.
//!
//! Quarantine: a range is shared (`Arc<StagingBuf>`) by the ticket and the transfer that
//! fills it. It returns to the pool only when both let go — after the stream passed the
//! ticket's release point *and* the transfer is terminal — so a late transfer never writes
//! into a range handed to someone else.

use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::master::{Allocation, OffsetAllocator};
use std::sync::Arc;

/// The staging region and its allocator. Thread-safe.
pub(crate) struct StagingPool {
    region: Option<MappedRegion>,
    allocator: Arc<OffsetAllocator>,
}

impl StagingPool {
    /// A pool of `bytes` bytes (0: no staging; every staged call fails with `TRY_AGAIN`).
    pub(crate) fn new(bytes: u64) -> Result<Arc<StagingPool>> {
        let region = match bytes {
            0 => None,
            n => Some(MappedRegion::pinned(n, "stream staging")?),
        };
        Ok(Arc::new(StagingPool {
            region,
            allocator: OffsetAllocator::new(bytes),
        }))
    }

    /// Whether the region is registered with the device runtime.
    pub(crate) fn is_pinned(&self) -> bool {
        self.region.as_ref().is_some_and(|r| r.is_pinned())
    }

    /// A `len`-byte range (len > 0). `TRY_AGAIN` when the pool has no room now.
    pub(crate) fn take(self: &Arc<Self>, len: u64) -> Result<Arc<StagingBuf>> {
        let (Some(region), Some(allocation)) = (&self.region, self.allocator.allocate(len)) else {
            return fail(
                ErrorCode::TryAgain,
                format!(
                    "no room for {len} bytes in the stream staging pool ({} of {} bytes in use; \
                     wait for earlier tickets or raise MC_STREAM_STAGING_BYTES)",
                    self.allocator.used(),
                    self.allocator.capacity()
                ),
            );
        };
        Ok(Arc::new(StagingBuf {
            addr: region.addr() + allocation.offset() as usize,
            _allocation: allocation,
            _pool: self.clone(),
        }))
    }

    /// Bytes handed out now.
    pub(crate) fn used(&self) -> u64 {
        self.allocator.used()
    }
}

/// One staging range; back in the pool when the last holder drops it. The pool (and so the
/// mapping) lives at least as long.
pub(crate) struct StagingBuf {
    addr: usize,
    _allocation: Allocation,
    _pool: Arc<StagingPool>,
}

impl StagingBuf {
    /// First byte of the range.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }
}
