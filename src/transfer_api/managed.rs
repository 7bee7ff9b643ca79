//! Managed buffers of a [`super::TransferEndpoint`] (upstream's `allocate_managed_buffer` /
//! `free_managed_buffer`): registered host memory the endpoint owns and hands out in pieces.
//!
//! Pieces come from pools of [`POOL_BYTES`] (pinned with the device runtime when there is
//! one, registered once with the engine, sub-allocated by [`OffsetAllocator`]); a request
//! larger than a pool gets a pool of its own, unregistered and unmapped when it is freed.
//! Pools that hold small pieces stay until the endpoint drops them (as upstream's slabs).
//!
//! Thread-safety: one mutex around the table; registrations are made under it.

use crate::alloc::{Allocation, OffsetAllocator};
use crate::device::MappedRegion;
use crate::error::{fail, ErrorCode, Result};
use crate::transfer::TransferEngine;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of a shared pool.
pub(crate) const POOL_BYTES: u64 = 64 << 20;

/// A registered mapping and the allocator of its bytes.
struct Pool {
    region: MappedRegion,
    allocator: Arc<OffsetAllocator>,
    /// A pool made for one large piece: dropped with it.
    dedicated: bool,
}

/// One piece handed out: its pool and its allocation (freed on drop).
struct Piece {
    pool: usize,
    len: u64,
    _allocation: Option<Allocation>,
}

/// The endpoint's pools and the pieces handed out, by address.
#[derive(Default)]
pub(crate) struct ManagedBuffers {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    pools: HashMap<usize, Pool>,
    pieces: HashMap<usize, Piece>,
}

impl ManagedBuffers {
    /// A zero-filled (on first use) piece of `len` bytes, registered with `engine` for
    /// remote access; its address, and whether a pool was registered for it.
    ///
    /// Errors: `INVALID_PARAMS` for `len` 0; `INTERNAL_ERROR` when no memory can be mapped;
    /// the engine's registration errors.
    pub(crate) fn allocate(&self, engine: &TransferEngine, len: u64) -> Result<(usize, bool)> {
        if len == 0 {
            return fail(ErrorCode::InvalidParams, "a managed buffer of 0 bytes");
        }
        let mut table = self.table.lock();
        if len <= POOL_BYTES {
            for (&base, pool) in table.pools.iter().filter(|(_, p)| !p.dedicated) {
                if let Some(allocation) = pool.allocator.allocate(len) {
                    let addr = base + allocation.offset() as usize;
                    let piece = Piece {
                        pool: base,
                        len,
                        _allocation: Some(allocation),
                    };
                    table.pieces.insert(addr, piece);
                    return Ok((addr, false));
                }
            }
        }
        let dedicated = len > POOL_BYTES;
        let size = if dedicated { len } else { POOL_BYTES };
        let region = MappedRegion::pinned(size, "transfer engine managed buffer")?;
        let base = region.addr();
        engine.register(base, region.len(), true)?;
        let allocator = OffsetAllocator::new(size);
        let allocation = match dedicated {
            true => None,
            false => allocator.allocate(len),
        };
        table.pools.insert(
            base,
            Pool {
                region,
                allocator,
                dedicated,
            },
        );
        let piece = Piece {
            pool: base,
            len,
            _allocation: allocation,
        };
        table.pieces.insert(base, piece);
        Ok((base, true))
    }

    /// Gives back the piece at `addr` of `len` bytes (the length it was allocated with). A
    /// piece with a pool of its own hands the pool's mapping back: the caller unregisters it
    /// from the engine, then drops it (unmapping it).
    ///
    /// Errors: `INVALID_PARAMS` when no piece starts at `addr` or `len` is not its length
    /// (nothing is freed then).
    pub(crate) fn free(&self, addr: usize, len: u64) -> Result<Option<MappedRegion>> {
        let mut table = self.table.lock();
        match table.pieces.get(&addr) {
            None => {
                return fail(
                    ErrorCode::InvalidParams,
                    format_args!("{addr:#x} is not a managed buffer of this engine"),
                )
            }
            Some(piece) if piece.len != len => {
                return fail(
                    ErrorCode::InvalidParams,
                    format_args!(
                        "managed buffer {addr:#x} has {} bytes, not {len}",
                        piece.len
                    ),
                )
            }
            Some(_) => {}
        }
        let Some(piece) = table.pieces.remove(&addr) else {
            return Ok(None);
        };
        if table.pools.get(&piece.pool).is_some_and(|p| p.dedicated) {
            return Ok(table.pools.remove(&piece.pool).map(|pool| pool.region));
        }
        Ok(None)
    }

    /// Whether `addr` is the base of one of the pools (registered by this table).
    pub(crate) fn owns_pool(&self, addr: usize) -> bool {
        self.table.lock().pools.contains_key(&addr)
    }

    /// Unregisters every pool from `engine` and unmaps it (the endpoint is closing).
    pub(crate) fn release_all(&self, engine: &TransferEngine) {
        let mut table = self.table.lock();
        table.pieces.clear();
        for (base, _) in table.pools.drain() {
            let _ = engine.unregister(base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::test_support::embedded_engine as engine;

    #[test]
    fn small_pieces_share_a_pool_and_a_large_one_gets_its_own() {
        let engine = engine();
        let managed = ManagedBuffers::default();
        let (a, new_pool) = managed.allocate(&engine, 4096).unwrap();
        assert!(new_pool);
        let (b, new_pool) = managed.allocate(&engine, 100).unwrap();
        assert!(!new_pool);
        assert_ne!(a, b);
        let region = engine.region_containing(a).unwrap();
        assert!(region.remote_accessible);
        assert_eq!(engine.region_containing(b).unwrap().base, region.base);
        let (big, _) = managed.allocate(&engine, POOL_BYTES + 1).unwrap();
        assert!(managed.owns_pool(big) && !managed.owns_pool(b));
        assert_eq!(engine.region_containing(big).unwrap().base, big);
        assert!(managed.table.lock().pools[&big].region.len() as u64 > POOL_BYTES);
        assert_eq!(managed.table.lock().pieces.len(), 3);
        let region = managed.free(big, POOL_BYTES + 1).unwrap().unwrap();
        assert_eq!(
            region.addr(),
            big,
            "its own pool comes back to be unregistered"
        );
        engine.unregister(big).unwrap();
        assert!(managed.free(a, 4096).unwrap().is_none());
        assert_eq!(
            managed.allocate(&engine, 4096).unwrap(),
            (a, false),
            "reused"
        );
        managed.release_all(&engine);
        assert!(engine.region_containing(b).is_none());
    }

    #[test]
    fn bad_frees_and_sizes_are_refused_and_free_nothing() {
        let engine = engine();
        let managed = ManagedBuffers::default();
        assert_eq!(
            managed.allocate(&engine, 0).err(),
            Some(ErrorCode::InvalidParams)
        );
        let (a, _) = managed.allocate(&engine, 64).unwrap();
        assert_eq!(managed.free(a, 65).err(), Some(ErrorCode::InvalidParams));
        assert_eq!(
            managed.free(a + 8, 64).err(),
            Some(ErrorCode::InvalidParams)
        );
        assert_eq!(managed.table.lock().pieces.len(), 1);
        managed.free(a, 64).unwrap();
        assert_eq!(
            managed.free(a, 64).err(),
            Some(ErrorCode::InvalidParams),
            "twice"
        );
    }
}
