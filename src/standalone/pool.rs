//! [`ShmPool`]: the process-wide allocator of shared-memory blocks (upstream's `ShmHelper`):
//! the memory `MooncakeHostMemAllocator.alloc`, `alloc_from_mem_pool` and
//! `mc_shm_alloc` hand out, and the dummy's own local buffer and staging area. A dummy's link
//! maps any of these blocks at its real client the first time a transfer names it.

use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// One block: a sealed memfd mapped here, with a process-unique id.
///
/// Ownership: the pool holds it until [`ShmPool::free`]; links and local buffers may hold
/// clones longer (the pages stay mapped until the last clone goes). Thread-safety: immutable.
pub struct SharedBlock {
    id: u64,
    region: MappedRegion,
    holder: Holder,
}

/// Who may free a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    /// The caller that allocated it ([`ShmPool::free`]).
    Caller,
    /// A [`BlockGuard`] (a dummy's local buffer or staging area), on its drop only.
    Guard,
}

impl SharedBlock {
    /// Process-unique id (never reused).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Address of the first byte here.
    pub fn addr(&self) -> usize {
        self.region.addr()
    }
    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.region.len()
    }
    /// Never true: blocks have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.region.len() == 0
    }
    /// The memfd, to send to the real client.
    pub(super) fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.region.shared_file().map(|f| f.fd())
    }
}

/// The process-wide table of blocks, by address. Thread-safe.
#[derive(Default)]
pub struct ShmPool {
    blocks: RwLock<BTreeMap<usize, Arc<SharedBlock>>>,
    /// Ids of freed blocks, in order: links read it from their own cursor to unmap them at
    /// the real client.
    freed: Mutex<Vec<u64>>,
    next_id: AtomicU64,
}

impl ShmPool {
    /// The pool of this process.
    pub fn global() -> &'static ShmPool {
        static POOL: OnceLock<ShmPool> = OnceLock::new();
        POOL.get_or_init(ShmPool::default)
    }

    /// A new zero-filled block of at least `len` bytes (rounded up to pages), in the table
    /// until [`free`](Self::free) (or the drop of a [`BlockGuard`] around it). Errors: `INVALID_PARAMS` for `len == 0` or too large; `INTERNAL_ERROR`
    /// when the kernel refuses the memfd or the mapping.
    pub fn alloc(&self, len: u64, what: &str) -> Result<Arc<SharedBlock>> {
        self.alloc_for(len, what, Holder::Caller)
    }

    fn alloc_for(&self, len: u64, what: &str, holder: Holder) -> Result<Arc<SharedBlock>> {
        let region = MappedRegion::shared(len, what)?;
        let block = Arc::new(SharedBlock {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            region,
            holder,
        });
        self.blocks.write().insert(block.addr(), Arc::clone(&block));
        Ok(block)
    }

    /// Forgets the caller's block starting at `addr` (unmapped here once no transfer holds it;
    /// the real client unmaps its mapping on the next call or ping of each link connection).
    /// Errors: `INVALID_PARAMS` when no block starts at `addr`, or when it is a dummy's own
    /// block (its local buffer or staging area), which only the dummy frees.
    pub fn free(&self, addr: usize) -> Result<()> {
        let mut blocks = self.blocks.write();
        match blocks.get(&addr).map(|b| b.holder) {
            Some(Holder::Caller) => {
                let removed = self.forget(&mut blocks, addr);
                drop(blocks);
                drop(removed); // Unmapped (if last) outside the table's lock.
                Ok(())
            }
            Some(Holder::Guard) => fail(
                ErrorCode::InvalidParams,
                format!(
                    "{addr:#x} is a dummy's own shared memory (its local buffer or staging \
                     area), not memory from mc_shm_alloc"
                ),
            ),
            None => fail(
                ErrorCode::InvalidParams,
                format!("{addr:#x} is not the start of a shared-memory block"),
            ),
        }
    }

    /// Removes the block at `addr` from `blocks` (the table, locked) and logs its id as freed;
    /// returns it, for the caller to drop after releasing the lock (dropping the last `Arc`
    /// unmaps the block, which may take long).
    fn forget(
        &self,
        blocks: &mut BTreeMap<usize, Arc<SharedBlock>>,
        addr: usize,
    ) -> Option<Arc<SharedBlock>> {
        let block = blocks.remove(&addr)?;
        self.freed.lock().push(block.id);
        Some(block)
    }

    /// The block holding all of `[addr, addr + len)` and the offset of `addr` in it.
    pub fn find(&self, addr: usize, len: u64) -> Option<(Arc<SharedBlock>, u64)> {
        let blocks = self.blocks.read();
        let (_, block) = blocks.range(..=addr).next_back()?;
        let offset = (addr - block.addr()) as u64;
        let end = offset.checked_add(len)?;
        (end <= block.len() as u64).then(|| (Arc::clone(block), offset))
    }

    /// Re-homes the live block with id `id` ([`MappedRegion::rehome`]): same addresses and
    /// contents, a fresh memfd and a new id; the old id is logged as freed, so every link
    /// unmaps it at its real client, and a real client that still holds the old file (a
    /// stalled, abandoned transfer) reads and writes only pages nobody here maps any more.
    /// A block freed meanwhile needs nothing (`Ok`). Blocks the table while it copies.
    ///
    /// Errors: as [`MappedRegion::rehome`] (the block is then unchanged).
    pub(super) fn rehome(&self, id: u64) -> Result<()> {
        let mut blocks = self.blocks.write();
        let Some(old) = blocks.values().find(|b| b.id == id).cloned() else {
            return Ok(());
        };
        let region = old.region.rehome("mc shared block (re-homed)")?;
        let block = Arc::new(SharedBlock {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            region,
            holder: old.holder,
        });
        blocks.insert(block.addr(), block);
        drop(blocks);
        self.freed.lock().push(old.id);
        Ok(())
    }

    /// Ids freed since position `cursor` of the log, and the new cursor.
    pub(super) fn freed_since(&self, cursor: usize) -> (Vec<u64>, usize) {
        let freed = self.freed.lock();
        (
            freed.get(cursor..).unwrap_or_default().to_vec(),
            freed.len(),
        )
    }

    /// Number of live blocks (callers' and links').
    pub fn blocks(&self) -> usize {
        self.blocks.read().len()
    }
}

/// A block that is freed from the pool when this guard drops (a dummy's local buffer and
/// staging area). Ownership: it holds only the block's address; the pool holds the block, so
/// after a re-home the successor is what the guard stands for and frees, and the replaced
/// block's file is released at once (not kept until the guard drops).
pub struct BlockGuard {
    addr: usize,
    len: usize,
}

impl BlockGuard {
    /// Allocates a block from the global pool; errors as [`ShmPool::alloc`].
    pub fn new(len: u64, what: &str) -> Result<BlockGuard> {
        let block = ShmPool::global().alloc_for(len, what, Holder::Guard)?;
        Ok(BlockGuard {
            addr: block.addr(),
            len: block.len(),
        })
    }
    /// Address of the first byte (the same for every successor).
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: blocks have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The block at the guard's address now (the successor after a re-home).
    /// Errors: `INTERNAL_ERROR` if the pool has no block there (never, while the guard lives).
    pub fn block(&self) -> Result<Arc<SharedBlock>> {
        match ShmPool::global().find(self.addr, 1) {
            Some((block, 0)) => Ok(block),
            _ => fail(
                ErrorCode::InternalError,
                format!("no shared block at {:#x} for its guard", self.addr),
            ),
        }
    }
}

impl Drop for BlockGuard {
    fn drop(&mut self) {
        // Only this guard frees its block ([`ShmPool::free`] refuses it).
        let pool = ShmPool::global();
        let removed = pool.forget(&mut pool.blocks.write(), self.addr);
        drop(removed); // Outside the table's lock (the statement above released it).
    }
}
