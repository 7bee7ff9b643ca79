//! Pinned staging for on-stream transfers: one region allocated (and registered with the
//! device runtime, when there is one) at setup, carved into ranges per call by the master's
//! offset allocator. Data fetched from other clients lands here first, and the stream copies
//! it to the caller's buffer when the stream reaches that point.
//!
//! With an RDMA transfer engine the whole region is registered with the NIC (local access
//! only) from the first on-stream call until it is unmapped, so fetches READ straight into
//! staging and on-stream puts WRITE straight out of it: no bounce buffer, no extra copy (the
//! registration counts against `RLIMIT_MEMLOCK` like every other MR; a client that makes no
//! on-stream call registers nothing). A fetch never READs straight into the caller's
//! destination, registered or not: the stream may still be using that memory until it
//! reaches the call, and the bytes must not land before then.
//!
//! Quarantine: a range is shared (`Arc<StagingBuf>`) by the ticket and the transfer that
//! fills it. It returns to the pool only when both let go — after the stream passed the
//! ticket's release point *and* the transfer is terminal — so a late transfer never writes
//! into a range handed to someone else.

use crate::alloc::{Allocation, OffsetAllocator};
use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::TransferEngine;
use std::sync::{Arc, OnceLock, Weak};

/// The staging region's registration with a transfer engine; unregistered when dropped. It
/// holds the engine weakly: an engine dropped first has deregistered the range itself, while
/// the region was still mapped.
struct EngineRegistration {
    engine: Weak<TransferEngine>,
    addr: usize,
}

impl Drop for EngineRegistration {
    fn drop(&mut self) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        // A transfer still running on the range keeps its NIC registration until it ends.
        if let Err(e) = engine.unregister(self.addr) {
            tracing::debug!(error = %e, "unregistering the stream staging region failed");
        }
    }
}

/// The staging region and its allocator. Thread-safe.
pub(crate) struct StagingPool {
    /// The engine to register the region with: set when it moves bytes by RDMA.
    engine: Option<Weak<TransferEngine>>,
    /// Made on the first range handed out (so a client that never makes an on-stream call
    /// locks no memory for it). Declared before `region`: unregistered before the region is
    /// unmapped.
    registration: OnceLock<Option<EngineRegistration>>,
    region: Option<MappedRegion>,
    allocator: Arc<OffsetAllocator>,
}

impl StagingPool {
    /// A pool of `bytes` bytes (0: no staging; every staged call fails with `TRY_AGAIN`).
    /// When `engine` moves bytes by RDMA, the region is registered with it (local access
    /// only) when the first range is handed out, until the pool is dropped. A device that
    /// refuses the registration leaves the range without an MR (the engine logs why, at debug
    /// level) and the transfers go through bounce buffers instead.
    pub(crate) fn new(bytes: u64, engine: &Arc<TransferEngine>) -> Result<Arc<StagingPool>> {
        let region = match bytes {
            0 => None,
            n => Some(MappedRegion::pinned(n, "stream staging")?),
        };
        Ok(Arc::new(StagingPool {
            engine: engine.uses_rdma().then(|| Arc::downgrade(engine)),
            registration: OnceLock::new(),
            region,
            allocator: OffsetAllocator::new(bytes),
        }))
    }

    /// Registers `region` with the engine, once.
    fn register(&self, region: &MappedRegion) {
        self.registration.get_or_init(|| {
            let engine = self.engine.as_ref()?.upgrade()?;
            match engine.register(region.addr(), region.len(), false) {
                Ok(()) => Some(EngineRegistration {
                    engine: Arc::downgrade(&engine),
                    addr: region.addr(),
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "stream staging is not registered for RDMA");
                    None
                }
            }
        });
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
        self.register(region);
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
