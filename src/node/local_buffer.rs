//! The registered local buffer: memory the copying `put` stages values in and `get_buffer`
//! returns objects in. Allocations are RAII [`LocalAlloc`] values.

use crate::alloc::{Allocation, OffsetAllocator};
use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::standalone::BlockGuard;
use crate::transfer::TransferEngine;
use std::sync::Arc;

/// The memory behind a local buffer: private pages, or (a dummy's) a shared block its real
/// client maps.
enum Backing {
    Private(MappedRegion),
    Shared(BlockGuard),
}

impl Backing {
    fn addr(&self) -> usize {
        match self {
            Backing::Private(region) => region.addr(),
            Backing::Shared(guard) => guard.addr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Backing::Private(region) => region.len(),
            Backing::Shared(guard) => guard.len(),
        }
    }
}

/// A pre-faulted, engine-registered region with an offset allocator. Thread-safe.
pub(crate) struct LocalBuffer {
    region: Backing,
    allocator: Arc<OffsetAllocator>,
}

impl LocalBuffer {
    /// Maps `size` bytes, pins them with the device runtime when there is one, and registers
    /// them with `engine` (not remotely accessible).
    pub(crate) fn new(size: u64, engine: &TransferEngine) -> Result<LocalBuffer> {
        LocalBuffer::with_access(size, engine, false)
    }

    /// Like [`LocalBuffer::new`]; `remote_accessible` lets peers' transfer engines read and
    /// write it (the P2P REVERSE staging buffer).
    pub(crate) fn with_access(
        size: u64,
        engine: &TransferEngine,
        remote_accessible: bool,
    ) -> Result<LocalBuffer> {
        let region = Backing::Private(MappedRegion::pinned(size, "local buffer")?);
        engine.register(region.addr(), region.len(), remote_accessible)?;
        Ok(LocalBuffer {
            allocator: OffsetAllocator::new(region.len() as u64),
            region,
        })
    }

    /// A dummy's local buffer: a shared block of the process pool (see
    /// [`crate::standalone::ShmPool`]), registered with `engine` (not remotely accessible).
    pub(crate) fn shared(size: u64, engine: &TransferEngine) -> Result<LocalBuffer> {
        let region = Backing::Shared(BlockGuard::new(size, "dummy local buffer")?);
        engine.register(region.addr(), region.len(), false)?;
        Ok(LocalBuffer {
            allocator: OffsetAllocator::new(region.len() as u64),
            region,
        })
    }

    /// Size in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.region.len() as u64
    }

    /// Reserves `len` bytes; `INVALID_PARAMS` when the buffer has no room (Mooncake's code).
    pub(crate) fn allocate(self: &Arc<Self>, len: u64) -> Result<LocalAlloc> {
        match self.allocator.allocate(len) {
            Some(allocation) => Ok(LocalAlloc {
                buffer: Arc::clone(self),
                allocation,
                len,
            }),
            None => fail(
                ErrorCode::InvalidParams,
                format!("local buffer has no room for {len} bytes"),
            ),
        }
    }
}

/// `len` bytes of the local buffer, returned to it when dropped (the allocation is RAII).
/// Keeps the buffer mapped.
pub struct LocalAlloc {
    buffer: Arc<LocalBuffer>,
    allocation: Allocation,
    len: u64,
}

impl LocalAlloc {
    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.buffer.region.addr() + self.allocation.offset() as usize
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length allocation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
